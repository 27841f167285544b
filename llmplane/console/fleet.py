"""One picture of the fleet, from the store, the local runtime (under ``llmplane up``) and the
gateway's endpoint states: what the console's Fleet page and ``up``'s status line show.

Every Playground is one workload (with the Service it owns); a Service no Playground owns is
one of its own. Replicas come from the runtime when there is one (phase, restarts, port, log),
else from the gateway's endpoints labelled with the Service's name (Kubernetes pods). Endpoints
no workload claims (external servers) are listed apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llmplane.controlplane.disaggregation import ROLES, role_service_name
from llmplane.controlplane.events import events_for
from llmplane.controlplane.plan import REPLICA_LABEL, SERVICE_LABEL
from llmplane.store.base import Store

if TYPE_CHECKING:
    from llmplane.gateway.server import GatewayView

MAX_EVENTS = 8


def _conditions(obj: dict[str, Any] | None) -> list[dict[str, Any]]:
    return list(((obj or {}).get("status") or {}).get("conditions") or [])


def _owned_by_playground(svc: dict[str, Any]) -> str | None:
    for ref in svc["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "Playground":
            return str(ref.get("name"))
    return None


def _events(store: Store, *objs: dict[str, Any] | None) -> list[dict[str, Any]]:
    found = []
    for obj in objs:
        if obj is None:
            continue
        for e in events_for(store, obj):
            found.append(
                {
                    "type": e.get("type", "Normal"),
                    "reason": e.get("reason", ""),
                    "message": e.get("message", ""),
                    "count": e.get("count", 1),
                    "lastTimestamp": e.get("lastTimestamp", ""),
                    "object": f"{obj['kind']}/{obj['metadata']['name']}",
                }
            )
    found.sort(key=lambda e: e["lastTimestamp"])
    return found[-MAX_EVENTS:]


def endpoint_view(
    state: Any,
    staleness: float,
    now: float,
    prefix_rate: Callable[[str], float | None],
    kv_index: Any = None,
) -> dict[str, Any]:
    """What the console shows of one endpoint state (no request data, no credentials);
    ``kv_index``: the gateway's index of the blocks replicas report in their KV events."""
    fresh = state.metrics_fresh(staleness, now)
    indexed = kv_index.replicas.get(state.address) if kv_index is not None else None
    return {
        "address": state.address,
        "engine": state.endpoint.engine,
        "model": state.endpoint.model_name,
        "inflight": state.inflight,
        "waiting": state.waiting if fresh else None,
        "running": state.running if fresh else None,
        "queue": round(state.queue_estimate(staleness, now), 2),
        "kv": round(state.kv_usage, 4) if fresh and state.has_kv else None,
        "prefixHitRate": prefix_rate(state.address),
        # Blocks the gateway indexed from its KV events (None: it publishes none) and the
        # block size, from the events, else the engine's metrics (0: not known).
        "kvBlocks": len(indexed.blocks) if indexed is not None else None,
        "kvBlockSize": (indexed.block_size if indexed is not None else 0) or state.block_size,
        # Prompt tokens whose KV the engine took from another over its KV connector
        # (vllm:external_prefix_cache_hits_total; None: the engine reports no connector).
        "kvReceived": state.kv_received if state.kv_received >= 0 else None,
        "metricsFresh": fresh,
        "ejected": state.ejected(now),
        "served": sorted(state.served_models) if state.served_models else [],
    }


def _replica_view(item: Any, endpoint: dict[str, Any] | None) -> dict[str, Any]:
    address = item.address
    port = int(address.rpartition(":")[2]) if address else None
    return {
        "index": item.index,
        "phase": item.phase,
        "reason": item.reason,
        "message": item.message,
        "restarts": item.restarts,
        "pid": item.pid,
        "address": address,
        "port": port,
        "lastExitCode": item.last_exit_code,
        "hasLog": True,
        "endpoint": endpoint,
    }


def _backend_of(pg: dict[str, Any] | None, svc: dict[str, Any] | None) -> str:
    if pg is not None:
        cfg = pg.get("spec", {}).get("backendRuntimeConfig") or {}
        return str(cfg.get("backendName") or "vllm")
    labels = (
        ((svc or {}).get("spec", {}).get("workloadTemplate", {}).get("workerTemplate", {}))
        .get("metadata", {})
        .get("labels", {})
    ) or {}
    return str(labels.get("inference.llmaz.io/backend-name", ""))


def _models_of(pg: dict[str, Any] | None, svc: dict[str, Any] | None) -> list[str]:
    if pg is not None:
        spec = pg.get("spec", {})
        claim = spec.get("modelClaim")
        if claim:
            return [str(claim.get("modelName", ""))]
        claims = (spec.get("modelClaims") or {}).get("models") or []
        return [str(c.get("name", "")) for c in claims]
    claims = ((svc or {}).get("spec", {}).get("modelClaims") or {}).get("models") or []
    return [str(c.get("name", "")) for c in claims]


def _kv_moved(replicas: list[dict[str, Any]]) -> float | None:
    """The KV a role pair moved: prompt tokens its decode replicas took from prefill, summed
    over the replicas running now (each engine counts since it started); None if none says."""
    counts = [
        r["endpoint"]["kvReceived"]
        for r in replicas
        if r["endpoint"] is not None and r["endpoint"]["kvReceived"] is not None
    ]
    return sum(counts) if counts else None


def snapshot(
    store: Store,
    runtime: Any = None,
    view: GatewayView | None = None,
    prefix_rate: Callable[[str], float | None] = lambda _a: None,
    events: bool = True,
) -> dict[str, Any]:
    """The fleet as plain JSON-ready data (``events=False``: without the recent events), with
    the endpoints' load from the gateway's ``view``, if there is a gateway."""
    now = time.monotonic()
    states: dict[str, Any] = {s.address: s for s in view.endpoints} if view is not None else {}
    staleness = view.metrics_staleness if view is not None else 1.0
    index = view.kv_index if view is not None else None
    views = {a: endpoint_view(s, staleness, now, prefix_rate, index) for a, s in states.items()}
    claimed: set[str] = set()

    playgrounds = store.list("Playground")
    services = store.list("Service")
    by_key = {
        (s["metadata"].get("namespace") or "default", s["metadata"]["name"]): s for s in services
    }
    # (Playground, Service, role): a disaggregated Playground is one workload per role.
    pairs: list[tuple[dict[str, Any] | None, dict[str, Any] | None, str | None]] = []
    for pg in playgrounds:
        namespace = pg["metadata"].get("namespace") or "default"
        if ((pg.get("spec") or {}).get("llmplane") or {}).get("disaggregation"):
            for role in ROLES:
                name = role_service_name(pg["metadata"]["name"], role)
                pairs.append((pg, by_key.pop((namespace, name), None), role))
            continue
        pairs.append((pg, by_key.pop((namespace, pg["metadata"]["name"]), None), None))
    for svc in by_key.values():
        if _owned_by_playground(svc) is None:
            pairs.append((None, svc, None))

    workloads = []
    for pg, svc, role in pairs:
        main = pg if pg is not None else svc
        assert main is not None
        meta = main["metadata"]
        namespace = meta.get("namespace") or "default"
        name = meta["name"] if role is None else role_service_name(meta["name"], role)
        spec = main.get("spec") or {}
        if role is not None:
            spec = (spec["llmplane"]["disaggregation"] or {}).get(role) or {}
        spec_replicas = spec.get("replicas")
        desired = 1 if spec_replicas is None else int(spec_replicas)
        status = runtime.status(f"{namespace}/{name}") if runtime is not None else None
        replicas = []
        if status is not None:
            for item in status.items:
                endpoint = views.get(item.address) if item.address else None
                if endpoint is not None:
                    claimed.add(item.address)
                replicas.append(_replica_view(item, endpoint))
            ready = status.ready
            desired = status.replicas  # what the runtime runs now (an autoscaler may move it)
        else:
            for address, state in sorted(states.items()):
                if state.endpoint.labels.get(SERVICE_LABEL) != name or (
                    state.endpoint.namespace != namespace
                ):
                    continue
                claimed.add(address)
                index = state.endpoint.labels.get(REPLICA_LABEL, "")
                replicas.append(
                    {
                        "index": int(index) if index.isdigit() else len(replicas),
                        "phase": "Ready",
                        "reason": None,
                        "message": "",
                        "restarts": None,
                        "pid": None,
                        "address": address,
                        "port": int(address.rpartition(":")[2] or 0) or None,
                        "lastExitCode": None,
                        "hasLog": False,
                        "endpoint": views[address],
                    }
                )
            ready = int(((svc or main).get("status") or {}).get("readyReplicas") or len(replicas))
        workloads.append(
            {
                "kind": main["kind"],
                "namespace": namespace,
                "name": name,
                "role": role,  # prefill | decode for a disaggregated Playground's workloads
                "playground": meta["name"] if pg is not None else None,
                "models": _models_of(pg, svc),
                "backend": _backend_of(pg, svc),
                "desired": desired,
                "ready": ready,
                "replicas": replicas,
                "conditions": _conditions(svc if role is not None else main),
                "kvMoved": _kv_moved(replicas) if role == "decode" else None,
                "events": _events(store, pg, svc) if events else [],
            }
        )
    models = []
    for model in store.list("OpenModel"):
        ready = next((c for c in _conditions(model) if c.get("type") == "Ready"), None)
        models.append(
            {
                "name": model["metadata"]["name"],
                "status": (ready or {}).get("status", "Unknown"),
                "reason": (ready or {}).get("reason", ""),
                "message": (ready or {}).get("message", ""),
            }
        )
    return {
        "workloads": workloads,
        "models": models,
        "otherEndpoints": [v for a, v in sorted(views.items()) if a not in claimed],
    }
