"""The embedded autoscaler's loop (controlplane/autoscaler.py) over a real SQLite store: window
averaging, the write to spec.replicas with its Event, and never overwriting a concurrent edit.
The signals come from a plain in-memory source (the gateway's is tested end to end in
tests/integration/test_up_autoscale.py)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from llmplane.api.documents import dump_resource, parse_text
from llmplane.controlplane.autoscaler import RESCALE, Autoscaler, AutoscalerConfig, average
from llmplane.controlplane.events import events_for
from llmplane.store.sqlite import SQLiteStore
from llmplane.up import install_builtins

PG = """
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {name: tiny}
spec:
  familyName: tiny
  source: {uri: "host:///dev/null"}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {name: tiny}
spec:
  replicas: 1
  modelClaim: {modelName: tiny}
  backendRuntimeConfig: {backendName: sim}
  elasticConfig:
    minReplicas: 1
    maxReplicas: 4
    scaleTrigger:
      hpa:
        metrics:
        - type: Pods
          pods:
            metric: {name: vllm:num_requests_waiting}
            target: {type: AverageValue, averageValue: 2}
"""


class Source:
    def __init__(self) -> None:
        self.values: dict[str, dict[str, float]] = {}
        self.seen = 0.0

    def replica_signals(self, workload: str) -> Mapping[str, Mapping[str, float]]:
        return dict(self.values)

    def requests_seen(self, workload: str) -> float:
        return self.seen

    def held(self, workload: str) -> int:
        return 0


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    s = SQLiteStore(tmp_path / "db.sqlite")
    install_builtins(s)
    s.apply_many([dump_resource(r) for r in parse_text(PG, "pg.yaml").resources])
    yield s
    s.close()


def replicas(store: Any) -> int:
    return store.get("Playground", "tiny", "default")["spec"]["replicas"]


def test_average_over_the_window_per_address() -> None:
    samples = deque([(1.0, {"a": {"waiting": 2.0}}), (2.0, {"a": {"waiting": 4.0}, "b": {}})])
    assert average(samples, {"a", "b"}) == {"a": {"waiting": 3.0}, "b": {}}
    assert average(samples, {"b"}) == {"b": {}}


def test_writes_spec_replicas_with_an_event_saying_why(store: Any) -> None:
    source, clock = Source(), Clock()
    scaler = Autoscaler(store, None, source, AutoscalerConfig(window=10), clock=clock)
    source.values = {"127.0.0.1:1": {"waiting": 1.0}}
    scaler.step()
    assert replicas(store) == 1  # on target
    source.values = {"127.0.0.1:1": {"waiting": 11.0}}
    clock.t += 1
    scaler.step()  # window mean (1 + 11) / 2 = 6 against 2: ceil(3.0)
    assert replicas(store) == 3
    events = [e for e in events_for(store, store.get("Playground", "tiny", "default"))]
    assert events[-1]["reason"] == RESCALE
    assert events[-1]["message"].startswith("New size: 3; reason: vllm:num_requests_waiting 6")
    assert scaler.reason("default/tiny").startswith("vllm:num_requests_waiting")


def test_old_samples_leave_the_window(store: Any) -> None:
    source, clock = Source(), Clock()
    scaler = Autoscaler(store, None, source, AutoscalerConfig(window=5), clock=clock)
    source.values = {"a": {"waiting": 100.0}}
    scaler.step()
    first = replicas(store)
    assert first == 4  # clamped to maxReplicas
    source.values = {f"r{i}": {"waiting": 2.0} for i in range(4)}
    clock.t += 6  # the 100 is out of the 5 s window
    scaler.step()
    assert replicas(store) == 4  # on target now, nothing to do


def test_a_concurrent_edit_is_not_overwritten(store: Any) -> None:
    source, clock = Source(), Clock()
    scaler = Autoscaler(store, None, source, AutoscalerConfig(), clock=clock)
    source.values = {"a": {"waiting": 10.0}}
    obj = store.get("Playground", "tiny", "default")
    original = scaler._scale

    def user_edits_first(*args: Any) -> None:
        edited = dict(obj)
        edited["spec"] = {**obj["spec"], "replicas": 2}
        edited.pop("status", None)
        store.apply(edited)
        original(*args)

    scaler._scale = user_edits_first  # type: ignore[method-assign]
    scaler.step()
    assert replicas(store) == 2  # the user's 2, not the autoscaler's 4


def test_the_embedded_runtimes_replica_ceiling_bounds_a_scale_up(
    store: Any, tmp_path: Path
) -> None:
    from llmplane.runtime.local import LocalRuntime

    obj = store.get("Playground", "tiny", "default")
    obj["spec"]["elasticConfig"].pop("maxReplicas")  # the autoscaler's own bound: 99999
    obj.pop("status", None)
    store.apply(obj)
    runtime = LocalRuntime(tmp_path / "state", gpus=[], max_replicas=3)
    source, clock = Source(), Clock()
    scaler = Autoscaler(store, runtime, source, AutoscalerConfig(), clock=clock)
    source.values = {"a": {"waiting": 1000.0}}
    scaler.step()
    assert replicas(store) == 3
    events = events_for(store, store.get("Playground", "tiny", "default"))
    assert "limited to 3 (this machine's ceiling)" in events[-1]["message"]
