"""Level-based reconciliation of Playgrounds and Services against the Kubernetes API.

Each call reads the current objects, plans with the same pure code as the embedded substrate
(``llmplane.runtime.kube`` on top of ``llmplane.controlplane.planning``), server-side-applies the
result and writes status conditions (llmaz's types and reasons, with ``observedGeneration``)
only when they change. Running it again with nothing changed writes nothing.
"""

from __future__ import annotations

import copy
import logging
from datetime import UTC, datetime
from typing import Any

from llmplane.api.documents import InvalidResources, parse_document
from llmplane.api.inference import BackendRuntime, Playground, Service
from llmplane.api.llmaz import OpenModel
from llmplane.controlplane import planning
from llmplane.controlplane.plan import BACKEND_LABEL
from llmplane.controlplane.planning import PlanningError
from llmplane.kube.client import KubeClient
from llmplane.kube.kinds import (
    BACKENDRUNTIME,
    CORE_SERVICE,
    DEPLOYMENT,
    HPA,
    INFERENCE_SERVICE,
    LEADERWORKERSET,
    OPENMODEL,
    PLAYGROUND,
)
from llmplane.kube.metadata import slim
from llmplane.operator.resources import kind_for
from llmplane.runtime import kube

log = logging.getLogger("llmplane.operator")


def parse(cls: Any, obj: dict[str, Any]) -> Any:
    """An API object as its model, validated and upgraded from llmaz's older field names like
    ``llmplane apply`` does; server-only metadata (managedFields ...) is dropped.

    Raises InvalidResources with every violation.
    """
    data = copy.deepcopy(slim(obj))
    resource, _warnings = parse_document(data)
    if not isinstance(resource, cls):
        raise InvalidResources([f"expected {cls.__name__}, got {type(resource).__name__}"])
    return resource


# Conditions (apimeta.SetStatusCondition semantics) -------------------------------------------


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
) -> bool:
    """Set one condition in place; lastTransitionTime changes only with the status."""
    new = {"type": type_, "status": status, "reason": reason, "message": message}
    if generation is not None:
        new["observedGeneration"] = generation
    for i, old in enumerate(conditions):
        if old.get("type") == type_:
            same_status = old.get("status") == status and old.get("lastTransitionTime")
            new["lastTransitionTime"] = old["lastTransitionTime"] if same_status else _now()
            conditions[i] = new
            return _untimed(old) != _untimed(new)
    new["lastTransitionTime"] = _now()
    conditions.append(new)
    return True


def _untimed(c: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in c.items() if k != "lastTransitionTime"}


def condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def is_true(conditions: list[dict[str, Any]], type_: str) -> bool:
    found = condition(conditions, type_)
    return bool(found and found.get("status") == "True")


def workload_status(workload: dict[str, Any] | None) -> dict[str, Any]:
    """(available, replicas, readyReplicas, selector) of a LeaderWorkerSet or Deployment."""
    if workload is None:
        return {"available": False, "replicas": 0, "ready": 0, "selector": None}
    status = workload.get("status") or {}
    conditions = status.get("conditions") or []
    if workload["kind"] == "LeaderWorkerSet":
        return {
            "available": is_true(conditions, "Available"),
            "replicas": int(status.get("replicas") or 0),
            "ready": int(status.get("readyReplicas") or 0),
            "selector": status.get("hpaPodSelector"),
        }
    wanted = int((workload.get("spec") or {}).get("replicas", 1))
    available = int(status.get("availableReplicas") or 0)
    labels = ((workload.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return {
        "available": is_true(conditions, "Available") and available >= wanted,
        "replicas": int(status.get("replicas") or 0),
        "ready": int(status.get("readyReplicas") or 0),
        "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None,
    }


def service_status(
    current: dict[str, Any] | None,
    generation: int | None,
    workload: dict[str, Any] | None,
    error: PlanningError | None = None,
) -> dict[str, Any]:
    """llmaz's setServiceCondition: Available ServiceReady, else Progressing ServiceInProgress
    (and Available False ServiceNotReady once it had been set)."""
    status = copy.deepcopy(current or {})
    conditions = status.setdefault("conditions", [])
    if error is not None:
        set_condition(conditions, "Progressing", "False", error.reason, str(error), generation)
        return status
    state = workload_status(workload)
    if state["available"]:
        set_condition(
            conditions,
            "Available",
            "True",
            "ServiceReady",
            "Inference Service is ready",
            generation,
        )
        set_condition(
            conditions,
            "Progressing",
            "False",
            "ServiceReady",
            "Inference Service is ready",
            generation,
        )
    else:
        set_condition(
            conditions,
            "Progressing",
            "True",
            "ServiceInProgress",
            "Inference Service is progressing",
            generation,
        )
        if condition(conditions, "Available") is not None:
            set_condition(
                conditions,
                "Available",
                "False",
                "ServiceNotReady",
                "Waiting for the workload to be ready",
                generation,
            )
    status["replicas"] = state["replicas"]
    status["readyReplicas"] = state["ready"]
    if state["selector"]:
        status["selector"] = state["selector"]
    return status


def playground_status(
    current: dict[str, Any] | None,
    generation: int | None,
    service: dict[str, Any] | None,
    abort: str | None = None,
) -> dict[str, Any]:
    """llmaz's setPlaygroundCondition / handleUnexpectedCondition."""
    status = copy.deepcopy(current or {})
    conditions = status.setdefault("conditions", [])
    if abort is not None:
        set_condition(conditions, "Progressing", "False", "AbortProcessing", abort, generation)
        return status
    svc_status = (service or {}).get("status") or {}
    svc_conditions = svc_status.get("conditions") or []
    progressing = condition(conditions, "Progressing")
    if not conditions or (progressing and progressing.get("status") == "False"):
        set_condition(
            conditions,
            "Progressing",
            "True",
            "Pending",
            "Waiting for inference Service ready",
            generation,
        )
    if is_true(svc_conditions, "Available"):
        set_condition(
            conditions, "Available", "True", "PlaygroundReady", "Playground is ready", generation
        )
        set_condition(
            conditions,
            "Progressing",
            "False",
            "PlaygroundReady",
            "Playground is ready",
            generation,
        )
    elif condition(conditions, "Available") is not None:
        set_condition(
            conditions,
            "Progressing",
            "True",
            "PlaygroundInProgress",
            "Waiting for inference Service progressing",
            generation,
        )
        set_condition(
            conditions,
            "Available",
            "False",
            "PlaygroundNotReady",
            "Waiting for inference Service ready",
            generation,
        )
    else:
        # Keep observedGeneration current while pending.
        found = condition(conditions, "Progressing")
        if found is not None and generation is not None:
            found["observedGeneration"] = generation
    status["replicas"] = int(svc_status.get("replicas") or 0)
    if svc_status.get("readyReplicas") is not None:
        status["readyReplicas"] = svc_status["readyReplicas"]
    if svc_status.get("selector"):
        status["selector"] = svc_status["selector"]
    return status


def _same_status(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    def strip(s: dict[str, Any] | None) -> dict[str, Any]:
        s = copy.deepcopy(s or {})
        for c in s.get("conditions") or []:
            c.pop("lastTransitionTime", None)
        return s

    return strip(a) == strip(b)


def _controlled_by(obj: dict[str, Any], owner: dict[str, Any]) -> bool:
    uid = owner["metadata"].get("uid")
    return any(
        r.get("controller") and r.get("uid") == uid
        for r in obj["metadata"].get("ownerReferences") or []
    )


# The reconciler --------------------------------------------------------------------------------


class Reconciler:
    def __init__(self, client: KubeClient, options: kube.KubeOptions | None = None):
        self.client = client
        self.options = options or kube.KubeOptions()

    async def _models(self, names: list[str]) -> tuple[dict[str, OpenModel], list[str]]:
        models: dict[str, OpenModel] = {}
        missing = []
        for name in names:
            obj = await self.client.get_or_none(OPENMODEL, name)
            if obj is None:
                missing.append(name)
            else:
                models[name] = parse(OpenModel, obj)
        return models, missing

    async def _apply_all(self, objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            await self.client.apply(kind_for(obj["apiVersion"], obj["kind"]), obj)

    async def _write_status(self, kind: Any, obj: dict[str, Any], status: dict[str, Any]) -> bool:
        if _same_status(obj.get("status"), status):
            return False
        meta = obj["metadata"]
        await self.client.patch_status(kind, meta["name"], meta.get("namespace"), status)
        return True

    async def playground(self, namespace: str, name: str) -> None:
        obj = await self.client.get_or_none(PLAYGROUND, name, namespace)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return  # its Service, HPA and workload go with it (ownerReferences)
        generation = obj["metadata"].get("generation")
        try:
            pg = parse(Playground, obj)
        except InvalidResources as err:
            await self._write_status(
                PLAYGROUND, obj, playground_status(obj.get("status"), generation, None, str(err))
            )
            return
        existing = await self.client.get_or_none(INFERENCE_SERVICE, name, namespace)
        if existing is not None and not _controlled_by(existing, obj):
            abort = "Playground owns the same name with an existing Service"
            await self._write_status(
                PLAYGROUND, obj, playground_status(obj.get("status"), generation, None, abort)
            )
            return
        claims = planning.claims_of(pg)
        models, missing = await self._models([m.name for m in claims.models])
        if missing:
            abort = f"Waiting for model creation: OpenModel {', '.join(missing)} not found"
            await self._write_status(
                PLAYGROUND, obj, playground_status(obj.get("status"), generation, None, abort)
            )
            return
        backend_name = pg.spec.backend_runtime_config.backend_name
        backend_obj = await self.client.get_or_none(BACKENDRUNTIME, backend_name)
        if backend_obj is None:
            abort = f"Waiting for BackendRuntime {backend_name}"
            await self._write_status(
                PLAYGROUND, obj, playground_status(obj.get("status"), generation, None, abort)
            )
            return
        backend = parse(BackendRuntime, backend_obj)
        try:
            _, objects = kube.playground_objects(pg, models, backend)
        except PlanningError as err:
            await self._write_status(
                PLAYGROUND, obj, playground_status(obj.get("status"), generation, None, str(err))
            )
            return
        await self._apply_all(objects)
        if not any(o["kind"] == "HorizontalPodAutoscaler" for o in objects):
            hpa = await self.client.get_or_none(HPA, name, namespace)
            if hpa is not None and _controlled_by(hpa, obj):
                await self.client.delete(HPA, name, namespace)
        service = await self.client.get_or_none(INFERENCE_SERVICE, name, namespace)
        await self._write_status(
            PLAYGROUND, obj, playground_status(obj.get("status"), generation, service)
        )

    async def service(self, namespace: str, name: str) -> None:
        obj = await self.client.get_or_none(INFERENCE_SERVICE, name, namespace)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return
        generation = obj["metadata"].get("generation")
        service = parse(Service, obj)
        models, missing = await self._models([m.name for m in service.spec.model_claims.models])
        workload_kind = LEADERWORKERSET if self.options.use_leader_worker_set else DEPLOYMENT
        error: PlanningError | None = None
        if missing:
            error = PlanningError(f"Waiting for model creation: OpenModel {', '.join(missing)}")
        else:
            backend_name = (obj["metadata"].get("labels") or {}).get(BACKEND_LABEL)
            backend = None
            if backend_name:
                backend_obj = await self.client.get_or_none(BACKENDRUNTIME, backend_name)
                backend = parse(BackendRuntime, backend_obj) if backend_obj else None
            try:
                objects = kube.workload_objects(service, models, backend, self.options)
            except PlanningError as err:
                error = err
            else:
                await self._apply_all(objects)
        workload = await self.client.get_or_none(workload_kind, name, namespace)
        status = service_status(obj.get("status"), generation, workload, error)
        await self._write_status(INFERENCE_SERVICE, obj, status)

    async def playgrounds_using(self, model: str | None = None, backend: str | None = None) -> None:
        """Re-plan the Playgrounds that claim ``model`` or run on ``backend``."""
        for obj in await self.client.list(PLAYGROUND):
            spec = obj.get("spec") or {}
            names = {(spec.get("modelClaim") or {}).get("modelName")}
            names |= {m.get("name") for m in (spec.get("modelClaims") or {}).get("models") or []}
            uses = (spec.get("backendRuntimeConfig") or {}).get("backendName") or "vllm"
            if (model and model in names) or (backend and backend == uses):
                meta = obj["metadata"]
                await self.playground(meta.get("namespace") or "default", meta["name"])


__all__ = [
    "CORE_SERVICE",
    "Reconciler",
    "parse",
    "playground_status",
    "service_status",
    "set_condition",
]
