"""Merging the in-cluster gateways' autoscaling signals (``operator/signals.py``)."""

from __future__ import annotations

from llmplane.operator.signals import Snapshot


def test_gateways_answers_merge_per_replica() -> None:
    """Each gateway counts its own in-flight requests (they add up); engine readings are the
    same engine scraped twice (the highest is kept); counters and held requests add up."""
    snapshot = Snapshot()
    snapshot.add(
        {
            "workloads": {
                "default/opt": {
                    "replicas": {"10.0.0.1:8080": {"inflight": 3, "waiting": 1, "kv_usage": 0.5}},
                    "requestsSeen": 10,
                    "held": 0,
                }
            }
        }
    )
    snapshot.add(
        {
            "workloads": {
                "default/opt": {
                    "replicas": {
                        "10.0.0.1:8080": {"inflight": 4, "waiting": 2, "kv_usage": 0.25},
                        "10.0.0.2:8080": {"inflight": 1},
                    },
                    "requestsSeen": 5,
                    "held": 2,
                }
            }
        }
    )
    assert snapshot.gateways == 2
    assert snapshot.replica_signals("default/opt") == {
        "10.0.0.1:8080": {"inflight": 7.0, "waiting": 2.0, "kv_usage": 0.5},
        "10.0.0.2:8080": {"inflight": 1.0},
    }
    assert snapshot.requests_seen("default/opt") == 15
    assert snapshot.held("default/opt") == 2
    assert snapshot.replica_signals("default/other") == {}
    assert snapshot.held("default/other") == 0


def test_malformed_answers_are_skipped() -> None:
    snapshot = Snapshot()
    snapshot.add({"workloads": "nope"})
    snapshot.add({"workloads": {"a/b": "nope", "c/d": {"replicas": {"x": "bad"}, "held": "2"}}})
    snapshot.add({"workloads": {"e/f": {"replicas": {"y": {"inflight": "lots", "waiting": True}}}}})
    assert snapshot.gateways == 3
    assert snapshot.replica_signals("c/d") == {}
    assert snapshot.held("c/d") == 0
    assert snapshot.replica_signals("e/f") == {"y": {"inflight": 0.0, "waiting": 0.0}}
