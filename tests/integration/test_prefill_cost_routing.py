"""A cost-aware profile (the ``prefill-cost`` scorer; opt-in) on real sims publishing KV events: a replica holding a
request's prefix keeps it while its queue costs less than recomputing the prefix elsewhere,
and gives it up exactly when the queue costs more.

Sim "a" holds a 3,000-token prefix; then it hangs every request (``hang_rate``: accepted, never
answered), so each stream the gateway sends there stays queued ahead of the next one, a queue
the test controls exactly. Requests sharing the prefix (and 700 tokens of their own) are sent
one by one: the k-th goes to "a" while k queued requests of 700 uncached tokens each plus its
own 700 are less prefill than the whole prompt on the empty sim "b", and to "b" from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.sim.tokenizer import tokenize
from llmplane.testing import Processes
from llmplane.testing.wait import eventually
from tests.integration.kv_sims import BLOCK, VOCAB, complete, events_flags, start_sim

PREFIX = "".join(f"p{i:03d}" for i in range(3_000))  # 3,000 tokens of 4 characters
OWN_TOKENS = 700


COST_AWARE = {  # the profile docs/gateway.md gives for cost-aware routing
    "plugins": [
        {"type": "prefill-cost-scorer"},
        {"type": "least-request-scorer"},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "prefill-cost-scorer", "weight": 1},
                {"pluginRef": "least-request-scorer", "weight": 0.01},
                {"pluginRef": "max-score-picker"},
            ],
        }
    ],
}


def prompt(user: int) -> str:
    return PREFIX + "".join(f"{user:02d}u{i % 10}" for i in range(OWN_TOKENS))


async def seen(client: aiohttp.ClientSession, address: str) -> int:
    async with client.get(f"http://{address}/admin/faults") as r:
        return (await r.json())["requests_seen"]


async def test_affinity_gives_way_only_when_the_queue_costs_more_than_recomputing(
    processes: Processes, store, gateways, client: aiohttp.ClientSession, sockets: Path
) -> None:
    sims = []
    for i, name in enumerate(("a", "b")):
        flags, events, replay = events_flags(sockets, name)
        sim = start_sim(processes, flags, "--max-model-len", "16384", blocks=4_000)
        store.apply(endpoint_object(f"s{i}", sim.address, "m", engine="sim", kv_events=events,
                                    kv_events_replay=replay))  # fmt: skip
        sims.append(sim)
    a, b = (s.address for s in sims)
    gateway = await gateways(store, config=GatewayConfig(scheduler=COST_AWARE))
    await complete(client, a, prompt(0))  # "a" holds the prefix (the gateway never saw it)
    await eventually(
        lambda: gateway.kv.subscriber.index.held(a) >= len(PREFIX) // 4 // BLOCK,
        what="the prefix indexed on a",
    )
    async with client.post(f"http://{a}/admin/faults", json={"hang_rate": 1.0}) as r:
        assert r.status == 200, await r.text()

    # What the cost model says: prompt tokens n, of which "a" holds the prefix's full blocks.
    n = len(tokenize(prompt(1), VOCAB))
    uncached = n - len(PREFIX) // 4 // BLOCK * BLOCK
    switch = next(k for k in range(100) if (k + 1) * uncached >= n)  # k queued ahead on "a"
    assert switch >= 4, (n, uncached)  # affinity must hold under a real queue

    url = f"http://127.0.0.1:{gateway.port}/v1/completions"
    pending: list[asyncio.Task] = []

    async def stream(user: int) -> None:
        body = {"model": "m", "prompt": prompt(user), "max_tokens": 2, "stream": True}
        async with client.post(url, json=body) as r:
            await r.read()

    went = []
    try:
        for k in range(switch + 2):
            before = (await seen(client, a), await seen(client, b))
            pending.append(asyncio.create_task(stream(k + 1)))

            async def landed(before=before) -> bool:
                return (await seen(client, a), await seen(client, b)) != before

            await eventually(landed, what=f"request {k} reached a sim")
            went.append("a" if await seen(client, a) > before[0] else "b")
        # While k queued requests' prefill is less than recomputing the prefix, "a".
        assert went[:switch] == ["a"] * switch, (went, switch)
        assert went[switch] == "b", (went, switch)
    finally:
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(BaseException):
                await task
