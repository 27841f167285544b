"""Engine priorities from flow control's bands and shares, and the body the engine gets."""

from __future__ import annotations

import orjson

from llmplane.gateway.flowcontrol.priority import engine_priority, with_priority
from llmplane.runtime.endpoint import pod_priority_scheduling, priority_scheduling


def test_bands_first_then_under_share_ahead_of_over_share() -> None:
    order = [
        engine_priority(band, under)
        for band in ("Critical", "Default", "Sheddable")
        for under in (True, False)
    ]
    assert order == [-2, -1, 0, 1, 2, 3]  # strictly increasing: lower is served first
    assert engine_priority("Unknown", True) == 0  # as Default (vLLM's default priority)


def test_the_priority_is_the_objects_last_member_and_wins_over_the_clients() -> None:
    assert with_priority(b'{"model":"m"}', -2) == b'{"model":"m","priority":-2}'
    assert with_priority(b'{"model": "m", "priority": -9}\n', 1) == (
        b'{"model": "m", "priority": -9,"priority":1}'
    )
    assert orjson.loads(with_priority(b'{"priority": -9, "x": 1}', 3))["priority"] == 3
    assert with_priority(b"{ }", 0) == b'{"priority":0}'
    assert with_priority(b"[1]", 0) == b"[1]"  # not an object: untouched


def test_priority_scheduling_from_engine_command_lines() -> None:
    assert priority_scheduling(["vllm", "serve", "m", "--scheduling-policy", "priority"])
    assert priority_scheduling(["--scheduling-policy=priority"])
    assert not priority_scheduling(["--scheduling-policy", "fcfs"])
    assert not priority_scheduling(["--scheduling-policy=priority", "--scheduling-policy=fcfs"])
    assert not priority_scheduling(["--scheduling-policy"])
    assert not priority_scheduling(["--max-num-seqs", "8"])
    pod = {
        "spec": {
            "containers": [
                {"command": ["sidecar"]},
                {"command": ["vllm", "serve"], "args": ["--scheduling-policy", "priority"]},
            ]
        }
    }
    assert pod_priority_scheduling(pod)
    assert not pod_priority_scheduling({"spec": {"containers": [{"args": [1, None]}]}})
    assert not pod_priority_scheduling({"spec": "x"})
