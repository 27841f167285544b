"""The embedded autoscaler end to end: ``llmplane up`` with sim replicas, real HTTP load.

Short windows are configured in the tests (``--autoscale-interval/--autoscale-window`` and the
trigger's ``behavior``), so the rules are the production ones on a faster clock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmplane.store.paths import open_store
from llmplane.testing import Processes, Up, always, wait_for
from tests.integration.upcli import cli, http, sim_fleet, status

FAST = ["--autoscale-interval", "0.2", "--autoscale-window", "1"]


def elastic_fleet(tmp_path: Path, elastic: str, name: str = "tiny") -> str:
    """The sim fleet of upcli with ``elastic`` (YAML lines under spec) added; the sim is slowed
    (time scale 5: about 2 s per 60-token request) so requests stay in flight."""
    text = sim_fleet(name, 1, time_scale="5") + "  elasticConfig:\n" + elastic
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return str(path)


def spec_replicas(state: Path, name: str = "tiny") -> int:
    with open_store(state) as store:
        obj = store.get("Playground", name, "default") or {}
    return int((obj.get("spec") or {}).get("replicas", -1))


class Load:
    """``clients`` threads sending completions back to back until ``stop()``."""

    def __init__(self, url: str, model: str, clients: int) -> None:
        self.url, self.model = url, model
        self.done = threading.Event()
        self.failures: list[int] = []
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _loop(self) -> None:
        body = {"model": self.model, "prompt": "hello there", "max_tokens": 60}
        while not self.done.is_set():
            code, _, _ = http(f"{self.url}/v1/completions", body)
            if code != 200:
                self.failures.append(code)

    def stop(self) -> None:
        self.done.set()
        for t in self.threads:
            t.join(timeout=60)


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
