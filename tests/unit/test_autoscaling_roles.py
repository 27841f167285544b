"""Per-role autoscaling of disaggregated Playgrounds: prefill scales on prompts queued for
prefill, decode on sequences being generated and KV use, each within its own bounds; the
embedded autoscaler writes each role's replicas. Signals come from a plain in-memory source,
as in test_autoscaler_loop.py."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from llmplane.api.documents import dump_resource, parse_text
from llmplane.api.inference import ElasticConfig
from llmplane.controlplane.autoscaler import RESCALE, Autoscaler, AutoscalerConfig
from llmplane.controlplane.autoscaling import (
    KV_USAGE,
    RUNNING,
    WAITING,
    History,
    ReplicaSignals,
    decide,
    role_trigger,
)
from llmplane.controlplane.events import events_for
from llmplane.store.sqlite import SQLiteStore
from llmplane.up import install_builtins

ELASTIC = ElasticConfig(min_replicas=1, max_replicas=6)

# Two prefill and two decode replicas under two bursts (per replica, averaged).
PROMPT_HEAVY = {  # long prompts, short answers: prompts queue for prefill
    "prefill": {WAITING: 7.0, RUNNING: 2.0, KV_USAGE: 0.3},
    "decode": {WAITING: 0.0, RUNNING: 6.0, KV_USAGE: 0.2},
}
DECODE_HEAVY = {  # short prompts, long answers: many sequences decoding, KV filling up
    "prefill": {WAITING: 0.0, RUNNING: 1.0, KV_USAGE: 0.05},
    "decode": {WAITING: 0.0, RUNNING: 40.0, KV_USAGE: 0.9},
}


def desired(role: str, burst: dict[str, dict[str, float]], current: int = 2) -> int:
    trigger = role_trigger(role, ELASTIC)
    assert trigger is not None
    signals = [ReplicaSignals(values=burst[role])] * current
    return decide(current, signals, ELASTIC, trigger, History(), 0.0).desired


def test_a_prompt_heavy_burst_scales_prefill_and_not_decode() -> None:
    assert desired("prefill", PROMPT_HEAVY) == 6  # ceil(2 x 7 / 2) = 7, clamped to 6
    assert desired("decode", PROMPT_HEAVY) == 2


def test_a_decode_heavy_burst_scales_decode_and_not_prefill() -> None:
    assert desired("decode", DECODE_HEAVY) == 5  # running 40 / 16 -> ceil(5.0)
    assert desired("prefill", DECODE_HEAVY) == 2


def test_a_roles_own_trigger_replaces_its_default() -> None:
    own = ElasticConfig.model_validate(
        {
            "minReplicas": 1,
            "maxReplicas": 6,
            "scaleTrigger": {
                "hpa": {
                    "metrics": [
                        {
                            "type": "Pods",
                            "pods": {
                                "metric": {"name": "vllm:num_requests_running"},
                                "target": {"type": "AverageValue", "averageValue": 1},
                            },
                        }
                    ]
                }
            },
        }
    )
    trigger = role_trigger("prefill", own)
    assert trigger is not None
    signals = [ReplicaSignals(values=DECODE_HEAVY["prefill"])] * 2
    assert decide(2, signals, own, trigger, History(), 0.0).desired == 2  # running 1 vs 1
    assert role_trigger("prefill", None) is None


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
  modelClaim: {modelName: tiny}
  backendRuntimeConfig: {backendName: sim}
  llmplane:
    disaggregation:
      prefill:
        replicas: 2
        elasticConfig: {minReplicas: 1, maxReplicas: 6}
      decode:
        replicas: 2
        elasticConfig: {minReplicas: 1, maxReplicas: 6}
"""


class Source:
    """Signals per role workload (the gateway keys them by ``namespace/service``)."""

    def __init__(self) -> None:
        self.burst: dict[str, dict[str, float]] = {}

    def replica_signals(self, workload: str) -> Mapping[str, Mapping[str, float]]:
        role = workload.rsplit("-", 1)[1]
        return {f"{role}-{i}": self.burst[role] for i in range(2)}

    def requests_seen(self, workload: str) -> float:
        return 0.0

    def held(self, workload: str) -> int:
        return 0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    s = SQLiteStore(tmp_path / "db.sqlite")
    install_builtins(s)
    s.apply_many([dump_resource(r) for r in parse_text(PG, "pg.yaml").resources])
    yield s
    s.close()


def role_replicas(store: Any) -> dict[str, int]:
    dis = store.get("Playground", "tiny", "default")["spec"]["llmplane"]["disaggregation"]
    return {role: dis[role]["replicas"] for role in ("prefill", "decode")}


@pytest.mark.parametrize(
    ("burst", "expected", "scaled"),
    [
        (PROMPT_HEAVY, {"prefill": 6, "decode": 2}, "prefill"),
        (DECODE_HEAVY, {"prefill": 2, "decode": 5}, "decode"),
    ],
)
def test_the_embedded_autoscaler_writes_each_roles_replicas(
    store: Any, burst: dict[str, dict[str, float]], expected: dict[str, int], scaled: str
) -> None:
    source = Source()
    source.burst = burst
    scaler = Autoscaler(store, None, source, AutoscalerConfig(window=10), clock=lambda: 100.0)
    scaler.step()
    assert role_replicas(store) == expected
    pg = store.get("Playground", "tiny", "default")
    [event] = [e for e in events_for(store, pg) if e["reason"] == RESCALE]
    assert event["message"].startswith(f"{scaled}: New size: {expected[scaled]}")
