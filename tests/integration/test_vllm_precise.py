"""Precise prefix-cache routing against real vLLM (the CPU build) under ``llmplane up``.

Two vLLM replicas of the tiny test model publish their KV events; the gateway runs two workers
(``--workers 2``: two processes, each subscribing on its own) with the access log on. Twenty
chat requests in four groups sharing ~300-token system prompts (vLLM's CPU block is 128
tokens): for each, the ``cached_tokens_predicted`` of its access-log line equals the increase of
``vllm:prefix_cache_hits_total`` on the replica that served it; every group stays on one
replica whichever worker routed it (both workers index the same blocks); and a replica killed
is forgotten by the index within a second.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import orjson
import pytest

from llmplane.gateway.kvcache.index import block_keys
from llmplane.gateway.tokenization import ModelTokenizer
from llmplane.testing import Processes, wait_for
from llmplane.testing.fleets import vllm_fleet
from llmplane.testing.tiny_model import build_tiny_llama, corpus
from tests.integration.metrics_pages import engine_metric, gateway_metric
from tests.integration.upcli import condition, http, status
from tests.integration.vllm_cpu import require_vllm

require_vllm()

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
NAME = "tiny"
ENGINE_START = 600  # two cold vLLM starts on a shared 2-core machine
BLOCK = 128  # vLLM's block size on CPU
HITS = "vllm:prefix_cache_hits_total"


def requests() -> list[tuple[int, dict]]:
    """(group, body): four groups of five users, the groups interleaved."""
    systems = [" ".join(" ".join(corpus(40, seed=g)).split()[:260]) for g in range(4)]
    out = []
    for user in range(5):
        for g, system in enumerate(systems):
            own = " ".join(" ".join(corpus(4, seed=100 + 10 * g + user)).split()[:40])
            messages = [{"role": "system", "content": system}, {"role": "user", "content": own}]
            out.append((g, {"model": NAME, "messages": messages, "max_tokens": 1}))
    return out


def access_lines(text: str) -> list[dict]:
    lines = []
    for line in text.splitlines():
        if line.startswith("{") and '"path"' in line:
            try:
                lines.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
    return [r for r in lines if r.get("path") == "/v1/chat/completions"]


def kv_blocks(url: str) -> dict[str, float]:
    return gateway_metric(url, "llmplane_gateway_endpoint_kv_blocks")


def test_predictions_equal_vllms_hits_across_two_workers_and_a_restart_is_forgotten(
    tmp_path: Path, processes: Processes
) -> None:
    model = build_tiny_llama(tmp_path / "model")
    tokenizer = ModelTokenizer.load(model)
    (tmp_path / "fleet.yaml").write_text(
        vllm_fleet(model, NAME, replicas=2, args=["--max-model-len", "1024"])
    )
    up = processes.up(
        tmp_path / "state",
        str(tmp_path / "fleet.yaml"),
        args=["--workers", "2", "--access-log"],
        timeout=120,
    )
    url = up.url
    try:
        wait_for(
            lambda: (
                condition(up.state_dir, "Playground", NAME, "Available").get("status") == "True"
                and status(up.state_dir, "Playground", NAME).get("readyReplicas") == 2
            ),
            ENGINE_START,
            every=2,
            what="both vLLM replicas ready",
        )
        wait_for(lambda: len(kv_blocks(url)) == 2, 60, what="both replicas publish to the gateway")
        addresses = sorted(kv_blocks(url))
        sent: dict[str, set[int]] = {a: set() for a in addresses}  # keys of blocks sent there
        served: dict[int, set[str]] = {}
        workers: dict[int, set[int]] = {}
        for i, (group, body) in enumerate(requests()):
            before = {a: engine_metric(a, HITS) for a in addresses}
            code, headers, answer = http(f"{url}/v1/chat/completions", body)
            assert code == 200, answer
            address = headers["x-llmplane-endpoint"]
            after = {a: engine_metric(a, HITS) for a in addresses}
            wait_for(lambda i=i: len(access_lines(up.output())) > i, 10, what="access line")
            record = access_lines(up.output())[i]
            assert record["endpoint"] == address, record
            hits = after[address] - before[address]
            assert record.get("cached_tokens_predicted") == hits, (i, record, before, after)
            served.setdefault(group, set()).add(address)
            workers.setdefault(group, set()).add(record["worker"])
            # Before the next request, every worker has indexed this one's blocks (the
            # replicas' caches never evict here).
            ids = tokenizer.chat_ids({"messages": body["messages"]})
            sent[address].update(block_keys(ids, BLOCK))
            want = {a: len(keys) for a, keys in sent.items()}
            wait_for(
                lambda want=want: all(
                    kv_blocks(url).get(a, 0) >= n for _ in range(4) for a, n in want.items()
                ),
                10,
                what=f"request {i}'s blocks indexed by every worker ({want})",
            )
        assert all(len(s) == 1 for s in served.values()), served  # each group on one replica
        both = [g for g, w in workers.items() if len(w) == 2]
        assert both, f"no group routed by both workers: {workers}"
        # A replica killed: every worker forgets its blocks within a second.
        victim = max(addresses, key=lambda a: kv_blocks(url).get(a, 0))
        assert kv_blocks(url)[victim] > 0
        port = victim.rsplit(":", 1)[1]
        records = orjson.loads((up.state_dir / "runtime" / "processes.json").read_bytes())
        pid = next(
            r["pgid"]
            for r in records["processes"]
            if port in [r["argv"][j + 1] for j, a in enumerate(r["argv"][:-1]) if a == "--port"]
        )
        killed = time.monotonic()
        os.killpg(pid, signal.SIGKILL)
        wait_for(
            lambda: all(kv_blocks(url).get(victim, 0) == 0 for _ in range(4)),
            1.0,
            every=0.02,
            what="the killed replica's blocks forgotten by every worker",
        )
        print(f"forgotten after {time.monotonic() - killed:.3f}s")
    except BaseException:
        print(re.sub(r"\n{3,}", "\n", up.output()[-6000:]))
        raise
