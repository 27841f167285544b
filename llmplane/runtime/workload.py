"""One workload's replica set: scale, roll out a new template one replica at a time, report.

``Workload.reconcile()`` never waits: it starts and stops ``Replica`` objects (each supervises
one engine process, ``replica.py``) and is called again whenever a replica changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from llmplane.controlplane.plan import WorkloadPlan
from llmplane.runtime.capacity import ENV as CEILING_ENV
from llmplane.runtime.replica import Replica
from llmplane.runtime.status import (
    ENGINE_NOT_INSTALLED,
    FAILED,
    NO_LOCAL_COMMAND,
    OVER_REPLICA_CEILING,
    PENDING,
    READY,
    ReplicaStatus,
    WorkloadStatus,
    severity,
)

if TYPE_CHECKING:
    from llmplane.runtime.local import LocalRuntime

log = logging.getLogger("llmplane.runtime.local")


class Workload:
    """The replicas of one plan; ``reconcile()`` moves them towards the latest plan."""

    def __init__(self, runtime: LocalRuntime, plan: WorkloadPlan) -> None:
        self.runtime = runtime
        self.plan = plan
        self.live: list[Replica] = []  # serving or trying to; several per index mid-rollout
        self.terminating: list[Replica] = []
        self.stop_tasks: set[asyncio.Task[None]] = set()
        self.removed = False
        self._generation = 0
        self._reconcile_scheduled = False

    def changed(self) -> None:
        """A replica changed: tell the runtime's listener and reconcile again soon."""
        if not self._reconcile_scheduled and not self.removed:
            self._reconcile_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_reconcile)
        self.runtime.notify()

    def _scheduled_reconcile(self) -> None:
        self._reconcile_scheduled = False
        self.reconcile()

    def retry_missing_engines(self) -> None:
        current = self.plan.template_hash()
        for replica in self.live:
            if (
                replica.phase == FAILED
                and replica.reason == ENGINE_NOT_INSTALLED
                and replica.template_hash == current  # others are replaced by reconcile()
            ):
                replica.run()

    def reconcile(self) -> None:
        """Start and stop replicas (never waits); called on realise() and on replica changes."""
        if self.removed:
            return
        plan = self.plan
        if plan.local is None:
            for replica in sorted(self.live, key=lambda r: -r.index):
                self.stop(replica)
            return
        wanted = self.wanted()
        current = plan.template_hash()
        for replica in sorted(self.live, key=lambda r: -r.index):
            if replica.index >= wanted:
                self.stop(replica)

        by_index: dict[int, list[Replica]] = {}
        for replica in self.live:
            by_index.setdefault(replica.index, []).append(replica)
        # A rolling update replaces one index at a time: busy while a new replica is not yet
        # ready next to an old one that still serves.
        rolling = any(
            any(r.template_hash == current and r.phase != READY for r in rs)
            and any(r.template_hash != current and r.phase == READY for r in rs)
            for rs in by_index.values()
        )
        for index in range(wanted):
            replicas = sorted(by_index.get(index, []), key=lambda r: r.generation)
            new = [r for r in replicas if r.template_hash == current]
            old = [r for r in replicas if r.template_hash != current]
            for extra in new[:-1]:
                self.stop(extra)
            target = new[-1] if new else None
            serving = [r for r in old if r.phase == READY]
            keep = serving[-1] if serving and (target is None or target.phase != READY) else None
            for replica in old:
                if replica is not keep:
                    self.stop(replica)
            if target is None:
                if keep is None:
                    self.start(index)
                elif not rolling:
                    self.start(index)  # the surge replica; `keep` stops once it is ready
                    rolling = True

    def wanted(self) -> int:
        """Replicas to run: the plan's, at most the runtime's ceiling (``capacity.py``; what
        reached the store past ``apply``'s check and the autoscaler's)."""
        return min(self.plan.replicas, self.runtime.max_replicas)

    def start(self, index: int) -> None:
        self._generation += 1
        replica = Replica(self, index, self._generation, self.plan)
        self.live.append(replica)
        replica.run()

    def stop(self, replica: Replica) -> None:
        """Take a replica out of service now; drain and stop its process in the background."""
        if replica not in self.live:
            return
        self.live.remove(replica)
        self.terminating.append(replica)
        replica.begin_termination()
        task = asyncio.get_running_loop().create_task(replica.terminate())
        self.stop_tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self.stop_tasks.discard(t)
            with contextlib.suppress(ValueError):
                self.terminating.remove(replica)
            if not t.cancelled() and t.exception() is not None:
                log.error("stopping %s failed", replica.name, exc_info=t.exception())
            self.changed()

        task.add_done_callback(done)

    def status(self) -> WorkloadStatus:
        plan = self.plan
        wanted = plan.replicas
        if plan.local is None and not self.removed:
            items = [
                ReplicaStatus(
                    index=i,
                    phase=FAILED,
                    reason=NO_LOCAL_COMMAND,
                    message=f"backend {plan.backend!r} has no local command; "
                    "this workload can only run on Kubernetes",
                    restarts=0,
                    pid=None,
                    address=None,
                    log_path=self.runtime.log_path(plan.key, i),
                )
                for i in range(self.wanted())
            ]
            items += [r.status() for r in self.terminating]
        else:
            replicas = sorted(self.live + self.terminating, key=lambda r: (r.index, r.generation))
            items = [r.status() for r in replicas]
        current = plan.template_hash()
        ready = {r.index for r in self.live if r.phase == READY and r.index < wanted}
        updated = {r.index for r in self.live if r.template_hash == current and r.index < wanted}
        result = WorkloadStatus(
            replicas=0 if self.removed else wanted,
            ready=len(ready),
            items=items,
            updated=len(updated),
        )
        worst = max(items, key=severity, default=None)
        if wanted > self.wanted() and not self.removed:
            result.reason = OVER_REPLICA_CEILING
            result.message = (
                f"{wanted} replicas asked, {self.wanted()} run: this machine's limit is "
                f"{self.runtime.max_replicas} per object (set {CEILING_ENV} to change it)"
            )
        elif worst is not None and severity(worst) > 0:
            result.reason = worst.reason or worst.phase
            result.message = f"replica {worst.index}: {worst.message}" if worst.message else ""
        elif len(ready) < wanted:
            result.reason, result.message = PENDING, f"{len(ready)}/{wanted} replicas ready"
        return result
