"""LoRA adapters behind ``llmplane up`` with no routing YAML: reported adapters are routable by
name, declared ones load on demand and the least recently used one this gateway loaded is
unloaded when a replica's slots are full. Real sim engines (they implement vLLM's runtime
adapter API); the same flow runs on real vLLM in test_vllm.py."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from llmplane.testing import Processes, wait_for
from tests.integration.upcli import cli, condition, http


def playground(adapters_dir: Path) -> str:
    declared = [
        {"name": n, "source": {"uri": f"host://{adapters_dir / n}"}} for n in ("a2", "a3", "a4")
    ]
    return f"""
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {{name: base}}
spec:
  familyName: tiny
  source: {{uri: "host:///dev/null"}}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {{name: base}}
spec:
  replicas: 1
  modelClaims:
    models: [{{name: base}}]
  backendRuntimeConfig:
    backendName: sim
    args: ["--time-scale", "0", "--enable-lora", "--max-loras", "3",
           "--lora-modules", "a1={adapters_dir / "a1"}"]
  loraAdapters: {json.dumps(declared)}
"""


def models_on(address: str) -> set[str]:
    with urllib.request.urlopen(f"http://{address}/v1/models", timeout=10) as resp:
        return {m["id"] for m in json.loads(resp.read())["data"]}


def ask(url: str, model: str) -> str:
    code, headers, body = http(
        f"{url}/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2}
    )
    assert code == 200, body
    assert body["model"] == model
    return headers["x-llmplane-endpoint"]


def test_adapters_are_routed_loaded_on_demand_and_unloaded_lru(
    tmp_path: Path, processes: Processes
) -> None:
    adapters = tmp_path / "adapters"
    for name in ("a1", "a2", "a3", "a4"):
        (adapters / name).mkdir(parents=True)
    path = tmp_path / "pl.yaml"
    path.write_text(playground(adapters))
    state = tmp_path / "state"
    up = processes.up(state, str(path))
    wait_for(
        lambda: condition(state, "Playground", "base", "Available").get("status") == "True",
        60,
        what="Playground ready",
    )
    # `get pl` names the model of a modelClaims Playground.
    assert cli("get", "pl", state_dir=state).stdout.splitlines()[1].split()[3] == "base"

    # The engine was started with a1: routable by name, no ModelRoute needed.
    replica = wait_for(lambda: _try(up.url, "a1"), 30, what="a1 routable")
    assert models_on(replica) == {"base", "a1"}

    # Declared adapters no replica holds are loaded through the runtime adapter API.
    assert ask(up.url, "a2") == replica
    assert ask(up.url, "a3") == replica
    assert models_on(replica) == {"base", "a1", "a2", "a3"}  # max-loras 3: full
    ask(up.url, "a2")  # a2 used after a3: a3 is now the least recently used
    ask(up.url, "a1")
    assert ask(up.url, "a4") == replica
    # a3 made room (a1 came with the engine and is never unloaded by llmplane).
    assert models_on(replica) == {"base", "a1", "a2", "a4"}

    # An unknown name is still a 404 naming what exists.
    code, _, body = http(f"{up.url}/v1/completions", {"model": "a9", "prompt": "x"})
    assert code == 404 and "a4" in body["error"]["message"]


def _try(url: str, model: str) -> str | None:
    code, headers, _ = http(
        f"{url}/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 1}
    )
    return headers.get("x-llmplane-endpoint") if code == 200 else None
