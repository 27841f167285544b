"""Flow control against an engine with room: a gateway (default saturation rule, flow control
on) in front of a real sim engine with 16 sequence slots. Once the gateway has seen what the
engine holds, a burst below that (but above ``saturationQueue``) goes straight to the engine,
never through the gateway's flow-control queue; a burst beyond it still waits there (read from
/metrics: ``llmplane_gateway_flow_wait_seconds_count`` counts requests dispatched from the
queue). An engine whose concurrency is configured (``Endpoint.spec.maxNumSeqs``; the embedded
runtime takes it from the engine's ``--max-num-seqs``) has that room from its first burst."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.gateway.server import Gateway
from llmplane.testing import eventually

MODEL = "m"
SLOTS = 16
TOKENS = 120  # about a second per request at --time-scale 1: many scrapes while it runs


def held(gw: Gateway) -> float:
    """Requests that waited in the flow-control queue so far (every band and tenant)."""
    total = 0.0
    for family in text_string_to_metric_families(gw.metrics.render().decode()):
        for s in family.samples:
            if s.name == "llmplane_gateway_flow_wait_seconds_count":
                total += s.value
    return total


async def burst(client: aiohttp.ClientSession, gw: Gateway, n: int, tag: str) -> list[int]:
    async def one(i: int) -> int:
        async with client.post(
            f"http://127.0.0.1:{gw.port}/v1/completions",
            json={
                "model": MODEL,
                "prompt": f"{tag} {i}",
                "max_tokens": TOKENS,
                "ignore_eos": True,
            },
        ) as r:
            await r.read()
            return r.status

    return await asyncio.gather(*(one(i) for i in range(n)))


async def test_a_burst_within_the_engines_room_is_not_held_and_one_beyond_it_is(
    gateways, store, processes, client
):
    sim = processes.sim(MODEL, "--max-num-seqs", str(SLOTS))
    store.apply(endpoint_object("sim", sim.address, MODEL, engine="vllm"))
    config = GatewayConfig()
    assert config.flow_control and config.saturation_queue == 5  # the defaults under test
    gw = await gateways(store, config=config)
    await eventually(
        lambda: gw.registry.states and all(s.has_load_metrics for s in gw.registry.states.values()),
        what="the sim scraped",
    )
    state = next(iter(gw.registry.states.values()))
    assert state.capacity == 0  # not known yet: a cold burst is held beyond saturationQueue

    # Beyond the engine's slots: held in the gateway, and the engine is seen full at 16.
    assert await burst(client, gw, 2 * SLOTS, "first") == [200] * (2 * SLOTS)
    first = held(gw)
    assert first > 0
    # Seen full at 16 (a request the sim had finished but the gateway had not yet relayed
    # can make it a little more: it counts as held while nothing waits).
    assert state.capacity >= SLOTS
    await eventually(
        lambda: state.room == state.capacity, what="the idle sim scraped: all its slots free"
    )

    # Within its room (12 > saturationQueue 5): none of them waits in the gateway.
    assert await burst(client, gw, SLOTS - 4, "within") == [200] * (SLOTS - 4)
    assert held(gw) == first

    # Beyond it again: held again.
    await eventually(lambda: state.room == state.capacity, what="the sim idle again")
    assert await burst(client, gw, 2 * SLOTS, "beyond") == [200] * (2 * SLOTS)
    assert held(gw) > first
    assert not gw.flow.queues or not any(q.lengths() for q in gw.flow.queues.values())


async def test_a_configured_capacity_gives_room_from_the_first_burst(
    gateways, store, processes, client
):
    sim = processes.sim(MODEL, "--max-num-seqs", str(SLOTS))
    store.apply(endpoint_object("sim", sim.address, MODEL, engine="vllm", max_num_seqs=SLOTS))
    gw = await gateways(store, config=GatewayConfig())
    await eventually(
        lambda: gw.registry.states and all(s.has_load_metrics for s in gw.registry.states.values()),
        what="the sim scraped",
    )
    state = next(iter(gw.registry.states.values()))
    assert (state.capacity, state.room) == (SLOTS, SLOTS)
    assert await burst(client, gw, SLOTS - 4, "cold") == [200] * (SLOTS - 4)
    assert held(gw) == 0
    assert await burst(client, gw, 2 * SLOTS, "beyond") == [200] * (2 * SLOTS)
    assert held(gw) > 0
