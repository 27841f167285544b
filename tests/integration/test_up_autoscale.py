"""The embedded autoscaler end to end: ``llmplane up`` with sim replicas, real HTTP load.

Short windows are configured in the tests (``--autoscale-interval/--autoscale-window`` and the
trigger's ``behavior``), so the rules are the production ones on a faster clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmplane.testing import Processes, Up, always, wait_for
from tests.integration.elastic_fleets import (
    FAST,
    SCALE_TO_ZERO,
    Load,
    elastic_fleet,
    metric,
    spec_replicas,
)
from tests.integration.upcli import cli, http, sim_fleet, status


@pytest.fixture
def load() -> Iterator[list[Load]]:
    started: list[Load] = []
    yield started
    for item in started:
        item.stop()


def test_load_scales_up_to_max_and_idle_back_to_min(
    tmp_path: Path, processes: Processes, load: list[Load]
) -> None:
    fleet = elastic_fleet(
        tmp_path,
        """    minReplicas: 1
    maxReplicas: 3
    scaleTrigger:
      hpa:
        metrics:
        - type: Pods
          pods:
            metric: {name: llmplane_gateway_endpoint_inflight}
            target: {type: AverageValue, averageValue: 2}
        behavior:
          scaleDown: {stabilizationWindowSeconds: 3}
""",
    )
    state = tmp_path / "state"
    up: Up = processes.up(state, fleet, args=FAST)
    wait_for(lambda: status(state, "Playground", "tiny").get("readyReplicas") == 1, 60)

    load.append(Load(up.url, "tiny", clients=10))  # ~10 in flight against a target of 2 each
    wait_for(lambda: spec_replicas(state) == 3, 60, what="scale up to maxReplicas")
    wait_for(
        lambda: (
            status(state, "Playground", "tiny").get("readyReplicas") == 3
            and len(up.engine_pids()) == 3
        ),
        60,
        what="three ready replicas",
    )
    # Still far above target with 3 replicas: maxReplicas holds, never above.
    always(lambda: spec_replicas(state) == 3 and len(up.engine_pids()) <= 3, 2.0, what="stays at 3")
    described = cli("describe", "pl", "tiny", state_dir=state).stdout
    assert "SuccessfulRescale" in described
    assert "llmplane_gateway_endpoint_inflight" in described  # the event says why
    assert cli("get", "pl", state_dir=state).stdout.split("\n")[1].split()[2] == "3"

    load[0].stop()
    assert load[0].failures == []
    wait_for(lambda: spec_replicas(state) == 1, 60, what="back to minReplicas once idle")
    wait_for(lambda: len(up.engine_pids()) == 1, 60, what="two replicas drained and stopped")
    assert status(state, "Playground", "tiny").get("replicas") == 1


def test_blog_example_scales_on_the_default_trigger(
    tmp_path: Path, processes: Processes, load: list[Load]
) -> None:
    """llmaz's blog: ``elasticConfig: {minReplicas: 1, maxReplicas: 3}`` and no trigger anywhere
    (the sim BackendRuntime names none): the default (8 in flight per replica) applies."""
    fleet = elastic_fleet(tmp_path, "    minReplicas: 1\n    maxReplicas: 3\n")
    state = tmp_path / "state"
    up: Up = processes.up(state, fleet, args=FAST)
    wait_for(lambda: status(state, "Playground", "tiny").get("readyReplicas") == 1, 60)
    always(lambda: spec_replicas(state) == 1, 1.0, what="idle: stays at 1")
    load.append(Load(up.url, "tiny", clients=30))
    wait_for(lambda: spec_replicas(state) >= 2, 60, what="scale up on the default trigger")
    wait_for(lambda: spec_replicas(state) == 3, 60, what="up to maxReplicas")
    always(lambda: spec_replicas(state) <= 3, 1.0, what="never above maxReplicas")


def test_scale_to_zero_and_the_first_request_is_held_then_answered(
    tmp_path: Path, processes: Processes
) -> None:
    fleet = elastic_fleet(tmp_path, SCALE_TO_ZERO, replicas=0, time_scale="0.01")
    state = tmp_path / "state"
    up: Up = processes.up(state, fleet, args=FAST)
    # replicas: 0 with minReplicas: 0 starts with no replica and stays so while idle.
    always(lambda: not up.engine_pids(), 1.5, what="no replica before the first request")
    assert spec_replicas(state) == 0
    wait_for(
        lambda: "scaled to zero" in cli("describe", "isvc", "tiny", state_dir=state).stdout,
        30,
        what="the Service's condition to say it is scaled to zero",
    )

    body = {"model": "tiny", "prompt": "hello", "max_tokens": 5}
    code, _, data = http(f"{up.url}/v1/completions", body)  # held while a replica starts
    assert code == 200, data
    assert data["choices"][0]["text"]
    assert metric(up.url, 'llmplane_gateway_activator_held_total{model="tiny"}') == 1
    assert metric(up.url, 'llmplane_gateway_activator_cold_start_seconds_count{model="tiny"}') == 1
    assert spec_replicas(state) == 1
    described = cli("describe", "pl", "tiny", state_dir=state).stdout
    assert "scale from zero: 1 request(s) waiting" in described

    # Idle for scaleToZeroAfterSeconds: the last replica stops.
    wait_for(lambda: spec_replicas(state) == 0, 30, what="scale to zero once idle")
    wait_for(lambda: not up.engine_pids(), 30, what="the last replica to stop")
    assert (
        "no request for 2 s: scale to zero" in cli("describe", "pl", "tiny", state_dir=state).stdout
    )

    # And again: the next request is answered after a second cold start.
    code, _, data = http(f"{up.url}/v1/completions", body)
    assert code == 200, data
    assert metric(up.url, 'llmplane_gateway_activator_held_total{model="tiny"}') == 2


def test_hold_timeout_and_a_disconnecting_client(tmp_path: Path, processes: Processes) -> None:
    """A Playground with no replica and nothing to scale it (replicas: 0, no elasticConfig):
    a held request ends in 503 + Retry-After after the configured hold timeout, and a client
    that goes away while held leaves the queue."""
    import socket

    import orjson

    fleet = tmp_path / "zero.yaml"
    fleet.write_text(sim_fleet("tiny", 0))
    config = tmp_path / "gateway.yaml"
    config.write_text("gateway: {activatorHoldTimeout: 3, activatorRetryAfter: 2}\n")
    state = tmp_path / "state"
    up: Up = processes.up(state, str(fleet), args=[*FAST, "--gateway-config", str(config)])
    wait_for(lambda: status(state, "Playground", "tiny").get("conditions"), 30)

    code, headers, data = http(
        f"{up.url}/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 1}
    )
    assert code == 503 and headers["Retry-After"] == "2", data
    assert "no replica became ready within 3 s" in data["error"]["message"]
    assert (
        metric(up.url, 'llmplane_gateway_activator_refused_total{model="tiny",reason="timeout"}')
        == 1
    )

    # A client that disconnects while held is dropped from the queue at once.
    body = orjson.dumps({"model": "tiny", "prompt": "x", "max_tokens": 1})
    with socket.create_connection((up.host, up.port)) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        wait_for(
            lambda: metric(up.url, 'llmplane_gateway_activator_queue{model="tiny"}') == 1,
            10,
            what="the request held",
        )
    wait_for(
        lambda: metric(up.url, 'llmplane_gateway_activator_queue{model="tiny"}') == 0,
        2,
        what="the disconnected request to leave the queue before its hold timeout",
    )
    # It was not answered with a timeout either: only the first request timed out.
    assert (
        metric(up.url, 'llmplane_gateway_activator_refused_total{model="tiny",reason="timeout"}')
        == 1
    )


def test_resource_memory_metric_reads_the_replica_process(
    tmp_path: Path, processes: Processes
) -> None:
    """A Resource metric reads the replica's process group from /proc: an engine resident in
    tens of MB against a 1 MiB average target wants more replicas, up to maxReplicas."""
    fleet = elastic_fleet(
        tmp_path,
        """    minReplicas: 1
    maxReplicas: 2
    scaleTrigger:
      hpa:
        metrics:
        - type: Resource
          resource:
            name: memory
            target: {type: AverageValue, averageValue: 1Mi}
""",
        time_scale="0.01",
    )
    state = tmp_path / "state"
    up: Up = processes.up(state, fleet, args=FAST)
    wait_for(lambda: spec_replicas(state) == 2, 60, what="scale up on the replica's memory")
    described = cli("describe", "pl", "tiny", state_dir=state).stdout
    assert "memory" in described and "target 1.05e+06" in described
    wait_for(lambda: len(up.engine_pids()) == 2, 60, what="the second replica")
