"""The embedded control loop: store changes -> planning -> runtime -> status back in the store.

Level-triggered like a Kubernetes controller: any change (a store event, a runtime state change,
a model download step, a periodic resync) marks the world dirty and one pass reconciles every
OpenModel, Playground and Service. At one machine's scale a full pass costs milliseconds, and
it can never miss an edge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from llmplane.api.inference import BackendRuntime, Playground, Service
from llmplane.api.llmaz import OpenModel
from llmplane.controlplane import conditions as cond
from llmplane.controlplane.events import EVENT_KIND, record_event
from llmplane.controlplane.loads import ModelLoads
from llmplane.controlplane.plan import WorkloadPlan
from llmplane.controlplane.planning import (
    Inputs,
    PlanningError,
    claims_of,
    plan_service,
    service_for_playground,
)
from llmplane.store.base import Store

log = logging.getLogger("llmplane.controller")


class Controller:
    """Reconciles the store's llmaz resources onto a runtime and writes their status."""

    def __init__(self, store: Store, runtime: Any, cache_dir: Path, resync_seconds: float = 5.0):
        self.store = store
        self.runtime = runtime
        self.resync_seconds = resync_seconds
        self._dirty = asyncio.Event()
        self.loads = ModelLoads(cache_dir, self.kick)
        self._realised: dict[str, str] = {}  # service key -> plan template hash + replicas

    def kick(self) -> None:
        self._dirty.set()

    async def run(self) -> None:
        watcher = asyncio.create_task(self._watch())
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._dirty.wait(), self.resync_seconds)
                self._dirty.clear()
                await asyncio.sleep(0.02)  # coalesce bursts of events
                try:
                    await self.reconcile()
                except Exception:  # a bug must not stop the control loop
                    log.exception("reconcile failed")
        finally:
            watcher.cancel()
            self.loads.cancel()

    async def _watch(self) -> None:
        async for event in self.store.watch():
            if event.object.get("kind") != EVENT_KIND:
                self.kick()

    # --- one pass ------------------------------------------------------------------------------

    def _objects(self, kind: str, cls: Any) -> list[Any]:
        out = []
        for obj in self.store.list(kind):
            try:
                out.append(cls.model_validate(obj))
            except Exception as err:  # stored by another version of llmplane, or damaged
                name = (obj.get("metadata") or {}).get("name")
                log.warning("skipping invalid %s/%s: %s", kind, name, err)
        return out

    async def reconcile(self) -> None:
        models = {m.name: m for m in self._objects("OpenModel", OpenModel)}
        backends = {b.name: b for b in self._objects("BackendRuntime", BackendRuntime)}
        playgrounds = self._objects("Playground", Playground)
        claimed: set[str] = set()

        for pg in playgrounds:
            claims = claims_of(pg)
            claimed.update(m.name for m in claims.models)
            self._reconcile_playground(pg, models, backends)

        pg_keys = {(p.namespace, p.name) for p in playgrounds}
        services = []
        for svc in self._objects("Service", Service):
            owner = next(
                (o for o in svc.metadata.owner_references or [] if o.kind == "Playground"), None
            )
            if owner is not None and (svc.namespace, owner.name) not in pg_keys:
                self.store.delete("Service", svc.name, svc.namespace)  # garbage-collect
                continue
            services.append(svc)
            claimed.update(m.name for m in svc.spec.model_claims.models)

        for name in claimed:
            if name in models:
                self.loads.ensure(models[name])
        for model in models.values():
            self._write_model_status(model)

        live = set()
        for svc in services:
            live.add(f"{svc.namespace}/{svc.name}")
            await self._reconcile_service(svc, models, backends)
        for key in list(self._realised):
            if key not in live:
                del self._realised[key]
                await self.runtime.remove(key)
                log.info("removed workload %s", key)

        # Playground status mirrors its Service (written after the Service pass).
        for pg in playgrounds:
            self._write_playground_status(pg)

    # --- OpenModel ----------------------------------------------------------------------------

    def _write_model_status(self, model: OpenModel) -> None:
        status, reason, message = self.loads.state(model)
        obj = self.store.get("OpenModel", model.name)
        if obj is None:
            return
        before = obj.get("status") or {}
        new = dict(before)
        new["conditions"] = cond.set_condition(
            before.get("conditions"),
            cond.READY,
            status,
            reason,
            message,
            obj["metadata"].get("generation"),
        )
        if new != before:
            self.store.update_status("OpenModel", model.name, None, new)
            old = cond.get_condition(obj, cond.READY)
            if old is None or old.get("reason") != reason:
                record_event(
                    self.store,
                    obj,
                    reason,
                    message,
                    "Warning" if status == "False" and reason != "Loading" else "Normal",
                )

    # --- Playground ---------------------------------------------------------------------------

    def _reconcile_playground(
        self, pg: Playground, models: dict[str, OpenModel], backends: dict[str, BackendRuntime]
    ) -> None:
        name = pg.spec.backend_runtime_config.backend_name
        backend = backends.get(name)
        try:
            if backend is None:
                raise PlanningError(
                    f"BackendRuntime {name!r} not found (known: {', '.join(sorted(backends)) or 'none'})"
                )
            service = service_for_playground(Inputs(pg, models, backend), locate=self.loads.path)
        except PlanningError as err:
            self._set_playground_error(pg, err)
            return
        desired = service.to_dict()
        desired.pop("status", None)
        created = self.store.get("Service", pg.name, pg.namespace) is None
        self.store.apply(desired)  # a no-op when nothing changed
        owner = self.store.get("Playground", pg.name, pg.namespace)
        if created and owner is not None:
            record_event(self.store, owner, "ServiceCreated", f"Created Service {pg.name}")

    def _set_playground_error(self, pg: Playground, err: PlanningError) -> None:
        obj = self.store.get("Playground", pg.name, pg.namespace)
        if obj is None:
            return
        before = obj.get("status") or {}
        new = dict(before)
        gen = obj["metadata"].get("generation")
        conditions = cond.set_condition(
            before.get("conditions"), cond.PROGRESSING, False, "AbortProcessing", str(err), gen
        )
        conditions = cond.set_condition(
            conditions, cond.AVAILABLE, False, "PlaygroundNotReady", str(err), gen
        )
        new["conditions"] = conditions
        new.setdefault("replicas", 0)
        if new != before:
            self.store.update_status("Playground", pg.name, pg.namespace, new)
            record_event(self.store, obj, "AbortProcessing", str(err), "Warning")

    def _write_playground_status(self, pg: Playground) -> None:
        obj = self.store.get("Playground", pg.name, pg.namespace)
        svc = self.store.get("Service", pg.name, pg.namespace)
        if obj is None or svc is None:
            return
        before = obj.get("status") or {}
        svc_status = svc.get("status") or {}
        gen = obj["metadata"].get("generation")
        available = cond.get_condition(svc, cond.AVAILABLE)
        ready = bool(available and available.get("status") == "True")
        svc_msg = (available or {}).get("message", "")
        svc_reason = (available or {}).get("reason", "")
        conditions = before.get("conditions")
        if ready:
            conditions = cond.set_condition(
                conditions, cond.PROGRESSING, False, "PlaygroundReady", "Playground is ready", gen
            )
            conditions = cond.set_condition(
                conditions, cond.AVAILABLE, True, "PlaygroundReady", "Playground is ready", gen
            )
        else:
            reason = (
                svc_reason
                if svc_reason not in ("", "ServiceNotReady", "ServiceInProgress")
                else "PlaygroundNotReady"
            )
            conditions = cond.set_condition(
                conditions,
                cond.PROGRESSING,
                True,
                "PlaygroundInProgress",
                svc_msg or "Playground is progressing",
                gen,
            )
            conditions = cond.set_condition(
                conditions,
                cond.AVAILABLE,
                False,
                reason,
                svc_msg or "Waiting for the Service to be ready",
                gen,
            )
        new = {
            **before,
            "conditions": conditions,
            "replicas": svc_status.get("replicas", 0),
            "selector": svc_status.get("selector", ""),
        }
        if "readyReplicas" in svc_status:
            new["readyReplicas"] = svc_status["readyReplicas"]
        if new != before:
            self.store.update_status("Playground", pg.name, pg.namespace, new)
            old = cond.get_condition(obj, cond.AVAILABLE)
            if ready and not (old and old.get("status") == "True"):
                record_event(self.store, obj, "PlaygroundReady", "All replicas are ready")

    # --- Service ------------------------------------------------------------------------------

    async def _reconcile_service(
        self, svc: Service, models: dict[str, OpenModel], backends: dict[str, BackendRuntime]
    ) -> None:
        key = f"{svc.namespace}/{svc.name}"
        labels = (
            (svc.spec.workload_template.worker_template.metadata.labels or {})
            if svc.spec.workload_template.worker_template.metadata
            else {}
        )
        backend = backends.get(labels.get("inference.llmaz.io/backend-name", ""))
        local_command = list(backend.spec.local.command) if backend and backend.spec.local else None
        waiting: list[str] = []
        try:
            plan = plan_service(
                svc, models, backend, locate=self.loads.path, local_command=local_command
            )
            for ref in svc.spec.model_claims.models:
                status, reason, message = self.loads.state(models[ref.name])
                if status != "True":
                    waiting.append(
                        f"OpenModel/{ref.name}: {message}" if reason != "Loading" else message
                    )
                    failed = reason not in ("Loading", "NotClaimed")
                    if failed:
                        raise PlanningError(f"Model {ref.name} failed to load: {message}", reason)
        except PlanningError as err:
            self._write_service_status(svc, None, err.reason, str(err))
            return
        if waiting:
            self._write_service_status(svc, None, "ServiceInProgress", "; ".join(waiting))
            return
        stamp = f"{plan.template_hash()}:{plan.replicas}"
        if self._realised.get(key) != stamp:
            self._realised[key] = stamp
            await self.runtime.realise(plan)
        self._write_service_status(svc, plan, None, None)

    def _write_service_status(
        self, svc: Service, plan: WorkloadPlan | None, reason: str | None, message: str | None
    ) -> None:
        obj = self.store.get("Service", svc.name, svc.namespace)
        if obj is None:
            return
        before = obj.get("status") or {}
        gen = obj["metadata"].get("generation")
        conditions = before.get("conditions")
        replicas = ready = 0
        if plan is None:
            conditions = cond.set_condition(
                conditions, cond.PROGRESSING, True, "ServiceInProgress", message or "", gen
            )
            conditions = cond.set_condition(
                conditions, cond.AVAILABLE, False, reason or "ServiceNotReady", message or "", gen
            )
        else:
            status = self.runtime.status(plan.key)
            replicas = status.replicas if status else 0
            ready = status.ready if status else 0
            if status and ready >= plan.replicas and plan.replicas > 0:
                conditions = cond.set_condition(
                    conditions, cond.PROGRESSING, False, "ServiceReady", "", gen
                )
                conditions = cond.set_condition(
                    conditions,
                    cond.AVAILABLE,
                    True,
                    "ServiceReady",
                    f"{ready}/{plan.replicas} replicas ready",
                    gen,
                )
            else:
                why = status.reason if status and status.reason else "ServiceNotReady"
                text = (
                    status.message
                    if status and status.message
                    else f"{ready}/{plan.replicas} replicas ready"
                )
                conditions = cond.set_condition(
                    conditions, cond.PROGRESSING, True, "ServiceInProgress", text, gen
                )
                conditions = cond.set_condition(conditions, cond.AVAILABLE, False, why, text, gen)
        labels = {}
        tmpl = svc.spec.workload_template.worker_template
        if tmpl.metadata and tmpl.metadata.labels:
            labels = tmpl.metadata.labels
        selector = ",".join(
            f"{k}={v}"
            for k, v in sorted(labels.items())
            if k.startswith("llmaz.io/") or k.startswith("inference.llmaz.io/service")
        )
        new = {
            **before,
            "conditions": conditions,
            "replicas": replicas,
            "readyReplicas": ready,
            "selector": selector,
        }
        if new != before:
            self.store.update_status("Service", svc.name, svc.namespace, new)
            old = cond.get_condition(obj, cond.AVAILABLE)
            new_available = next(c for c in conditions if c["type"] == cond.AVAILABLE)
            if old is None or old.get("reason") != new_available["reason"]:
                record_event(
                    self.store,
                    obj,
                    new_available["reason"],
                    new_available["message"],
                    "Normal"
                    if new_available["status"] == "True"
                    or new_available["reason"] in ("ServiceInProgress", "ServiceNotReady")
                    else "Warning",
                )
