"""Load-aware, prefix-aware scheduling against real simulated engines (``llmplane.sim``)."""

from __future__ import annotations

import asyncio
import collections
import time

import aiohttp
import pytest

from llmplane.controlplane.plan import MODEL_NAME_LABEL
from llmplane.gateway.discovery import Endpoint, StaticDiscovery
from llmplane.testing import Processes, eventually, sim_process

MODEL = "llama-sim"


@pytest.fixture(scope="module")
def sims():
    with Processes() as group:
        yield group.start(*(sim_process(MODEL, "--time-scale", "0.2") for _ in range(3)))


@pytest.fixture
async def gateway(sims, gateways):
    discovery = StaticDiscovery(
        Endpoint(s.address, {MODEL_NAME_LABEL: MODEL}, MODEL, fixed_port=True) for s in sims
    )
    return await gateways(None, discovery)


async def test_engine_metrics_are_scraped(gateway):
    await eventually(
        lambda: (
            len(gateway.registry.states) == 3
            and all(
                s.has_load_metrics and s.served_models for s in gateway.registry.states.values()
            )
        ),
        what="three engines scraped",
    )
    now = time.monotonic()
    for s in gateway.registry.states.values():
        assert s.has_load_metrics and s.has_kv
        assert now - s.scraped_at < 1.0
        assert s.served_models == {MODEL}


def _body(api: str, prefix: str, question: str) -> tuple[str, dict]:
    """The path and body of one request in each API, the shared prefix where that API puts a
    system prompt (the prefix scorers read each API's own fields)."""
    if api == "responses":
        body = {"model": MODEL, "max_output_tokens": 4, "instructions": prefix, "input": question}
        return "/v1/responses", body
    user = {"role": "user", "content": question}
    if api == "messages":
        return "/v1/messages", {
            "model": MODEL,
            "max_tokens": 4,
            "system": prefix,
            "messages": [user],
        }
    system = {"role": "system", "content": prefix}
    return "/v1/chat/completions", {"model": MODEL, "max_tokens": 4, "messages": [system, user]}


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_shared_prefixes_concentrate_while_load_stays_bounded(gateway, api):
    # Four "system prompts" of ~3000 characters each; many questions per prompt.
    prefixes = [
        f"You are assistant number {g}. " + f"Background document {g}: " * 120 for g in range(4)
    ]
    by_prefix: dict[int, collections.Counter] = {g: collections.Counter() for g in range(4)}
    sem = asyncio.Semaphore(8)

    async with aiohttp.ClientSession() as client:

        async def one(g: int, i: int) -> None:
            path, body = _body(api, prefixes[g], f"question {i}")
            async with (
                sem,
                client.post(f"http://127.0.0.1:{gateway.port}{path}", json=body) as r,
            ):
                assert r.status == 200, await r.text()
                by_prefix[g][r.headers["x-llmplane-endpoint"]] += 1

        await asyncio.gather(*(one(g, i) for i in range(30) for g in range(4)))

    total = collections.Counter()
    for counts in by_prefix.values():
        total.update(counts)
    # Each prefix stays on few replicas: spread at random (or round-robin) each of the 4
    # would reach all 3 replicas (12 pairs); prefix-aware, a hot prefix is held by 1-2.
    pairs = sum(len(c) for c in by_prefix.values())
    assert pairs <= 9, by_prefix
    for counts in by_prefix.values():
        assert counts.most_common(1)[0][1] >= 12, by_prefix
    # ... while the load stays spread over the replicas.
    assert len(total) == 3 and max(total.values()) <= 0.6 * 120, total
