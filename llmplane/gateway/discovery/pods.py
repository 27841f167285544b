"""Endpoints from Kubernetes Pods, for the in-cluster gateway (``llmplane gateway --kubernetes``;
which pods, and their address, labels, model name and engine: docs/kubernetes.md, "Endpoints").

Every Pod of the gateway's namespaces is watched, not a server-side selection, since the
selectors change with the routing objects. ``workload`` is ``<namespace>/<inference Service>``
(the LeaderWorkerSet's name label, else the service-name label): autoscaling signals are per
Playground.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from llmplane.api.gie import GIE_GROUP, GIE_VERSION
from llmplane.api.llmaz import OpenModel
from llmplane.controlplane.plan import BACKEND_LABEL, MODEL_NAME_LABEL, SERVICE_LABEL
from llmplane.controlplane.planning import served_model_name
from llmplane.gateway.discovery.sources import CombinedDiscovery, Subscribers
from llmplane.gateway.discovery.store_endpoints import StoreEndpoints
from llmplane.gateway.scraper import engine_of
from llmplane.gateway.store_follower import StoreFollower
from llmplane.kube.informer import Informer
from llmplane.kube.kinds import POD
from llmplane.kube.pods import pod_address, pod_ready
from llmplane.runtime.endpoint import (
    Endpoint,
    pod_kv_events,
    pod_max_num_seqs,
    pod_priority_scheduling,
)
from llmplane.store.base import Store
from llmplane.store.kube import KubeStore

log = logging.getLogger("llmplane.gateway")

POD_PORT = 8080  # the model-runner container's "http" port
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
SELECTOR_KINDS = ("ModelServer", "InferencePool", "OpenModel")


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What discovery needs of a Pod (the cache holds every pod in the namespaces): the
    containers' command lines give the engine's concurrency, scheduling policy and KV events."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    containers = (pod.get("spec") or {}).get("containers")
    return {
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "labels", "resourceVersion", "deletionTimestamp")
            if k in meta
        },
        "spec": {
            "containers": [
                {k: c[k] for k in ("command", "args") if k in c}
                for c in (containers if isinstance(containers, list) else ())
                if isinstance(c, dict)
            ]
        },
        "status": {k: status[k] for k in ("phase", "podIP", "conditions") if k in status},
    }


def _selectors(objects: Mapping[Any, dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """Label maps that ModelServers and InferencePools select, by namespace."""
    out: dict[str, list[dict[str, str]]] = {}
    for obj in objects.values():
        spec = obj.get("spec") or {}
        if obj.get("kind") == "ModelServer":
            selector = (spec.get("workloadSelector") or {}).get("matchLabels") or {}
        elif obj.get("kind") == "InferencePool":
            selector = spec.get("selector") or {}
            if obj.get("apiVersion") != f"{GIE_GROUP}/{GIE_VERSION}":  # v1: under matchLabels
                selector = selector.get("matchLabels") or {}
        else:
            continue
        if isinstance(selector, Mapping):
            namespace = obj["metadata"].get("namespace") or "default"
            out.setdefault(namespace, []).append({str(k): str(v) for k, v in selector.items()})
    return out


def _served_names(objects: Mapping[Any, dict[str, Any]]) -> dict[str, str]:
    """OpenModel name -> the name its engine serves."""
    names = {}
    for obj in objects.values():
        if obj.get("kind") != "OpenModel":
            continue
        try:
            names[obj["metadata"]["name"]] = served_model_name(OpenModel.model_validate(obj))
        except Exception as err:
            log.debug("OpenModel %s: %s", obj["metadata"].get("name"), err)
    return names


class PodDiscovery(Subscribers):
    """``Discovery`` over Pods; ``store`` provides the ModelServers, InferencePools and
    OpenModels that say which pods are wanted and what their engines serve."""

    def __init__(
        self,
        api: Any,
        namespaces: Sequence[str] | None = None,
        store: Store | None = None,
        *,
        port: int = POD_PORT,
        watch_timeout: int = 300,
    ) -> None:
        super().__init__()
        self.port = port
        self.namespaces = tuple(namespaces or ()) or None
        self.informers = [
            Informer(
                api,
                POD,
                namespace,
                self._pod_event,
                transform=slim_pod,
                watch_timeout=watch_timeout,
            )
            for namespace in (self.namespaces or (None,))
        ]
        self._selectors: dict[str, list[dict[str, str]]] = {}
        self._served: dict[str, str] = {}
        self._endpoints: list[Endpoint] = []
        self._started = False
        self._pending: asyncio.Handle | None = None
        self._follower = (
            StoreFollower(store, SELECTOR_KINDS, self._objects_changed, debounce=0.0)
            if store is not None
            else None
        )

    # --- Discovery -----------------------------------------------------------------------------

    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    async def start(self) -> None:
        for informer in self.informers:
            await informer.start()
        if self._follower is not None:
            await self._follower.start()
        self._started = True
        self._recompute()

    async def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._follower is not None:
            await self._follower.close()
        for informer in self.informers:
            await informer.close()

    # --- building ------------------------------------------------------------------------------

    def _objects_changed(self, objects: dict[Any, dict[str, Any]]) -> None:
        self._selectors = _selectors(objects)
        self._served = _served_names(objects)
        self._recompute()

    def _pod_event(self, type_: str, pod: dict[str, Any]) -> None:
        # One rebuild per burst: a watch chunk (or a relist) delivers many events in one go.
        if self._pending is None:
            self._pending = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._pending = None
        self._recompute()

    def _wanted(self, labels: Mapping[str, str], namespace: str) -> bool:
        if MODEL_NAME_LABEL in labels:
            return True
        return any(
            all(labels.get(k) == v for k, v in selector.items())
            for selector in self._selectors.get(namespace, ())
        )

    def endpoint_of(self, pod: Mapping[str, Any]) -> Endpoint | None:
        """The endpoint a pod is, or None if it is not serving or nothing may select it."""
        if not pod_ready(pod):
            return None
        meta = pod["metadata"]
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        namespace = meta.get("namespace") or "default"
        if not self._wanted(labels, namespace):
            return None
        model = labels.get(MODEL_NAME_LABEL, "")
        backend = labels.get(BACKEND_LABEL, "")
        service = labels.get(LWS_NAME_LABEL) or labels.get(SERVICE_LABEL)
        ip = pod["status"]["podIP"]
        events, replay = pod_kv_events(pod, f"[{ip}]" if ":" in ip else ip)
        return Endpoint(
            address=pod_address(ip, self.port),
            labels=labels,
            model_name=self._served.get(model, model) if model else "",
            backend=backend,
            namespace=namespace,
            engine=engine_of(backend),
            fixed_port=False,
            workload=f"{namespace}/{service}" if service else "",
            max_num_seqs=pod_max_num_seqs(pod),
            priority_scheduling=pod_priority_scheduling(pod),
            kv_events=events,
            kv_events_replay=replay,
        )

    def _recompute(self) -> None:
        if not self._started:
            return
        endpoints: dict[str, Endpoint] = {}
        for informer in self.informers:
            for key in sorted(informer.objects):
                endpoint = self.endpoint_of(informer.objects[key])
                if endpoint is not None:
                    # Two pods with one IP (a stale one and its replacement): the first wins.
                    endpoints.setdefault(endpoint.address, endpoint)
        new = list(endpoints.values())
        if new != self._endpoints:
            self._endpoints = new
            self._changed()


def parse_namespaces(values: Sequence[str] | None) -> list[str] | None:
    """``--namespace`` values (repeatable, comma-separated) -> namespaces; ``all`` or none
    given -> ``None`` (every namespace)."""
    names = [n.strip() for v in values or () for n in v.split(",") if n.strip()]
    if not names or "all" in names:
        return None
    return list(dict.fromkeys(names))


async def kubernetes_sources(
    namespaces: Sequence[str] | None = None,
    server: str | None = None,
    token: str | None = None,
    key_secrets: bool = False,
) -> tuple[Any, Any]:
    """What ``llmplane gateway --kubernetes`` routes with: a started ``KubeStore`` (routing
    objects; with ``key_secrets`` also the Secrets Tenant keys name) and a Discovery of Pods
    plus the store's llmplane.io ``Endpoint`` objects. Close the store with
    ``await store.aclose()`` after the gateway."""
    store = await KubeStore.connect(namespaces, server, token, key_secrets=key_secrets)
    try:
        pods = PodDiscovery(store.api, namespaces, store)
        discovery = CombinedDiscovery(pods, StoreEndpoints(store))
    except BaseException:
        await store.aclose()
        raise
    return store, discovery
