"""The status functions both substrates write with (llmplane.controlplane.status).

Pure functions: these tests call them directly, with the inputs the embedded controller and the
operator give them, and check llmaz's conditions and reasons.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmplane.controlplane.status import (
    WorkloadState,
    model_status,
    playground_status,
    same_status,
    service_cause,
    service_status,
)


def cond(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)


def summary(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions") or []}


def svc_obj(status: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "Service", "metadata": {"name": "s"}, "status": status}


# --- Service -------------------------------------------------------------------------------------


def test_service_progressing_without_available_until_first_ready() -> None:
    status = service_status(None, 1, None)
    assert summary(status) == {"Progressing": ("True", "ServiceInProgress")}
    assert (status["replicas"], status["readyReplicas"]) == (0, 0)
    assert cond(status, "Progressing")["observedGeneration"] == 1


def test_service_ready_then_not_ready() -> None:
    ready = service_status(None, 1, WorkloadState(True, 2, 2, "app=x"))
    assert summary(ready) == {
        "Available": ("True", "ServiceReady"),
        "Progressing": ("False", "ServiceReady"),
    }
    assert ready["selector"] == "app=x" and ready["readyReplicas"] == 2
    lost = service_status(ready, 1, WorkloadState(False, 2, 1, "app=x", message="1/2 ready"))
    assert summary(lost) == {
        "Available": ("False", "ServiceNotReady"),
        "Progressing": ("True", "ServiceInProgress"),
    }
    assert cond(lost, "Progressing")["message"] == "1/2 ready"


def test_service_planning_error_is_progressing_false_on_both_substrates() -> None:
    # Was: embedded Progressing=True + Available=False, operator Progressing=False.
    status = service_status(None, 3, None, ("AbortProcessing", "no such backend"))
    assert summary(status) == {"Progressing": ("False", "AbortProcessing")}
    assert cond(status, "Progressing")["message"] == "no such backend"
    # Available stays as it was (the running workload is not touched by a planning error).
    ready = service_status(None, 1, WorkloadState(True, 1, 1))
    broken = service_status(ready, 2, None, ("NotFound", "Model m failed to load"))
    assert summary(broken) == {
        "Available": ("True", "ServiceReady"),
        "Progressing": ("False", "NotFound"),
    }


def test_service_failure_cause_goes_to_available_at_once() -> None:
    status = service_status(
        None, 1, WorkloadState(reason="EngineNotInstalled", message="install it")
    )
    assert summary(status) == {
        "Progressing": ("True", "ServiceInProgress"),
        "Available": ("False", "EngineNotInstalled"),
    }
    assert cond(status, "Available")["message"] == "install it"


@pytest.mark.parametrize("reason", ["ServiceNotReady", "ServiceInProgress", ""])
def test_generic_reasons_are_not_causes(reason: str) -> None:
    status = service_status(None, 1, WorkloadState(reason=reason))
    assert "Available" not in summary(status)


def test_transition_time_moves_only_with_the_status() -> None:
    first = service_status(None, 1, WorkloadState(message="loading 10%"))
    first["conditions"][0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    again = service_status(first, 1, WorkloadState(message="loading 50%"))
    assert cond(again, "Progressing")["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    ready = service_status(again, 1, WorkloadState(True, 1, 1))
    assert cond(ready, "Progressing")["lastTransitionTime"] != "2020-01-01T00:00:00Z"


def test_functions_do_not_mutate_and_are_idempotent() -> None:
    current = service_status(None, 1, WorkloadState(True, 1, 1))
    snapshot = repr(current)
    again = service_status(current, 1, WorkloadState(True, 1, 1))
    assert repr(current) == snapshot
    assert same_status(current, again)


# --- Playground ----------------------------------------------------------------------------------


def test_new_playground_is_pending_on_both_substrates() -> None:
    # Was: PlaygroundInProgress embedded, Pending under the operator.
    assert summary(playground_status(None, 1, None)) == {"Progressing": ("True", "Pending")}
    svc = svc_obj(service_status(None, 1, WorkloadState(message="starting")))
    status = playground_status(None, 1, svc)
    assert summary(status) == {"Progressing": ("True", "Pending")}
    assert cond(status, "Progressing")["observedGeneration"] == 1


def test_playground_ready_mirrors_the_service() -> None:
    svc = svc_obj(service_status(None, 1, WorkloadState(True, 2, 2, "app=x")))
    status = playground_status(None, 4, svc)
    assert summary(status) == {
        "Available": ("True", "PlaygroundReady"),
        "Progressing": ("False", "PlaygroundReady"),
    }
    assert (status["replicas"], status["readyReplicas"], status["selector"]) == (2, 2, "app=x")
    assert cond(status, "Available")["observedGeneration"] == 4


def test_playground_in_progress_after_it_was_ready() -> None:
    ready_svc = svc_obj(service_status(None, 1, WorkloadState(True, 1, 1)))
    ready = playground_status(None, 1, ready_svc)
    lost_svc = svc_obj(service_status(ready_svc["status"], 1, WorkloadState(False, 1, 0)))
    status = playground_status(ready, 1, lost_svc)
    assert summary(status) == {
        "Available": ("False", "PlaygroundNotReady"),
        "Progressing": ("True", "PlaygroundInProgress"),
    }


def test_playground_abort_sets_only_progressing() -> None:
    status = playground_status(None, 2, None, "Waiting for model creation")
    assert summary(status) == {"Progressing": ("False", "AbortProcessing")}
    assert cond(status, "Progressing")["message"] == "Waiting for model creation"
    ready = playground_status(None, 1, svc_obj(service_status(None, 1, WorkloadState(True))))
    aborted = playground_status(ready, 2, None, "backend gone")
    assert summary(aborted)["Available"] == ("True", "PlaygroundReady")
    assert summary(aborted)["Progressing"] == ("False", "AbortProcessing")


@pytest.mark.parametrize(
    ("svc_status", "cause"),
    [
        (service_status(None, 1, None, ("NotFound", "Model m failed to load")), "NotFound"),
        (service_status(None, 1, WorkloadState(reason="CrashLoopBackOff")), "CrashLoopBackOff"),
    ],
)
def test_playground_shows_the_service_cause(svc_status: dict[str, Any], cause: str) -> None:
    status = playground_status(None, 1, svc_obj(svc_status))
    assert summary(status) == {
        "Progressing": ("True", "PlaygroundInProgress"),
        "Available": ("False", cause),
    }
    assert service_cause(svc_obj(svc_status))[0] == cause


def test_no_cause_while_progressing_or_ready() -> None:
    assert service_cause(None) is None
    assert service_cause(svc_obj(service_status(None, 1, WorkloadState()))) is None
    assert service_cause(svc_obj(service_status(None, 1, WorkloadState(True)))) is None


# --- OpenModel -----------------------------------------------------------------------------------


def test_model_ready_condition() -> None:
    loading = model_status(None, 1, "False", "Loading", "Loading model files: 10%")
    assert summary(loading) == {"Ready": ("False", "Loading")}
    loaded = model_status(loading, 1, "True", "Loaded", "Model files at /m")
    assert summary(loaded) == {"Ready": ("True", "Loaded")}
    assert cond(loaded, "Ready")["message"] == "Model files at /m"
