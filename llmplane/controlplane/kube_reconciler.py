"""Level-based reconciliation of Playgrounds and Services against the Kubernetes API.

The Kubernetes counterpart of ``controller.py``: the operator (``llmplane/operator/``) only
decides when a pass runs (kopf events, resync) and calls ``Reconciler.playground`` /
``Reconciler.service``; the embedded controller runs its passes on store events.

Each call reads the current objects, plans with the same pure code as the embedded substrate
(``llmplane.controlplane.planning``, with pod paths from ``llmplane.runtime.kube``), realises
the result through ``KubeRuntime`` (server-side apply) and writes the status that
``llmplane.controlplane.status`` computes, the same functions the embedded controller uses, only
when it changes. Running it again with nothing changed writes nothing.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from llmplane.api.documents import InvalidResources, parse_document
from llmplane.api.inference import BackendRuntime, Playground, Service
from llmplane.api.llmaz import OpenModel
from llmplane.controlplane import planning
from llmplane.controlplane.disaggregation import (
    ROLES,
    role_service_name,
    roles_status,
    service_names,
)
from llmplane.controlplane.plan import BACKEND_LABEL, ROLE_LABEL
from llmplane.controlplane.planning import PlanningError
from llmplane.controlplane.status import (
    playground_status,
    pool_ref_statuses,
    same_status,
    service_status,
)
from llmplane.kube import kinds
from llmplane.kube.client import KubeClient
from llmplane.kube.kinds import Kind
from llmplane.kube.metadata import slim
from llmplane.operator.resources import kind_for
from llmplane.runtime import kube
from llmplane.runtime.kube.roles import playground_services

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
        self.runtime = kube.KubeRuntime(client, self.options)

    async def _models(self, names: list[str]) -> tuple[dict[str, OpenModel], list[str]]:
        models: dict[str, OpenModel] = {}
        missing = []
        for name in names:
            obj = await self.client.get_or_none(kinds.OPENMODEL, name)
            if obj is None:
                missing.append(name)
            else:
                models[name] = parse(OpenModel, obj)
        return models, missing

    async def _apply_all(self, objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            await self.client.apply(kind_for(obj["apiVersion"], obj["kind"]), obj)

    async def _write_status(self, kind: Any, obj: dict[str, Any], status: dict[str, Any]) -> bool:
        if same_status(obj.get("status"), status):
            return False
        meta = obj["metadata"]
        await self.client.patch_status(kind, meta["name"], meta.get("namespace"), status)
        return True

    async def playground(self, namespace: str, name: str) -> None:
        obj = await self.client.get_or_none(kinds.PLAYGROUND, name, namespace)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return  # its Service, HPA and workload go with it (ownerReferences)
        abort, services = await self._apply_playground(obj, namespace, name)
        generation = obj["metadata"].get("generation")
        if abort is None and len(services) > 1:
            status = roles_status(obj.get("status"), generation, services)
        else:
            service = next(iter(services.values()), None)
            status = playground_status(obj.get("status"), generation, service, abort)
        await self._write_status(kinds.PLAYGROUND, obj, status)

    async def _apply_playground(
        self, obj: dict[str, Any], namespace: str, name: str
    ) -> tuple[str | None, dict[str, dict[str, Any] | None]]:
        """Apply the Playground's Service (and HPA), or its role Services when disaggregated:
        (None, {role or "": the Service as stored}), or (why not, {})."""
        try:
            pg = parse(Playground, obj)
        except InvalidResources as err:
            return str(err), {}
        for service_name in service_names(pg):
            existing = await self.client.get_or_none(
                kinds.INFERENCE_SERVICE, service_name, namespace
            )
            taken = planning.name_taken(pg, existing)
            if taken is not None:
                return taken, {}
        models, _ = await self._models([m.name for m in planning.claims_of(pg).models])
        backend_name = pg.spec.backend_runtime_config.backend_name
        backend_obj = await self.client.get_or_none(kinds.BACKENDRUNTIME, backend_name)
        backend = parse(BackendRuntime, backend_obj) if backend_obj is not None else None
        abort = planning.missing_inputs(pg, models, backend)
        if abort is not None or backend is None:
            return abort, {}
        try:
            services, objects = playground_services(pg, models, backend)
        except PlanningError as err:
            return str(err), {}
        await self._apply_all(objects)
        if not any(o["kind"] == "HorizontalPodAutoscaler" for o in objects):
            hpa = await self.client.get_or_none(kinds.HPA, name, namespace)
            if hpa is not None and _controlled_by(hpa, obj):
                await self.client.delete(kinds.HPA, name, namespace)
        # Services it owns under other names (it switched to or from disaggregation).
        wanted = {service.name for service in services}
        for other in (pg.name, *(role_service_name(pg.name, role) for role in ROLES)):
            if other in wanted:
                continue
            old = await self.client.get_or_none(kinds.INFERENCE_SERVICE, other, namespace)
            if old is not None and _controlled_by(old, obj):
                await self.client.delete(kinds.INFERENCE_SERVICE, other, namespace)
        stored = {}
        for service in services:
            role = (service.metadata.labels or {}).get(ROLE_LABEL, "")
            stored[role] = await self.client.get_or_none(
                kinds.INFERENCE_SERVICE, service.name, namespace
            )
        return None, stored

    async def service(self, namespace: str, name: str) -> None:
        obj = await self.client.get_or_none(kinds.INFERENCE_SERVICE, name, namespace)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return
        generation = obj["metadata"].get("generation")
        service = parse(Service, obj)
        models, missing = await self._models([m.name for m in service.spec.model_claims.models])
        error: PlanningError | None = None
        if missing:
            error = PlanningError(f"Waiting for model creation: OpenModel {', '.join(missing)}")
        else:
            backend_name = (obj["metadata"].get("labels") or {}).get(BACKEND_LABEL)
            backend = None
            if backend_name:
                backend_obj = await self.client.get_or_none(kinds.BACKENDRUNTIME, backend_name)
                backend = parse(BackendRuntime, backend_obj) if backend_obj else None
            try:
                plan = self.runtime.plan(service, models, backend)
            except PlanningError as err:
                error = err
            else:
                await self.runtime.realise(plan)
        if error is not None:
            status = service_status(obj.get("status"), generation, None, (error.reason, str(error)))
        else:
            state = await self.runtime.observe(f"{namespace}/{name}")
            status = service_status(obj.get("status"), generation, state)
        await self._write_status(kinds.INFERENCE_SERVICE, obj, status)

    async def playgrounds_using(self, model: str | None = None, backend: str | None = None) -> None:
        """Re-plan the Playgrounds that claim ``model`` or run on ``backend``."""
        for obj in await self.client.list(kinds.PLAYGROUND):
            spec = obj.get("spec") or {}
            names = {(spec.get("modelClaim") or {}).get("modelName")}
            names |= {m.get("name") for m in (spec.get("modelClaims") or {}).get("models") or []}
            uses = (spec.get("backendRuntimeConfig") or {}).get("backendName") or "vllm"
            if (model and model in names) or (backend and backend == uses):
                meta = obj["metadata"]
                await self.playground(meta.get("namespace") or "default", meta["name"])

    async def pool_refs(self) -> None:
        """``Accepted`` on every InferenceObjective and InferenceModelRewrite, from whether the
        InferencePool each names exists (in either group's CRD)."""
        pool_kinds = [Kind.of("InferencePool"), *Kind.served_of(["InferencePool"])]
        pools = {
            (o["metadata"].get("namespace") or "default", o["metadata"]["name"])
            for kind in pool_kinds
            for o in await self.client.list(kind)
        }
        for name in ("InferenceObjective", "InferenceModelRewrite"):
            kind = Kind.of(name)
            for obj, status in pool_ref_statuses(await self.client.list(kind), pools):
                meta = obj["metadata"]
                await self.client.patch_status(kind, meta["name"], meta.get("namespace"), status)


__all__ = ["Reconciler", "parse"]
