"""Service -> LeaderWorkerSet (or Deployment) + the ``<name>-lb`` ClusterIP Service in front of it."""

from __future__ import annotations

import copy
from typing import Any

from llmplane.api.documents import dump_resource
from llmplane.api.inference import BackendRuntime, Service
from llmplane.api.llmaz import OpenModel, split_uri
from llmplane.controlplane import planning
from llmplane.controlplane.plan import (
    MODEL_FAMILY_LABEL,
    MODEL_NAME_LABEL,
    SERVICE_LABEL,
    WorkloadPlan,
)
from llmplane.controlplane.planning import CONTAINER_PORT, PlanningError
from llmplane.runtime.kube.base import (
    LB_SUFFIX,
    LWS_API_VERSION,
    LWS_NAME_LABEL,
    LWS_WORKER_INDEX_LABEL,
    MODEL_MOUNT_PATH,
    MODEL_VOLUME,
    KubeOptions,
    object_metadata,
    runner_container,
)
from llmplane.runtime.kube.models import (
    credential_env,
    loader_container,
    pod_model_path,
    skips_loader,
    source_kind,
)

_PROBE_DEFAULTS = {
    "initialDelaySeconds": 0,
    "timeoutSeconds": 1,
    "periodSeconds": 10,
    "successThreshold": 1,
    "failureThreshold": 3,
}


def _strip_probe_defaults(container: dict[str, Any]) -> None:
    for key in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = container.get(key)
        if isinstance(probe, dict):
            for field, default in _PROBE_DEFAULTS.items():
                if probe.get(field) == default:
                    del probe[field]


def _node_affinity(selectors: list[dict[str, str]]) -> dict[str, Any] | None:
    """Flavors' nodeSelectors: required = any flavor (OR of terms); preferred = listed order.

    A flavor without a nodeSelector fits any node, so then nothing is required.
    """
    terms = [
        {
            "matchExpressions": [
                {"key": k, "operator": "In", "values": [str(v)]} for k, v in sorted(sel.items())
            ]
        }
        for sel in selectors
    ]
    if not any(selectors):
        return None
    affinity: dict[str, Any] = {}
    if all(selectors):
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    if len(selectors) > 1:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": max(1, 100 - 10 * i), "preference": copy.deepcopy(term)}
            for i, (term, sel) in enumerate(zip(terms, selectors, strict=True))
            if sel
        ]
    return {"nodeAffinity": affinity}


def _inject(
    template: dict[str, Any],
    plan: WorkloadPlan,
    models: list[OpenModel],
    options: KubeOptions,
    serving: bool,
) -> dict[str, Any]:
    """Model loaders, volumes, credentials and flavor scheduling for one pod template."""
    template = copy.deepcopy(template)
    spec = template.setdefault("spec", {})
    runner = runner_container(spec)
    runner_env = list(runner.get("env") or [])
    init = list(spec.get("initContainers") or [])
    volumes = list(spec.get("volumes") or [])
    mounts = list(runner.get("volumeMounts") or [])
    loads = False
    for index, model in enumerate(models):
        kind = source_kind(model)
        if kind == "host":
            path = split_uri(model.spec.source.uri or "")[1]
            name = "model-host" if index == 0 else f"model-host-{index}"
            volumes.append({"name": name, "hostPath": {"path": path}})
            mounts.append({"name": name, "mountPath": path, "readOnly": True})
        elif kind == "ollama":
            continue
        elif skips_loader(model):
            have = {e.get("name") for e in runner_env}
            runner_env += [e for e in credential_env(kind) if e["name"] not in have]
        else:
            loads = True
            init.append(loader_container(index, model, runner.get("env") or [], options))
    if loads:
        volumes.append({"name": MODEL_VOLUME, "emptyDir": {}})
        mounts.append({"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT_PATH, "readOnly": True})
    if runner_env:
        runner["env"] = runner_env
    if init:
        spec["initContainers"] = init
    if volumes:
        spec["volumes"] = volumes
    if mounts:
        runner["volumeMounts"] = mounts
    affinity = _node_affinity(plan.node_selectors)
    if affinity is not None:
        spec.setdefault("affinity", {}).update(affinity)
    for container in spec["containers"]:
        _strip_probe_defaults(container)
    if not serving:
        meta = template.get("metadata") or {}
        labels = meta.get("labels") or {}
        for key in (MODEL_NAME_LABEL, MODEL_FAMILY_LABEL):
            labels.pop(key, None)
    return template


def plan_for(
    service: Service, models: dict[str, OpenModel], backend: BackendRuntime | None
) -> WorkloadPlan:
    """The substrate-neutral plan of a Service with pod paths under ``/workspace/models``."""
    return planning.plan_service(service, models, backend, locate=pod_model_path)


def lb_service(service: Service, leader_selector: dict[str, str]) -> dict[str, Any]:
    """ClusterIP ``<name>-lb`` on 8080 in front of the serving (leader) pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(service.name + LB_SUFFIX, service.namespace, service),
        "spec": {
            "type": "ClusterIP",
            "selector": leader_selector,
            "ports": [
                {
                    "name": "http",
                    "protocol": "TCP",
                    "port": CONTAINER_PORT,
                    "targetPort": CONTAINER_PORT,
                }
            ],
        },
    }


def workload_objects(
    service: Service,
    models: dict[str, OpenModel],
    backend: BackendRuntime | None,
    options: KubeOptions | None = None,
    plan: WorkloadPlan | None = None,
) -> list[dict[str, Any]]:
    """[LeaderWorkerSet or Deployment, ``<name>-lb`` Service] for one inference Service
    (``plan``: its ``plan_for`` when the caller has it already)."""
    options = options or KubeOptions()
    plan = plan or plan_for(service, models, backend)
    claimed = [models[ref.name] for ref in service.spec.model_claims.models]
    data = dump_resource(service)
    template = data["spec"]["workloadTemplate"]
    size = int(template.get("size") or 1)
    multi = template.get("leaderTemplate") is not None
    worker = _inject(template["workerTemplate"], plan, claimed, options, serving=not multi)
    leader = (
        _inject(template["leaderTemplate"], plan, claimed, options, serving=True) if multi else None
    )
    if not options.use_leader_worker_set:
        if size > 1 or multi:
            raise PlanningError(
                f"Service/{service.name} is multi-host (size {size}): it needs LeaderWorkerSet "
                "(useLeaderWorkerSet: true)"
            )
        selector = {SERVICE_LABEL: service.name}
        worker.setdefault("metadata", {}).setdefault("labels", {}).update(selector)
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": object_metadata(service.name, service.namespace, service),
            "spec": {
                "replicas": service.spec.replicas,
                "selector": {"matchLabels": selector},
                "template": worker,
            },
        }
        return [deployment, lb_service(service, selector)]
    lwt: dict[str, Any] = {"size": size}
    if leader is not None:
        lwt["leaderTemplate"] = leader
    lwt["workerTemplate"] = worker
    for key in ("restartPolicy",):
        if template.get(key):
            lwt[key] = template[key]
    spec: dict[str, Any] = {
        "replicas": service.spec.replicas,
        "leaderWorkerTemplate": lwt,
        "startupPolicy": "LeaderReady",
    }
    rollout = data["spec"].get("rolloutStrategy")
    if rollout:
        spec["rolloutStrategy"] = rollout
    if template.get("subdomainPolicy"):
        spec["networkConfig"] = {"subdomainPolicy": template["subdomainPolicy"]}
    lws = {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": object_metadata(service.name, service.namespace, service),
        "spec": spec,
    }
    leader_selector = {LWS_NAME_LABEL: service.name, LWS_WORKER_INDEX_LABEL: "0"}
    return [lws, lb_service(service, leader_selector)]
