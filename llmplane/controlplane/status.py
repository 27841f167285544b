"""Status of OpenModel, Playground, Service, InferenceObjective and InferenceModelRewrite: pure
functions both substrates write with.

The embedded controller (``controlplane/controller.py``) and the Kubernetes operator
(``controlplane/kube_reconciler.py``, driven by ``operator/``) observe different things (local replicas; LeaderWorkerSets and
Deployments) but turn them into a ``WorkloadState`` and then write exactly these statuses, so a
resource reads the same on both. The conditions are llmaz's:

- Service: ``Available`` True ``ServiceReady`` with ``Progressing`` False ``ServiceReady`` when
  the workload is available; else ``Progressing`` True ``ServiceInProgress`` and, once
  ``Available`` exists, ``Available`` False ``ServiceNotReady``. A planning error (a model that
  does not exist or failed to load, a backend that cannot run it) is ``Progressing`` False with
  the error's reason; ``Available`` is left as it was.
- Playground: ``Progressing`` True ``Pending`` until its Service has reported availability
  once, then ``PlaygroundInProgress`` while not available; ``Available`` True/False
  ``PlaygroundReady`` / ``PlaygroundNotReady``; ``Progressing`` False ``AbortProcessing`` when it
  cannot be processed (missing model or backend, a Service of the same name it does not own).

One llmplane addition, on both substrates: when the workload reports *why* it is not
available (``EngineNotInstalled``, ``CrashLoopBackOff``, a model that failed to load ...), that
reason and message go to the Service's and the Playground's ``Available`` condition at once,
instead of a generic ``NotReady`` (llmaz has no such causes to report).

InferenceObjective and InferenceModelRewrite (llm-d's): ``Accepted`` True ``Accepted`` when
the InferencePool their ``poolRef`` names exists (either group), else Unknown ``Pending`` saying
which pool is missing, as llm-d's router leaves them until it has the pool.

Every function returns a new status dict and never mutates its input; applying one twice with
the same inputs gives the same result (``lastTransitionTime`` moves only on a status change).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from llmplane.controlplane.conditions import AVAILABLE, PROGRESSING, READY, set_condition

SERVICE_READY = "ServiceReady"
SERVICE_NOT_READY = "ServiceNotReady"
SERVICE_IN_PROGRESS = "ServiceInProgress"
PLAYGROUND_READY = "PlaygroundReady"
PLAYGROUND_NOT_READY = "PlaygroundNotReady"
PLAYGROUND_IN_PROGRESS = "PlaygroundInProgress"
PENDING = "Pending"
ABORT_PROCESSING = "AbortProcessing"

# Reasons that say "not available yet" without a cause worth showing on Available.
_GENERIC = frozenset({"", SERVICE_READY, SERVICE_NOT_READY, SERVICE_IN_PROGRESS})


@dataclass(frozen=True)
class WorkloadState:
    """What a substrate observed of a Service's workload.

    ``reason``/``message``: why it is not available, when the substrate knows a cause
    (None: still progressing, nothing wrong). ``message`` alone describes the progress.
    """

    available: bool = False
    replicas: int = 0
    ready: int = 0
    selector: str | None = None
    reason: str | None = None
    message: str = ""


def _conditions(status: dict[str, Any]) -> list[dict[str, Any]]:
    return list(status.get("conditions") or [])


def _find(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def _true(conditions: list[dict[str, Any]], type_: str) -> bool:
    found = _find(conditions, type_)
    return bool(found and found.get("status") == "True")


def model_status(
    current: dict[str, Any] | None,
    generation: int | None,
    ready: str,
    reason: str,
    message: str,
) -> dict[str, Any]:
    """An OpenModel's status with its ``Ready`` condition (True / False / Unknown)."""
    status = copy.deepcopy(current or {})
    status["conditions"] = set_condition(
        status.get("conditions"), READY, ready, reason, message, generation
    )
    return status


def service_status(
    current: dict[str, Any] | None,
    generation: int | None,
    workload: WorkloadState | None,
    error: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """A Service's status from its workload (None: none exists yet) or a planning ``error``
    as (reason, message)."""
    status = copy.deepcopy(current or {})
    conditions = _conditions(status)
    if error is not None:
        reason, message = error
        status["conditions"] = set_condition(
            conditions, PROGRESSING, False, reason, message, generation
        )
        return status
    state = workload or WorkloadState()
    if state.available:
        message = "Inference Service is ready"
        conditions = set_condition(conditions, AVAILABLE, True, SERVICE_READY, message, generation)
        conditions = set_condition(
            conditions, PROGRESSING, False, SERVICE_READY, message, generation
        )
    else:
        progress = state.message or "Inference Service is progressing"
        conditions = set_condition(
            conditions, PROGRESSING, True, SERVICE_IN_PROGRESS, progress, generation
        )
        if state.reason and state.reason not in _GENERIC:
            conditions = set_condition(
                conditions, AVAILABLE, False, state.reason, state.message, generation
            )
        elif _find(conditions, AVAILABLE) is not None:
            conditions = set_condition(
                conditions,
                AVAILABLE,
                False,
                SERVICE_NOT_READY,
                state.message or "Waiting for the workload to be ready",
                generation,
            )
    status["conditions"] = conditions
    status["replicas"] = state.replicas
    status["readyReplicas"] = state.ready
    if state.selector:
        status["selector"] = state.selector
    return status


def service_cause(service: dict[str, Any] | None) -> tuple[str, str] | None:
    """(reason, message) of why a Service is not available, when it says more than "not yet":
    a planning error (Progressing False) or a workload failure (Available False)."""
    conditions = ((service or {}).get("status") or {}).get("conditions") or []
    for type_ in (PROGRESSING, AVAILABLE):
        found = _find(conditions, type_)
        if found and found.get("status") == "False" and found.get("reason", "") not in _GENERIC:
            return found["reason"], found.get("message", "")
    return None


def playground_status(
    current: dict[str, Any] | None,
    generation: int | None,
    service: dict[str, Any] | None,
    abort: str | None = None,
) -> dict[str, Any]:
    """A Playground's status from its Service object (None: not created yet), or ``abort``:
    why it cannot be processed."""
    status = copy.deepcopy(current or {})
    conditions = _conditions(status)
    if abort is not None:
        status["conditions"] = set_condition(
            conditions, PROGRESSING, False, ABORT_PROCESSING, abort, generation
        )
        return status
    svc_status = (service or {}).get("status") or {}
    if _true(svc_status.get("conditions") or [], AVAILABLE):
        message = "Playground is ready"
        conditions = set_condition(
            conditions, AVAILABLE, True, PLAYGROUND_READY, message, generation
        )
        conditions = set_condition(
            conditions, PROGRESSING, False, PLAYGROUND_READY, message, generation
        )
    else:
        cause = service_cause(service)
        started = cause is not None or _find(conditions, AVAILABLE) is not None
        if started:
            conditions = set_condition(
                conditions,
                PROGRESSING,
                True,
                PLAYGROUND_IN_PROGRESS,
                "Waiting for inference Service progressing",
                generation,
            )
            reason, message = cause or (PLAYGROUND_NOT_READY, "Waiting for inference Service ready")
            conditions = set_condition(conditions, AVAILABLE, False, reason, message, generation)
        else:
            conditions = set_condition(
                conditions,
                PROGRESSING,
                True,
                PENDING,
                "Waiting for inference Service ready",
                generation,
            )
    status["conditions"] = conditions
    status["replicas"] = int(svc_status.get("replicas") or 0)
    if svc_status.get("readyReplicas") is not None:
        status["readyReplicas"] = svc_status["readyReplicas"]
    if svc_status.get("selector"):
        status["selector"] = svc_status["selector"]
    return status


def same_status(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Equal but for ``lastTransitionTime`` (nothing worth writing changed)."""

    def strip(s: dict[str, Any] | None) -> dict[str, Any]:
        s = copy.deepcopy(s or {})
        for c in s.get("conditions") or []:
            c.pop("lastTransitionTime", None)
        return s

    return strip(a) == strip(b)


def pool_ref_status(
    status: dict[str, Any] | None, pool: str, pool_found: bool, generation: int | None
) -> dict[str, Any]:
    """An InferenceObjective's or InferenceModelRewrite's status given whether its pool exists."""
    new = copy.deepcopy(status or {})
    if pool_found:
        args: tuple[str, str, str] = ("True", "Accepted", f"InferencePool {pool!r} found")
    else:
        args = ("Unknown", "Pending", f"InferencePool {pool!r} does not exist (yet)")
    new["conditions"] = set_condition(
        new.get("conditions"), "Accepted", *args, generation=generation
    )
    return new


def pool_ref_statuses(
    objects: list[dict[str, Any]], pools: set[tuple[str, str]]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(object, its new status) of each InferenceObjective / InferenceModelRewrite whose status
    changes, given the (namespace, name) of every InferencePool."""
    out = []
    for obj in objects:
        meta = obj["metadata"]
        pool = ((obj.get("spec") or {}).get("poolRef") or {}).get("name")
        if not isinstance(pool, str):
            continue
        found = (meta.get("namespace") or "default", pool) in pools
        new = pool_ref_status(obj.get("status"), pool, found, meta.get("generation"))
        if not same_status(obj.get("status"), new):
            out.append((obj, new))
    return out
