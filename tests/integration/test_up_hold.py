"""The activator beyond a Playground's own model at zero, end to end with ``llmplane up`` and
sim replicas: requests wait while every replica restarts after serving, and requests routed
through a ModelRoute (ModelServer) or an InferenceModel (InferencePool) wait for the Playground
whose replicas their target selects.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from llmplane.testing import Processes, Up, wait_for
from tests.integration.elastic_fleets import FAST, SCALE_TO_ZERO, metric, spec_replicas
from tests.integration.upcli import condition, http, sim_fleet, status

BODY = {"prompt": "hello", "max_tokens": 5}


def test_requests_wait_while_every_replica_restarts(tmp_path: Path, processes: Processes) -> None:
    """The only replica's engine dies after serving: the runtime restarts it after its back-off
    (10 s) and says ``Restarting`` (not ``CrashLoopBackOff``: it was Ready), so a request
    meanwhile is held and answered once the new engine is ready, instead of a 503."""
    path = tmp_path / "tiny.yaml"
    path.write_text(sim_fleet("tiny", 1))
    state = tmp_path / "state"
    up: Up = processes.up(state, str(path))
    wait_for(lambda: status(state, "Playground", "tiny").get("readyReplicas") == 1, 60)
    code, _, data = http(f"{up.url}/v1/completions", {"model": "tiny", **BODY})
    assert code == 200, data

    [pid] = up.engine_pids()
    os.killpg(pid, signal.SIGKILL)
    cond = wait_for(
        lambda: (
            (c := condition(state, "Playground", "tiny", "Available")).get("reason") == "Restarting"
            and c
        ),
        30,
        what="the Playground to say its replica restarts",
    )
    assert "the engine stopped after serving" in cond["message"]
    wait_for(
        lambda: metric(up.url, 'llmplane_gateway_model_endpoints{model="tiny"}') == 0,
        10,
        what="the gateway to have no endpoint for tiny",
    )
    code, _, data = http(f"{up.url}/v1/completions", {"model": "tiny", **BODY})
    assert code == 200, data  # held through the restart, not 503
    assert metric(up.url, 'llmplane_gateway_activator_held_total{model="tiny"}') == 1
    assert up.engine_pids() and pid not in up.engine_pids()


ROUTES = """
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {name: a-servers}
spec:
  model: tiny-a
  inferenceEngine: vLLM
  workloadSelector:
    matchLabels: {llmaz.io/model-name: tiny-a}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {name: chat}
spec:
  modelName: chat
  rules:
    - targetModels: [{modelServerName: a-servers}]
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferencePool
metadata: {name: b-pool}
spec:
  targetPortNumber: 8000
  selector: {llmaz.io/model-name: tiny-b}
  extensionRef: {name: b-epp}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModel
metadata: {name: batch}
spec:
  modelName: batch
  poolRef: {name: b-pool}
  targetModels: [{name: tiny-b, weight: 1}]
"""


def test_routed_requests_wait_for_the_playground_behind_their_target(
    tmp_path: Path, processes: Processes
) -> None:
    """Two Playgrounds scaled to zero; ``chat`` (ModelRoute -> ModelServer selecting tiny-a's
    replicas) and ``batch`` (InferenceModel -> InferencePool selecting tiny-b's) are held,
    wake the Playground their target selects, and are answered."""
    fleet = ""
    for name in ("tiny-a", "tiny-b"):
        fleet += sim_fleet(name, 0) + "  elasticConfig:\n" + SCALE_TO_ZERO + "---\n"
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet.rstrip("-\n") + "\n" + ROUTES)
    state = tmp_path / "state"
    up: Up = processes.up(state, str(path), args=FAST)
    assert not up.engine_pids()

    for model, playground in (("chat", "tiny-a"), ("batch", "tiny-b")):
        code, _, data = http(f"{up.url}/v1/completions", {"model": model, **BODY})
        assert code == 200, data  # not "selects none"
        assert data["choices"][0]["text"]
        assert metric(up.url, f'llmplane_gateway_activator_held_total{{model="{model}"}}') == 1
        assert spec_replicas(state, playground) == 1
    assert spec_replicas(state, "tiny-a") == 1
