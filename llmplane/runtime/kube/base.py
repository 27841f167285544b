"""Constants, cluster-wide options and object helpers every manifest module shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmplane.api.base import Resource
from llmplane.api.documents import dump_resource
from llmplane.controlplane.planning import CONTAINER_NAME

MODELS_ROOT = "/workspace/models"
MODEL_MOUNT_PATH = MODELS_ROOT + "/"
MODEL_VOLUME = "model-volume"
LOADER_NAME = "model-loader"
DEFAULT_IMAGE = "ghcr.io/llmplane/llmplane:0.1.0"

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LB_SUFFIX = "-lb"


@dataclass(frozen=True)
class KubeOptions:
    """Cluster-wide choices (Helm values of the operator)."""

    image: str = DEFAULT_IMAGE  # the llmplane image, used by the model-loader init containers
    use_leader_worker_set: bool = True  # False: apps/v1 Deployments (single-host only)
    image_pull_policy: str | None = None  # for the loader containers


def runner_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec["containers"]
    return next((c for c in containers if c.get("name") == CONTAINER_NAME), containers[0])


def owner_reference(owner: Resource | dict[str, Any]) -> dict[str, Any] | None:
    """A controller owner reference (None while the owner has no uid, as in ``render``)."""
    data = dump_resource(owner) if isinstance(owner, Resource) else owner
    meta = data["metadata"]
    if not meta.get("uid"):
        return None
    return {
        "apiVersion": data["apiVersion"],
        "kind": data["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_metadata(
    name: str,
    namespace: str | None,
    owner: Resource | dict[str, Any],
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace or "default"}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    ref = owner_reference(owner)
    if ref:
        meta["ownerReferences"] = [ref]
    return meta
