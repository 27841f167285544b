"""The gateway inside ``llmplane up``, end to end: Playgrounds of the ``sim`` backend started by
``up``, Kthena routes applied from YAML, real HTTP from a client thread pool."""

from __future__ import annotations

import itertools
import math
import os
import signal
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from llmplane.testing import Processes, Up, wait_for
from tests.integration.upcli import http, sim_fleet, status

MODEL_SERVER = """
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {{name: servers-{name}}}
spec:
  model: tiny-{name}
  inferenceEngine: vLLM
  workloadSelector:
    matchLabels: {{llmaz.io/model-name: tiny-{name}}}
"""
ROUTE = """
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {name: mix}
spec:
  modelName: mix
  rules:
    - name: split
      targetModels:
        - {modelServerName: servers-a, weight: 75}
        - {modelServerName: servers-b, weight: 25}
"""
# Playgrounds a (2 replicas, model tiny-a) and b (1, tiny-b), a ModelServer each, a 75/25 route.
FLEET = "---".join(
    [
        *(sim_fleet(f"tiny-{n}", r, "0.05", playground=n) for n, r in (("a", 2), ("b", 1))),
        *(MODEL_SERVER.format(name=n) for n in "ab"),
        ROUTE,
    ]
)


@pytest.fixture
def up(tmp_path: Path, processes: Processes) -> Up:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    up = processes.up(tmp_path / "state", str(path))
    for name, replicas in (("a", 2), ("b", 1)):
        wait_for(
            lambda n=name, r=replicas: (
                status(up.state_dir, "Playground", n).get("readyReplicas") == r
            ),
            90,
            what=f"Playground {name} ready",
        )
    return up


def completion(up: Up, model: str, i: int) -> tuple[int, dict[str, str], dict]:
    body = {"model": model, "prompt": f"request {i}", "max_tokens": 4, "ignore_eos": True}
    return http(f"{up.url}/v1/completions", body)


def test_weighted_split_lands_within_bounds_and_engines_see_the_rewritten_model(up: Up) -> None:
    n = 240
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: completion(up, "mix", i), range(n)))
    assert all(code == 200 for code, _, _ in results), [r for r in results if r[0] != 200][:3]
    # The engine names the model it served: the ModelServer's spec.model, not "mix".
    served = Counter(doc["model"] for _, _, doc in results)
    assert set(served) == {"tiny-a", "tiny-b"}
    # 75 / 25 by weight: within 4.5 standard deviations of n * 0.75 (a false alarm ~1e-5).
    sd = math.sqrt(n * 0.75 * 0.25)
    assert abs(served["tiny-a"] - n * 0.75) <= 4.5 * sd, served
    # Each target's requests went to its own Playground's replicas (both of a's were used).
    endpoints = {
        m: {h["x-llmplane-endpoint"] for _, h, d in results if d["model"] == m} for m in served
    }
    assert len(endpoints["tiny-a"]) == 2 and len(endpoints["tiny-b"]) == 1
    assert not endpoints["tiny-a"] & endpoints["tiny-b"]


def test_killing_a_replica_under_load_fails_no_request(up: Up) -> None:
    records = orjson.loads((up.state_dir / "runtime" / "processes.json").read_bytes())
    victim = next(r["pid"] for r in records["processes"] if r["workload"] == "default/a")
    finished = itertools.count(1)

    def one(i: int) -> int:
        code, _, _ = completion(up, "tiny-a", i)
        if next(finished) == 40:  # in the middle of the load, with 8 requests in flight
            os.kill(victim, signal.SIGKILL)
        return code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(one, range(200)))
    assert codes == [200] * 200, Counter(codes)
    assert victim not in up.engine_pids()  # it really died (the runtime restarts a new one)
