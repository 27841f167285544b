"""Pure planning of disaggregated Playgrounds (``spec.llmplane.disaggregation``).

A disaggregated Playground owns two inference Services, ``<name>-prefill`` and
``<name>-decode``: each is what the Playground would own with that role's replicas, args,
envs, resources and flavors, plus the engine flags of the KV connector for that role, and pod
labels ``llmplane.io/role`` (prefill | decode) and ``llmplane.io/pd-group`` (the Playground's
name). The gateway pairs a decode replica with a prefill replica of the same group
(``gateway/pd.py``). Both substrates call ``services_for`` with their own Service builder and
shared-directory path, so the rules live here once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson

from llmplane.api.inference import (
    DisaggregatedRole,
    Disaggregation,
    KVConnector,
    Playground,
    Service,
)
from llmplane.controlplane.conditions import set_condition
from llmplane.controlplane.plan import PD_GROUP_LABEL, ROLE_LABEL
from llmplane.controlplane.status import AVAILABLE, PLAYGROUND_NOT_READY, playground_status

ROLES = ("prefill", "decode")
# The gateway's exchange (gateway/pd.py modes) per connector type on vLLM.
_GATEWAY_MODE = {
    "sharedStorage": "http",
    "offloading": "http",
    "lmcache": "lmcache",
    "nixl": "nixl",
    "mooncake": "mooncake",
}
_VLLM_CONNECTOR = {
    "sharedStorage": "ExampleConnector",
    "offloading": "OffloadingConnector",
    "lmcache": "LMCacheConnectorV1",
    "nixl": "NixlConnector",
    "mooncake": "MooncakeConnector",
}
NIXL_SIDE_CHANNEL_PORT = 5600

# Builds the Service a (role) Playground owns: planning.service_for_playground on the
# embedded substrate, runtime.kube's (multi-host aware) on Kubernetes.
ServiceBuilder = Callable[[Playground], Service]


def engine_family(backend_name: str) -> str:
    """Which engine's flags configure the connector: ``sglang`` and ``sim`` by name (a
    BackendRuntime called sglang-custom is SGLang), everything else vLLM."""
    name = backend_name.lower()
    for family in ("sglang", "sim"):
        if family in name:
            return family
    return "vllm"


def gateway_mode(backend_name: str, connector: KVConnector) -> str:
    """The exchange the gateway runs for the pair (``gateway/pd.py``): SGLang pairs by
    bootstrap room; the sim simulates the transfer through ``kv_transfer_params`` (nixl);
    vLLM by its connector."""
    family = engine_family(backend_name)
    if family == "sglang":
        return "sglang"
    if family == "sim":
        return "nixl"
    return _GATEWAY_MODE[connector.type]


def connector_flags(
    backend_name: str, role: str, connector: KVConnector, shared_path: str
) -> tuple[list[str], dict[str, str]]:
    """(engine args, env) that give one role its side of the KV connector."""
    family = engine_family(backend_name)
    if family == "sim":
        return ["--role", role], {}
    if family == "sglang":
        backend = "mooncake" if connector.type == "mooncake" else "nixl"
        return [
            "--disaggregation-mode",
            role,
            "--disaggregation-transfer-backend",
            backend,
        ], {}
    extra: dict[str, Any] = {}
    if connector.type == "sharedStorage":
        extra["shared_storage_path"] = shared_path
    extra.update(connector.extra_config or {})
    kv_role = "kv_both"
    if connector.type == "mooncake":
        kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
    config: dict[str, Any] = {"kv_connector": _VLLM_CONNECTOR[connector.type], "kv_role": kv_role}
    if extra:
        config["kv_connector_extra_config"] = extra
    env: dict[str, str] = {}
    if connector.type == "nixl":
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(NIXL_SIDE_CHANNEL_PORT)
    return ["--kv-transfer-config", orjson.dumps(config).decode()], env


def role_playground(
    pg: Playground, role: str, spec: DisaggregatedRole, args: list[str], env: dict[str, str]
) -> Playground:
    """The plain Playground a role amounts to (same name and uid: the Service's owner)."""
    data = pg.model_dump(by_alias=True, exclude_none=True, mode="json")
    pg_spec = data["spec"]
    pg_spec.pop("llmplane", None)
    pg_spec.pop("elasticConfig", None)
    pg_spec["replicas"] = spec.replicas
    runtime = pg_spec.setdefault("backendRuntimeConfig", {})
    runtime["args"] = [*(runtime.get("args") or []), *(spec.args or []), *args]
    envs = [*(runtime.get("envs") or []), *(e.to_dict() for e in spec.envs or [])]
    envs += [{"name": k, "value": v} for k, v in env.items()]
    if envs:
        runtime["envs"] = envs
    if spec.resources is not None:
        merged = copy.deepcopy(runtime.get("resources") or {})
        for section, values in spec.resources.to_dict().items():
            merged.setdefault(section, {}).update(values)
        runtime["resources"] = merged
    if spec.inference_flavors:
        claim = pg_spec.get("modelClaim") or pg_spec.get("modelClaims")
        claim["inferenceFlavors"] = list(spec.inference_flavors)
    return Playground.model_validate(data)


def _labelled(service: Service, name: str, role: str, group: str) -> Service:
    data = service.model_dump(by_alias=True, exclude_none=True, mode="json")
    data["metadata"]["name"] = name
    extra = {ROLE_LABEL: role, PD_GROUP_LABEL: group}
    data["metadata"]["labels"] = {**(data["metadata"].get("labels") or {}), **extra}
    template = data["spec"]["workloadTemplate"]
    for key in ("workerTemplate", "leaderTemplate"):
        pod = template.get(key)
        if pod is not None:
            meta = pod.setdefault("metadata", {})
            meta["labels"] = {**(meta.get("labels") or {}), **extra}
    return Service.model_validate(data)


def role_service_name(pg_name: str, role: str) -> str:
    return f"{pg_name}-{role}"


def role_spec(disaggregation: Disaggregation, role: str) -> DisaggregatedRole:
    return disaggregation.prefill if role == "prefill" else disaggregation.decode


def services_for(pg: Playground, build: ServiceBuilder, shared_path: str) -> list[Service]:
    """The Services a Playground owns: its own (same name), or one per role."""
    dis = pg.spec.disaggregation
    if dis is None:
        return [build(pg)]
    backend = pg.spec.backend_runtime_config.backend_name
    out = []
    for role in ROLES:
        args, env = connector_flags(backend, role, dis.kv_connector, shared_path)
        plain = role_playground(pg, role, role_spec(dis, role), args, env)
        out.append(_labelled(build(plain), role_service_name(pg.name, role), role, pg.name))
    return out


def service_names(pg: Playground) -> list[str]:
    if pg.spec.disaggregation is None:
        return [pg.name]
    return [role_service_name(pg.name, role) for role in ROLES]


def roles_status(
    current: dict[str, Any] | None,
    generation: int | None,
    services: dict[str, dict[str, Any] | None],
) -> dict[str, Any]:
    """A disaggregated Playground's status from its role Services (role -> object or None):
    Available when every role is; otherwise the Available condition names the roles that are
    not (``prefill not ready: 0/1 replicas ready``), with a role's own failure reason (such as
    CrashLoopBackOff) when it has one. Replicas and ready replicas are summed over roles."""
    replicas = ready = 0
    selector = None
    waiting: list[str] = []
    first: dict[str, Any] | None = None
    for role, svc in services.items():
        status = (svc or {}).get("status") or {}
        replicas += int(status.get("replicas") or 0)
        ready += int(status.get("readyReplicas") or 0)
        selector = status.get("selector") or selector
        conditions = status.get("conditions") or []
        available = next((c for c in conditions if c.get("type") == AVAILABLE), None)
        if svc is None or available is None or available.get("status") != "True":
            message = (available or {}).get("message") or "not created yet"
            waiting.append(f"{role} not ready: {message}")
            first = first or svc
    if not waiting:
        view: dict[str, Any] | None = next(iter(services.values()))
    else:
        view = copy.deepcopy(first) if first is not None else None
    status = playground_status(current, generation, view)
    if waiting:
        conditions = status.get("conditions") or []
        found = next((c for c in conditions if c.get("type") == AVAILABLE), None)
        reason = found["reason"] if found else PLAYGROUND_NOT_READY
        status["conditions"] = set_condition(
            conditions, AVAILABLE, False, reason, "; ".join(waiting), generation
        )
    status["replicas"] = replicas
    status["readyReplicas"] = ready
    if selector:
        status["selector"] = selector
    return status
