"""Flow control in front of upstreams whose load gauges say nothing runs (``registry.unseen_load``):
the stand-in upstream with ``--zero-metrics`` and with ``--fixed`` (a fixed completion, as
the gateway benchmark's nginx upstream answers). Once the gateway has sent them
requests that their gauges never showed, they are scheduled on its in-flight count: a burst
beyond what it had learned they hold is not held in the flow-control queue (which held almost
every request of a closed loop of 32 clients before). A sim, which reports what it runs, is
still held when saturated."""

from __future__ import annotations

import asyncio

import aiohttp

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.gateway.registry import UNSEEN_LOAD, EndpointState
from llmplane.gateway.server import Gateway
from llmplane.testing import eventually
from tests.integration.flowcontrol_gateway import held

MODEL = "m"


async def burst(client: aiohttp.ClientSession, gw: Gateway, model: str, n: int) -> list[int]:
    async def one(i: int) -> int:
        async with client.post(
            f"http://127.0.0.1:{gw.port}/v1/completions",
            json={"model": model, "prompt": f"hello {i}", "max_tokens": 40, "ignore_eos": True},
        ) as r:
            await r.read()
            return r.status

    return await asyncio.gather(*(one(i) for i in range(n)))


async def only_state(gw: Gateway) -> EndpointState:
    await eventually(
        lambda: (
            gw.registry.states
            and all(s.has_load_metrics is not None for s in gw.registry.states.values())
        ),
        what="the endpoint scraped",
    )
    return next(iter(gw.registry.states.values()))


async def test_a_burst_onto_an_upstream_whose_gauges_say_nothing_runs_is_not_held(
    gateways, store, processes, client
):
    up = processes.upstream(MODEL, "--zero-metrics", "--delay", "1.0", "--max-running", "1024")
    store.apply(endpoint_object("up", up.address, MODEL, engine="vllm"))
    config = GatewayConfig()
    assert config.flow_control and config.saturation_queue == 5  # the defaults under test
    gw = await gateways(store, config=config)
    state = await only_state(gw)
    assert state.has_load_metrics  # vLLM-shaped gauges: taken at their word at first

    # A first burst: held beyond saturationQueue (nothing known), and seen in flight at the
    # scrapes while the upstream says nothing runs.
    first = asyncio.create_task(burst(client, gw, MODEL, 12))
    await eventually(lambda: state.has_load_metrics is False, what="its gauges given up")
    assert await first == [200] * 12
    learned = state.capacity
    before = held(gw)
    assert before > 0  # held while the gauges were believed

    # Far beyond what was seen in flight (and below saturationInflight): none of it waits.
    n = 40
    assert n > learned + config.saturation_queue and n < config.saturation_inflight
    assert await burst(client, gw, MODEL, n) == [200] * n
    assert held(gw) == before
    assert state.has_load_metrics is False and state.unseen == UNSEEN_LOAD


async def test_a_closed_loop_in_front_of_a_fixed_answer_is_not_held(
    gateways, store, processes, client
):
    fixed = processes.upstream("bench", "--fixed")
    try:
        store.apply(endpoint_object("fixed", fixed.address, "bench"))
        gw = await gateways(store, config=GatewayConfig())
        state = await only_state(gw)
        url = f"http://127.0.0.1:{gw.port}/v1/chat/completions"
        body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}
        stop = asyncio.Event()

        async def loop() -> int:
            done = 0
            while not stop.is_set():
                async with client.post(url, json=body) as r:
                    await r.read()
                    assert r.status == 200
                done += 1
            return done

        clients = [asyncio.create_task(loop()) for _ in range(32)]
        try:
            await eventually(
                lambda: state.has_load_metrics is False,
                timeout=30,
                what="the upstream's gauges given up while 32 clients loop",
            )
            # Those held before (counted when dispatched) leave the queue; none joins it.
            await eventually(lambda: gw.flow.waiting() == 0, what="the queue drained")
            before = held(gw)
            start = sum(gw.scraper.scrapes.values())
            # Several scrapes later, still looping: nothing more was held.
            await eventually(
                lambda: sum(gw.scraper.scrapes.values()) >= start + 5, what="five more scrapes"
            )
        finally:
            stop.set()
            counts = await asyncio.gather(*clients)
        assert sum(counts) > 0
        assert held(gw) == before
    finally:
        fixed.stop()


async def test_a_sim_that_reports_its_load_is_still_held_when_saturated(
    gateways, store, processes, client
):
    sim = processes.sim(MODEL, "--max-num-seqs", "4")
    store.apply(endpoint_object("sim", sim.address, MODEL, engine="vllm"))
    gw = await gateways(store, config=GatewayConfig())
    state = await only_state(gw)
    gave_up = False

    async def watch() -> None:
        nonlocal gave_up
        while True:
            gave_up = gave_up or state.has_load_metrics is False
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch())
    try:
        assert await burst(client, gw, MODEL, 24) == [200] * 24
    finally:
        watcher.cancel()
    assert not gave_up and state.has_load_metrics
    assert held(gw) > 0
