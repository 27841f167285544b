"""The ``Runtime`` interface: what the control plane needs from a substrate to run workloads.

Planning (``controlplane/planning.py``) turns a Service into a ``WorkloadPlan``; a runtime
realises it and reports back. Two implementations: ``LocalRuntime`` (``runtime/local.py``,
supervised processes on this machine) and ``KubeRuntime`` (``runtime/kube/runtime.py``,
LeaderWorkerSets or Deployments applied through the API server).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from llmplane.controlplane.plan import WorkloadPlan
from llmplane.runtime.endpoint import Endpoint

# Reasons a runtime gives while a workload is on its way (a phase, not a failure).
PROGRESS_REASONS = frozenset({"Pending", "Starting", "NotReady", "Terminating"})


class RuntimeStatus(Protocol):
    """How a realised workload is doing.

    ``reason`` is None when every wanted replica is ready, one of ``PROGRESS_REASONS`` while
    it is getting there, else the cause that keeps it from being ready (``EngineNotInstalled``,
    ``CrashLoopBackOff`` ...); ``message`` says more.
    """

    @property
    def replicas(self) -> int: ...

    @property
    def ready(self) -> int: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def message(self) -> str: ...


@runtime_checkable
class Runtime(Protocol):
    """Realises workload plans, keyed by ``plan.key`` (``namespace/name``)."""

    async def realise(self, plan: WorkloadPlan) -> None:
        """Make the workload match ``plan`` (idempotent); returns once changes are under way."""
        ...

    async def remove(self, key: str) -> None:
        """Stop and delete the workload ``key``; nothing when there is none."""
        ...

    def status(self, key: str) -> RuntimeStatus | None:
        """The workload's last known status, or None when this runtime has none for ``key``."""
        ...

    def endpoints(self, selector: Mapping[str, str] | None = None) -> list[Endpoint]:
        """Ready replicas whose labels include every ``selector`` label."""
        ...
