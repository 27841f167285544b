"""The embedded control loop: store changes -> planning -> runtime -> status back in the store.

Level-triggered like a Kubernetes controller: any change (a store event, a runtime state change,
a model download step, a periodic resync) marks the world dirty and one pass reconciles every
OpenModel, Playground and Service. At one machine's scale a full pass costs milliseconds, and
it can never miss an edge.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from llmplane.aio import wait_event
from llmplane.api.inference import BackendRuntime, Playground, Service
from llmplane.api.llmaz import OpenModel
from llmplane.controlplane import conditions as cond
from llmplane.controlplane.disaggregation import (
    ROLES,
    role_service_name,
    roles_status,
    service_names,
    services_for,
)
from llmplane.controlplane.events import EVENT_KIND, record_event
from llmplane.controlplane.loads import ModelLoads
from llmplane.controlplane.plan import BACKEND_LABEL, WorkloadPlan
from llmplane.controlplane.planning import (
    Inputs,
    PlanningError,
    claims_of,
    missing_inputs,
    name_taken,
    plan_service,
    service_for_playground,
)
from llmplane.controlplane.status import (
    ABORT_PROCESSING,
    PLAYGROUND_READY,
    SERVICE_IN_PROGRESS,
    SERVICE_NOT_READY,
    WorkloadState,
    model_status,
    playground_status,
    pool_ref_statuses,
    same_status,
    service_status,
)
from llmplane.quiet import QuietRetries
from llmplane.runtime.base import PROGRESS_REASONS, Runtime, RuntimeStatus
from llmplane.store.base import Store, StoreUnavailable

log = logging.getLogger("llmplane.controller")


class Controller:
    """Reconciles the store's llmaz resources onto a runtime and writes their status."""

    def __init__(
        self, store: Store, runtime: Runtime, cache_dir: Path, resync_seconds: float = 5.0
    ):
        self.store = store
        self.runtime = runtime
        self.resync_seconds = resync_seconds
        self._dirty = asyncio.Event()
        self.loads = ModelLoads(cache_dir, self.kick)
        self.kv_dir = cache_dir / "kv"  # shared-storage KV connectors: one directory per Playground
        self._realised: dict[str, str] = {}  # service key -> plan template hash + replicas
        self._store_trouble = QuietRetries(log, "reconciling (writing status to the store)")

    def kick(self) -> None:
        self._dirty.set()

    async def run(self) -> None:
        watcher = asyncio.create_task(self._watch())
        try:
            while True:
                await wait_event(self._dirty, self.resync_seconds)  # cancellation-safe
                self._dirty.clear()
                await asyncio.sleep(0.02)  # coalesce bursts of events
                try:
                    await self.reconcile()
                except StoreUnavailable as err:  # disk full, locked: the next pass retries
                    self._store_trouble.failed(err)
                except Exception:  # a bug must not stop the control loop
                    log.exception("reconcile failed")
                else:
                    self._store_trouble.succeeded()
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
        # Garbage-collect first, by owner uid as Kubernetes does: a Service whose Playground is
        # gone (or was recreated) goes, so a new Playground of the same name finds none.
        owners = {pg.metadata.uid for pg in playgrounds}
        for svc in self._objects("Service", Service):
            owner = next(
                (o for o in svc.metadata.owner_references or [] if o.kind == "Playground"), None
            )
            if owner is not None and owner.uid not in owners:
                self.store.delete("Service", svc.name, svc.namespace)

        claimed: set[str] = set()
        aborted = set()
        for pg in playgrounds:
            claims = claims_of(pg)
            claimed.update(m.name for m in claims.models)
            if not self._reconcile_playground(pg, models, backends):
                aborted.add((pg.namespace, pg.name))

        services = self._objects("Service", Service)
        for svc in services:
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

        self._write_pool_ref_statuses()

        # Playground status mirrors its Service (written after the Service pass).
        for pg in playgrounds:
            if (pg.namespace, pg.name) not in aborted:
                self._write_playground_status(pg)

    # --- writing status (the functions in status.py decide it; this only stores it) ---------

    def _write_status(
        self, obj: dict[str, Any], new: dict[str, Any], condition: str
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """Store ``new`` as ``obj``'s status when it differs; (condition before, after) then,
        else (None, None)."""
        before = obj.get("status") or {}
        if same_status(before, new):
            return None, None
        meta = obj["metadata"]
        self.store.update_status(obj["kind"], meta["name"], meta.get("namespace"), new)
        old = cond.get_condition(obj, condition)
        return old, cond.get_condition({"status": new}, condition)

    def _write_pool_ref_statuses(self) -> None:
        """``Accepted`` on InferenceObjectives and InferenceModelRewrites (status.py)."""
        pools = {
            (o["metadata"].get("namespace") or "default", o["metadata"]["name"])
            for o in self.store.list("InferencePool")
        }
        objects = [
            *self.store.list("InferenceObjective"),
            *self.store.list("InferenceModelRewrite"),
        ]
        for obj, new in pool_ref_statuses(objects, pools):
            meta = obj["metadata"]
            self.store.update_status(obj["kind"], meta["name"], meta.get("namespace"), new)

    # --- OpenModel ----------------------------------------------------------------------------

    def _write_model_status(self, model: OpenModel) -> None:
        obj = self.store.get("OpenModel", model.name)
        if obj is None:
            return
        ready, reason, message = self.loads.state(model)
        generation = obj["metadata"].get("generation")
        new = model_status(obj.get("status"), generation, ready, reason, message)
        old, now = self._write_status(obj, new, cond.READY)
        if now is not None and (old is None or old.get("reason") != reason):
            warn = ready == "False" and reason != "Loading"
            record_event(self.store, obj, reason, message, "Warning" if warn else "Normal")

    # --- Playground ---------------------------------------------------------------------------

    def _reconcile_playground(
        self, pg: Playground, models: dict[str, OpenModel], backends: dict[str, BackendRuntime]
    ) -> bool:
        """Create or update the Playground's Service; False when it cannot (status says why)."""
        backend = backends.get(pg.spec.backend_runtime_config.backend_name)
        names = service_names(pg)
        existing = {n: self.store.get("Service", n, pg.namespace) for n in names}
        abort = next((t for t in (name_taken(pg, e) for e in existing.values()) if t), None)
        abort = abort or missing_inputs(pg, models, backend, known_backends=backends)
        if abort is None and backend is not None:
            kv_path = self.kv_dir / (pg.namespace or "default") / pg.name
            try:
                services = services_for(
                    pg,
                    lambda p: service_for_playground(Inputs(p, models, backend), self.loads.path),
                    str(kv_path),
                )
            except PlanningError as err:
                abort = str(err)
            else:
                if pg.spec.disaggregation is not None:
                    kv_path.mkdir(parents=True, exist_ok=True)
        if abort is not None or backend is None:
            self._write_playground_status(pg, abort=abort)
            return False
        self._drop_other_services(pg, set(names))
        owner = self.store.get("Playground", pg.name, pg.namespace)
        for service in services:
            desired = service.to_dict()
            desired.pop("status", None)
            self.store.apply(desired)  # a no-op when nothing changed
            if existing.get(service.name) is None and owner is not None:
                message = f"Created Service {service.name}"
                record_event(self.store, owner, "ServiceCreated", message)
        return True

    def _drop_other_services(self, pg: Playground, keep: set[str]) -> None:
        """Services the Playground owns under other names (it switched to or from roles)."""
        for obj in self.store.list("Service", pg.namespace):
            refs = obj["metadata"].get("ownerReferences") or []
            mine = any(r.get("controller") and r.get("uid") == pg.metadata.uid for r in refs)
            if mine and obj["metadata"]["name"] not in keep:
                self.store.delete("Service", obj["metadata"]["name"], pg.namespace)

    def _write_playground_status(self, pg: Playground, abort: str | None = None) -> None:
        obj = self.store.get("Playground", pg.name, pg.namespace)
        if obj is None:
            return
        generation = obj["metadata"].get("generation")
        if abort is None and pg.spec.disaggregation is not None:
            roles = {
                r: self.store.get("Service", role_service_name(pg.name, r), pg.namespace)
                for r in ROLES
            }
            new = roles_status(obj.get("status"), generation, roles)
        else:
            svc = None if abort else self.store.get("Service", pg.name, pg.namespace)
            new = playground_status(obj.get("status"), generation, svc, abort)
        old, now = self._write_status(obj, new, cond.AVAILABLE)
        if abort is not None and not same_status(obj.get("status"), new):
            record_event(self.store, obj, ABORT_PROCESSING, abort, "Warning")
        elif now and now.get("status") == "True" and not (old and old.get("status") == "True"):
            record_event(self.store, obj, PLAYGROUND_READY, "All replicas are ready")

    # --- Service ------------------------------------------------------------------------------

    async def _reconcile_service(
        self, svc: Service, models: dict[str, OpenModel], backends: dict[str, BackendRuntime]
    ) -> None:
        key = f"{svc.namespace}/{svc.name}"
        labels = _template_labels(svc)
        backend = backends.get(labels.get(BACKEND_LABEL, ""))
        local_command = list(backend.spec.local.command) if backend and backend.spec.local else None
        selector = ",".join(
            f"{k}={v}"
            for k, v in sorted(labels.items())
            if k.startswith("llmaz.io/") or k.startswith("inference.llmaz.io/service")
        )
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
            self._write_service_status(svc, None, (err.reason, str(err)))
            return
        if waiting:
            state = WorkloadState(selector=selector, message="; ".join(waiting))
            self._write_service_status(svc, state)
            return
        stamp = f"{plan.template_hash()}:{plan.replicas}"
        if self._realised.get(key) != stamp:
            self._realised[key] = ""  # the runtime may hold some of it: removed with the rest
            await self.runtime.realise(plan)
            self._realised[key] = stamp  # only now: a realise that raised is tried again
        self._write_service_status(svc, workload_state(plan, self.runtime.status(key), selector))

    def _write_service_status(
        self, svc: Service, state: WorkloadState | None, error: tuple[str, str] | None = None
    ) -> None:
        obj = self.store.get("Service", svc.name, svc.namespace)
        if obj is None:
            return
        new = service_status(obj.get("status"), obj["metadata"].get("generation"), state, error)
        has_available = cond.get_condition({"status": new}, cond.AVAILABLE) is not None
        headline = cond.AVAILABLE if error is None and has_available else cond.PROGRESSING
        old, now = self._write_status(obj, new, headline)
        if now is not None and (old is None or old.get("reason") != now["reason"]):
            quiet = now["status"] == "True" or now["reason"] in (
                SERVICE_IN_PROGRESS,
                SERVICE_NOT_READY,
            )
            record_event(
                self.store, obj, now["reason"], now["message"], "Normal" if quiet else "Warning"
            )


def _template_labels(svc: Service) -> dict[str, str]:
    meta = svc.spec.workload_template.worker_template.metadata
    return dict(meta.labels or {}) if meta else {}


def workload_state(
    plan: WorkloadPlan, status: RuntimeStatus | None, selector: str | None = None
) -> WorkloadState:
    """What a runtime reports of a realised plan, as the status functions take it: available
    once every wanted replica is ready; a cause only for a failure, not for progress."""
    replicas = status.replicas if status else 0
    ready = status.ready if status else 0
    available = status is not None and plan.replicas > 0 and ready >= plan.replicas
    reason = status.reason if status else None
    cause = reason if reason and reason not in PROGRESS_REASONS else None
    message = (status.message if status else "") or (
        f"{ready}/{plan.replicas} replicas ready" if plan.replicas else "scaled to zero: no replica"
    )
    return WorkloadState(available, replicas, ready, selector, cause, message)
