"""Flow control against an engine with room: a gateway (default saturation rule, flow control
on) in front of a real sim engine with 16 sequence slots. Once the gateway has seen what the
engine holds, a burst below that (but above ``saturationQueue``) goes straight to the engine,
never through the gateway's flow-control queue; a burst beyond it still waits there (read from
/metrics: ``llmplane_gateway_flow_wait_seconds_count`` counts requests dispatched from the
queue). An engine whose concurrency is configured (``Endpoint.spec.maxNumSeqs``; the embedded
runtime takes it from the engine's ``--max-num-seqs``) has that room from its first burst.
Requests the sim counts as waiting until its next step do not lower the learned capacity. A
request held because the engine's KV cache was full goes when the gateway sees a request
finish, without waiting for the next scrape."""

from __future__ import annotations

import asyncio
import itertools

import aiohttp

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.gateway.server import Gateway
from llmplane.testing import eventually
from tests.integration.flowcontrol_gateway import held

MODEL = "m"
SLOTS = 16
TOKENS = 120  # about a second per request at --time-scale 1: many scrapes while it runs


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


async def test_requests_the_sim_counts_as_waiting_until_its_next_step_keep_the_capacity(
    gateways, store, processes, client
):
    # The sim (like vLLM) counts a request as waiting until its next step schedules it: a scrape
    # at that moment shows waiting requests while most slots are free. Small bursts well within
    # the 16 slots until several scrapes right after one that saw nothing waiting have caught
    # such requests: none of those lowers the learned capacity (the scrape after one may, if
    # requests still wait then: that is a queue).
    sim = processes.sim(MODEL, "--max-num-seqs", str(SLOTS))
    store.apply(endpoint_object("sim", sim.address, MODEL, engine="vllm"))
    gw = await gateways(store, config=GatewayConfig())
    await eventually(
        lambda: gw.registry.states and all(s.has_load_metrics for s in gw.registry.states.values()),
        what="the sim scraped",
    )
    state = next(iter(gw.registry.states.values()))
    assert await burst(client, gw, 2 * SLOTS, "learn") == [200] * (2 * SLOTS)
    assert state.capacity >= SLOTS
    # Every scrape applied, in order: (scraped_at, waiting, running, capacity). The scraper
    # sleeps between two scrapes of the endpoint, so this 2 ms poll sees each one.
    scrapes = [(state.scraped_at, state.waiting, state.running, state.capacity)]

    def transient() -> list[tuple[float, float]]:
        """(capacity before, after) of the scrapes that saw requests waiting with slots free
        right after a scrape that saw none waiting."""
        return [
            (before[3], after[3])
            for before, after in itertools.pairwise(scrapes)
            if before[1] == 0 and after[1] > 0 and after[1] + after[2] <= SLOTS
        ]

    async def watch() -> None:
        while True:
            if state.scraped_at != scrapes[-1][0]:
                scrapes.append((state.scraped_at, state.waiting, state.running, state.capacity))
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch())
    try:
        for i in range(400):
            if len(transient()) >= 3:
                break
            responses = await asyncio.gather(
                *(
                    client.post(
                        f"http://127.0.0.1:{gw.port}/v1/completions",
                        json={"model": MODEL, "prompt": f"small {i} {j}", "max_tokens": 4},
                    )
                    for j in range(4)
                )
            )
            for r in responses:
                await r.read()
                assert r.status == 200
                r.release()
    finally:
        watcher.cancel()
    caught = transient()
    assert len(caught) >= 3, "no scrape caught a just-arrived request waiting in the sim"
    assert all(after >= before for before, after in caught), caught


async def test_a_request_held_for_kv_goes_when_a_request_finishes_not_at_the_next_scrape(
    gateways, store, processes, client
):
    # The stand-in upstream reports its KV use as running / --max-running: full at 2. Scraped
    # once by hand while 2 run, never again (hour-long intervals): a third request waits in
    # flow control, and goes when the gateway sees one of the two finish.
    up = processes.upstream(MODEL, "--max-running", "2", "--delay", "1.5")
    store.apply(endpoint_object("up", up.address, MODEL, engine="vllm"))
    hour = 3600.0
    config = GatewayConfig(scrape_interval=hour, scrape_idle_interval=hour, metrics_staleness=hour)
    gw = await gateways(store, config=config)
    await eventually(
        lambda: gw.registry.states and all(s.has_load_metrics for s in gw.registry.states.values()),
        what="the upstream scraped once",
    )
    state = next(iter(gw.registry.states.values()))
    url = f"http://127.0.0.1:{gw.port}/v1/completions"

    async def one(tag: str) -> int:
        async with client.post(url, json={"model": MODEL, "prompt": tag, "max_tokens": 2}) as r:
            await r.read()
            return r.status

    first = [asyncio.create_task(one(f"first {i}")) for i in range(2)]
    await eventually(lambda: state.inflight == 2, what="two requests in flight")
    assert await gw.scraper.scrape_once(state)
    assert (state.running, state.kv_usage) == (2, 1.0), "scraped while both run"
    scrapes = gw.scraper.scrapes[state.key]
    third = asyncio.create_task(one("third"))
    await eventually(lambda: gw.flow.waiting() == 1, what="the third held in flow control")
    assert await asyncio.gather(*first) == [200, 200]
    # Without a scrape in between (none is due for an hour), the third went and completed.
    await eventually(third.done, timeout=20, what="the third request released and answered")
    assert third.result() == 200
    assert gw.scraper.scrapes[state.key] == scrapes
    assert held(gw) == 1
