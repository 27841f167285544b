"""Per-role autoscaling of disaggregated Playgrounds: prefill scales on prompts queued for
prefill and prompt tokens waiting for their first token (or on time to first token, by its own
trigger), decode on sequences being generated and KV use, each within its own bounds; the
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
    PREFILL_TOKENS,
    RUNNING,
    TTFT,
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


# Long prompts an engine runs side by side (a large token budget a step): nothing queues in
# the engine, the prompt tokens the gateway sent and has not had answered pile up.
LONG_PROMPTS_IN_PARALLEL = {
    "prefill": {WAITING: 0.0, RUNNING: 6.0, KV_USAGE: 0.4, PREFILL_TOKENS: 20_000.0},
    "decode": {WAITING: 0.0, RUNNING: 6.0, KV_USAGE: 0.2, PREFILL_TOKENS: 300.0},
}


def test_prefill_scales_on_prompt_tokens_waiting_when_its_engine_queues_nothing() -> None:
    assert desired("prefill", LONG_PROMPTS_IN_PARALLEL) == 5  # ceil(2 x 20,000 / 8,192)
    assert desired("decode", LONG_PROMPTS_IN_PARALLEL) == 2
    trigger = role_trigger("prefill", ELASTIC)
    assert trigger is not None
    signals = [ReplicaSignals(values=LONG_PROMPTS_IN_PARALLEL["prefill"])] * 2
    reason = decide(2, signals, ELASTIC, trigger, History(), 0.0).reason
    assert reason.startswith("llmplane_gateway_endpoint_prefill_tokens 2e+04 per replica"), reason
    # Few tokens waiting (and none queued): within the target, prefill stays.
    light = {"prefill": {**LONG_PROMPTS_IN_PARALLEL["prefill"], PREFILL_TOKENS: 8000.0}}
    assert desired("prefill", light) == 2


def pods(name: str, target: float | str) -> dict[str, Any]:
    return {
        "type": "Pods",
        "pods": {
            "metric": {"name": name},
            "target": {"type": "AverageValue", "averageValue": target},
        },
    }


@pytest.mark.parametrize(
    "name", ["vllm:time_to_first_token_seconds", "llmplane_gateway_endpoint_ttft_seconds"]
)
def test_a_ttft_trigger_scales_prefill_up_on_slow_first_tokens_and_down_when_idle(
    name: str,
) -> None:
    """TTFT against an objective (500 ms a replica): 1.5 s triples prefill; an idle replica
    reports 0, so the reading never holds replicas once the burst is over."""
    elastic = ElasticConfig.model_validate(
        {
            "minReplicas": 1,
            "maxReplicas": 8,
            "scaleTrigger": {
                "hpa": {
                    "metrics": [pods(name, "500m")],
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
                }
            },
        }
    )
    trigger = role_trigger("prefill", elastic)
    assert trigger is not None
    slow = [ReplicaSignals(values={TTFT: 1.5, WAITING: 0.0})] * 2
    decision = decide(2, slow, elastic, trigger, History(), 0.0)
    assert decision.desired == 6, decision.reason
    assert decision.reason.startswith(f"{name} 1.5 per replica (target 0.5)")
    idle = [ReplicaSignals(values={TTFT: 0.0})] * 6
    assert decide(6, idle, elastic, trigger, decision.history, 30.0).desired == 1
    # No TTFT at all (an engine without the histogram): no data, which holds replicas.
    blind = [ReplicaSignals(values={WAITING: 0.0})] * 6
    held = decide(6, blind, elastic, trigger, decision.history, 30.0)
    assert held.desired == 6 and "no data" in held.reason, held.reason


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
