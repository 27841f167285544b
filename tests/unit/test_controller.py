"""The embedded controller (``llmplane.controlplane.controller.Controller``) on a real SQLite
store, with a fake runtime: the runtime is the seam (``llmplane.runtime.base.Runtime``), and a
recording stand-in lets a test say exactly what the substrate reports (ready replicas, a
failure) and see exactly what the controller asked of it, without starting engines. The real
runtimes have their own tests (test_runtime_local, test_kube_runtime, test_up)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llmplane.controlplane.controller import Controller
from llmplane.controlplane.plan import WorkloadPlan
from llmplane.runtime.base import Runtime
from llmplane.runtime.endpoint import Endpoint
from llmplane.store.sqlite import SQLiteStore
from llmplane.testing import eventually
from llmplane.up import install_builtins

KEY = "default/tiny"


@dataclass
class Reported:
    """A ``RuntimeStatus``."""

    replicas: int = 0
    ready: int = 0
    reason: str | None = "Starting"
    message: str = ""


@dataclass
class FakeRuntime:
    """Records what the controller asks; reports what the test sets in ``reported``."""

    realised: list[WorkloadPlan] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    reported: dict[str, Reported] = field(default_factory=dict)
    fail_realise: Exception | None = None

    async def realise(self, plan: WorkloadPlan) -> None:
        if self.fail_realise is not None:
            err, self.fail_realise = self.fail_realise, None
            raise err
        self.realised.append(plan)
        self.reported.setdefault(plan.key, Reported(plan.replicas))

    async def remove(self, key: str) -> None:
        self.removed.append(key)
        self.reported.pop(key, None)

    def status(self, key: str) -> Reported | None:
        return self.reported.get(key)

    def endpoints(self, selector: Mapping[str, str] | None = None) -> list[Endpoint]:
        return []


def openmodel(uri: str = "host:///dev/null") -> dict[str, Any]:
    return {
        "apiVersion": "llmaz.io/v1alpha1",
        "kind": "OpenModel",
        "metadata": {"name": "tiny"},
        "spec": {"familyName": "tiny", "source": {"uri": uri}},
    }


def playground(replicas: int = 2, model: str = "tiny", backend: str = "sim") -> dict[str, Any]:
    return {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Playground",
        "metadata": {"name": "tiny", "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "modelClaim": {"modelName": model},
            "backendRuntimeConfig": {"backendName": backend},
        },
    }


def condition(store: SQLiteStore, kind: str, type_: str, name: str = "tiny") -> dict[str, Any]:
    obj = store.get(kind, name, None if kind == "OpenModel" else "default") or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), {})


def events(store: SQLiteStore) -> list[tuple[str, str]]:
    return [(e["reason"], e["type"]) for e in store.list("Event")]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "db.sqlite")
    install_builtins(s)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
async def controller(store: SQLiteStore, tmp_path: Path) -> AsyncIterator[Controller]:
    ctl = Controller(store, FakeRuntime(), tmp_path / "cache")
    try:
        yield ctl
    finally:
        ctl.loads.cancel()


async def passes_until(ctl: Controller, check: Any, what: str) -> Any:
    """Reconcile until ``check()`` holds (model loads finish in the background)."""

    async def one_pass() -> Any:
        await ctl.reconcile()
        return check()

    return await eventually(one_pass, what=what)


def test_the_fake_is_a_runtime() -> None:
    assert isinstance(FakeRuntime(), Runtime)


async def test_a_playground_becomes_a_service_a_plan_and_ready_status(store, controller) -> None:
    runtime: FakeRuntime = controller.runtime  # type: ignore[assignment]
    store.apply(openmodel())
    store.apply(playground(replicas=2))
    await passes_until(controller, lambda: runtime.realised, "the plan realised")
    assert condition(store, "OpenModel", "Ready")["status"] == "True"
    service = store.get("Service", "tiny", "default")
    assert service is not None
    [owner] = service["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Playground", "tiny")
    [plan] = runtime.realised
    assert (plan.key, plan.replicas, plan.backend, plan.model_name) == (KEY, 2, "sim", "tiny")
    # Realised, not ready yet: in progress, not available.
    assert condition(store, "Playground", "Available").get("status") != "True"
    assert condition(store, "Service", "Available").get("status") != "True"

    runtime.reported[KEY] = Reported(replicas=2, ready=2, reason=None)
    await controller.reconcile()
    assert condition(store, "Service", "Available")["status"] == "True"
    available = condition(store, "Playground", "Available")
    assert available["status"] == "True" and available["reason"] == "PlaygroundReady"
    assert store.get("Playground", "tiny", "default")["status"]["replicas"] == 2
    assert ("PlaygroundReady", "Normal") in events(store)
    assert ("ServiceCreated", "Normal") in events(store)


async def test_realise_only_when_the_plan_changes(store, controller) -> None:
    runtime: FakeRuntime = controller.runtime  # type: ignore[assignment]
    store.apply(openmodel())
    store.apply(playground(replicas=2))
    await passes_until(controller, lambda: runtime.realised, "the plan realised")
    for _ in range(3):
        await controller.reconcile()
    assert len(runtime.realised) == 1  # idempotent passes do not touch the runtime
    store.apply(playground(replicas=1))
    await controller.reconcile()
    assert [p.replicas for p in runtime.realised] == [2, 1]


async def test_deleting_the_playground_removes_service_and_workload(store, controller) -> None:
    runtime: FakeRuntime = controller.runtime  # type: ignore[assignment]
    store.apply(openmodel())
    store.apply(playground())
    await passes_until(controller, lambda: runtime.realised, "the plan realised")
    store.delete("Playground", "tiny", "default")
    await controller.reconcile()
    assert store.get("Service", "tiny", "default") is None  # its owner is gone
    assert runtime.removed == [KEY]
    await controller.reconcile()
    assert runtime.removed == [KEY]  # once


async def test_a_runtime_failure_shows_as_the_cause(store, controller) -> None:
    runtime: FakeRuntime = controller.runtime  # type: ignore[assignment]
    store.apply(openmodel())
    store.apply(playground(replicas=1))
    await passes_until(controller, lambda: runtime.realised, "the plan realised")
    hint = "text-generation-inference is not installed"
    runtime.reported[KEY] = Reported(1, 0, "EngineNotInstalled", hint)
    await controller.reconcile()
    for kind in ("Service", "Playground"):
        available = condition(store, kind, "Available")
        assert (available["status"], available["reason"]) == ("False", "EngineNotInstalled")
        assert hint in available["message"]
    # Progress is not a failure: Starting keeps it in progress, without a cause.
    runtime.reported[KEY] = Reported(1, 0, "Starting", "")
    await controller.reconcile()
    assert condition(store, "Playground", "Available").get("reason") != "EngineNotInstalled"


async def test_a_playground_without_its_model_waits(store, controller) -> None:
    runtime: FakeRuntime = controller.runtime  # type: ignore[assignment]
    store.apply(playground(model="absent"))
    await controller.reconcile()
    progressing = condition(store, "Playground", "Progressing")
    assert progressing["reason"] == "AbortProcessing"
    assert "Waiting for model creation" in progressing["message"]
    assert store.get("Service", "tiny", "default") is None and runtime.realised == []


async def test_an_unknown_backend_is_named(store, controller) -> None:
    store.apply(openmodel())
    store.apply(playground(backend="nope"))
    await controller.reconcile()
    progressing = condition(store, "Playground", "Progressing")
    assert progressing["reason"] == "AbortProcessing"
    assert "BackendRuntime nope" in progressing["message"]
    assert "known: llamacpp" in progressing["message"]  # and what there is
    assert ("AbortProcessing", "Warning") in events(store)


async def test_a_model_that_fails_to_load_starts_nothing(store, controller) -> None:
    runtime: FakeRuntime = controller.runtime  # type: ignore[assignment]
    store.apply(openmodel("host:///no/such/model.gguf"))
    store.apply(playground())
    await passes_until(
        controller,
        lambda: condition(store, "OpenModel", "Ready").get("reason") == "NotFound",
        "the load to fail",
    )
    assert "/no/such/model.gguf" in condition(store, "OpenModel", "Ready")["message"]
    await controller.reconcile()
    available = condition(store, "Playground", "Available")
    assert available["status"] == "False" and "failed to load" in available["message"]
    assert runtime.realised == []


@contextlib.asynccontextmanager
async def running(ctl: Controller) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(ctl.run())
    try:
        yield task
    finally:
        task.cancel()
        # A lost cancellation (Python 3.11's wait_for swallowed one that arrived as the loop
        # was woken) would keep the loop running: up's shutdown would never end.
        done, _ = await asyncio.wait([task], timeout=10)
        assert done, "the control loop did not stop when cancelled"


async def test_the_loop_follows_store_changes_and_survives_a_failing_pass(store, tmp_path) -> None:
    runtime = FakeRuntime(fail_realise=RuntimeError("the substrate broke"))
    ctl = Controller(store, runtime, tmp_path / "cache", resync_seconds=60)
    async with running(ctl) as task:
        store.apply(openmodel())
        store.apply(playground(replicas=2))
        # The first realise raises: the pass fails, the loop goes on and retries on the next
        # event (the model load finishing, a status write) - not after the 60 s resync.
        await eventually(lambda: runtime.realised, what="the plan realised after the failure")
        assert not task.done()
        store.apply(playground(replicas=3))  # a change made elsewhere: the watch kicks a pass
        await eventually(
            lambda: runtime.realised[-1].replicas == 3, what="the new replica count realised"
        )


# Ownership between a Playground and its Service: the rules the operator follows on Kubernetes
# (planning.name_taken; garbage collection by owner uid, before the Playgrounds are planned).


def user_service() -> dict[str, Any]:
    return {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Service",
        "metadata": {"name": "tiny", "namespace": "default"},
        "spec": {
            "modelClaims": {"models": [{"name": "tiny"}]},
            "workloadTemplate": {
                "workerTemplate": {"spec": {"containers": [{"name": "model-runner", "image": "x"}]}}
            },
        },
    }


async def test_a_playground_never_takes_over_a_service_it_does_not_own(store, controller) -> None:
    store.apply(openmodel())
    store.apply(user_service())
    before = store.get("Service", "tiny", "default")
    store.apply(playground())
    await controller.reconcile()
    aborted = condition(store, "Playground", "Progressing")
    assert (aborted["status"], aborted["reason"]) == ("False", "AbortProcessing")
    assert "existing Service" in aborted["message"]
    after = store.get("Service", "tiny", "default")
    assert after["spec"] == before["spec"] and "ownerReferences" not in after["metadata"]


async def test_a_recreated_playground_gets_a_new_service(store, controller) -> None:
    runtime: FakeRuntime = controller.runtime  # type: ignore[assignment]
    store.apply(openmodel())
    store.apply(playground())
    await passes_until(controller, lambda: runtime.realised, "the plan realised")
    old_uid = store.get("Playground", "tiny", "default")["metadata"]["uid"]
    store.delete("Playground", "tiny", "default")
    store.apply(playground())  # same name, new uid, before the controller saw the delete
    await controller.reconcile()
    service = store.get("Service", "tiny", "default")
    assert service is not None
    [owner] = service["metadata"]["ownerReferences"]
    new_uid = store.get("Playground", "tiny", "default")["metadata"]["uid"]
    assert owner["uid"] == new_uid != old_uid
    progressing = condition(store, "Playground", "Progressing")
    assert progressing["reason"] != "AbortProcessing"
    assert runtime.removed == []  # the same plan: the engines keep running


async def test_a_disaggregated_playground_runs_roles_and_switches_back(store, controller) -> None:
    runtime: FakeRuntime = controller.runtime  # type: ignore[assignment]
    store.apply(openmodel())
    pd = playground()
    del pd["spec"]["replicas"]
    pd["spec"]["llmplane"] = {"disaggregation": {"prefill": {"replicas": 1}, "decode": {}}}
    store.apply(pd)
    await passes_until(controller, lambda: len(runtime.realised) == 2, "both roles realised")
    plans = {p.key: p for p in runtime.realised}
    assert set(plans) == {f"{KEY}-prefill", f"{KEY}-decode"}
    assert store.get("Service", "tiny", "default") is None
    # Only prefill ready: the Playground names decode.
    runtime.reported[f"{KEY}-prefill"] = Reported(replicas=1, ready=1, reason=None)
    await controller.reconcile()
    available = condition(store, "Playground", "Available")
    assert available.get("status") != "True"
    assert available.get("message", "").startswith("decode not ready"), available
    runtime.reported[f"{KEY}-decode"] = Reported(replicas=1, ready=1, reason=None)
    await controller.reconcile()
    assert condition(store, "Playground", "Available")["status"] == "True"
    assert (controller.kv_dir / "default" / "tiny").is_dir()  # the shared KV directory

    store.apply(playground(replicas=1))  # back to one workload
    await controller.reconcile()
    await controller.reconcile()
    assert store.get("Service", "tiny", "default") is not None
    assert store.get("Service", "tiny-prefill", "default") is None
    assert sorted(runtime.removed) == [f"{KEY}-decode", f"{KEY}-prefill"]


async def test_objectives_and_rewrites_are_accepted_once_their_pool_exists(store, controller):
    def obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "llm-d.ai/v1alpha2",
            "kind": kind,
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"poolRef": {"name": "pool"}, **spec},
        }

    store.apply(obj("InferenceObjective", "o", {"priority": 3}))
    store.apply(obj("InferenceModelRewrite", "r", {"rules": [{"matches": []}]}))
    await controller.reconcile()
    for kind, name in (("InferenceObjective", "o"), ("InferenceModelRewrite", "r")):
        accepted = condition(store, kind, "Accepted", name)
        assert (accepted["status"], accepted["reason"]) == ("Unknown", "Pending")
        assert "'pool' does not exist" in accepted["message"]
    store.apply(
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "pool", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 1}]},
        }
    )
    await controller.reconcile()
    for kind, name in (("InferenceObjective", "o"), ("InferenceModelRewrite", "r")):
        accepted = condition(store, kind, "Accepted", name)
        assert (accepted["status"], accepted["reason"]) == ("True", "Accepted")
