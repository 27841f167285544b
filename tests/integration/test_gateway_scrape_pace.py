"""The gateway's scraper against real sim engines: a replica serving a request is scraped at
the busy pace, idle ones back off (a fleet of hundreds stays cheap), and the busy one's
metrics show its request while it runs."""

from __future__ import annotations

import asyncio

import aiohttp

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import StaticDiscovery
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scraper import Scraper
from llmplane.gateway.upstream_client import UpstreamPool
from llmplane.runtime.endpoint import Endpoint
from llmplane.testing import Processes, eventually, sim_process


async def test_idle_sims_are_scraped_less_often_than_a_busy_one() -> None:
    with Processes() as procs:
        sims = procs.start(*(sim_process("m", "--time-scale", "1") for _ in range(3)))
        scraper = Scraper(GatewayConfig())
        states = [EndpointState(Endpoint(f"{s.host}:{s.port}", engine="sim")) for s in sims]
        busy, idle = states[0], states[1:]
        body = {"model": "m", "prompt": "hello", "max_tokens": 4000, "ignore_eos": True,
                "stream": True}  # fmt: skip
        try:
            # A long streamed request keeps the first sim running (time scale 1: several
            # seconds of decoding).
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{sims[0].url}/v1/completions", json=body) as r,
            ):
                await r.content.readline()
                for s in states:
                    scraper.add(s)
                await eventually(
                    lambda: busy.running == 1, 5, what="the busy sim's running request"
                )
                # Each idle scrape doubles the pause (100, 200, 400, 800, 1600 ms, at most
                # 2 s): after five, the idle ones are backed off.
                await eventually(
                    lambda: all(scraper.scrapes[s.key] >= 5 for s in idle),
                    15,
                    what="five scrapes of each idle sim",
                )
                start = dict(scraper.scrapes)
                # A window of 30 busy scrapes (about 1.5 s at 50 ms).
                await eventually(
                    lambda: scraper.scrapes[busy.key] - start[busy.key] >= 30,
                    15,
                    what="30 scrapes of the busy sim",
                )
                counts = {s.key: scraper.scrapes[s.key] - start[s.key] for s in states}
                assert busy.running == 1, "the request ended early: the window was not busy"
            # 50 ms while busy; idle ones are near one per 2 s by now.
            for s in idle:
                assert counts[s.key] <= counts[busy.key] / 3, counts
                # Backed off, yet fresh for admission and scoring, and read as idle.
                assert s.metrics_fresh(GatewayConfig().metrics_staleness)
                assert s.has_load_metrics and s.running == 0 and s.waiting == 0
        finally:
            await scraper.close()


def _chat(address: str) -> bytes:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (address.encode(), len(body), body)
    )


async def test_scrapes_keep_the_connection_a_routed_request_reuses() -> None:
    """With the proxy's pool, /metrics goes over its keep-alive connections: the first request
    to an idle replica finds the scrape's connection open instead of connecting (the tail of
    single requests through a 200-replica fleet, docs/benchmarks.md)."""
    with Processes() as procs:
        sim, other = procs.start(sim_process("m"), sim_process("m"))
        pool = UpstreamPool(limit=1)
        scraper = Scraper(GatewayConfig(), upstream=lambda: pool)
        state = EndpointState(Endpoint(sim.address, engine="sim"))
        try:
            assert await scraper.scrape_once(state), "the scrape failed"
            assert state.has_load_metrics and state.scraped_at > 0
            assert pool.connections(sim.address) == 1, "the scrape's connection was not kept"
            (scraped,) = pool._idle[sim.address]
            status, _, _ = await pool.request(sim.address, _chat(sim.address), 10)
            assert status == 200
            assert pool.connections(sim.address) == 1, "the request opened its own connection"
            assert pool._idle[sim.address] == [scraped]
            # At the limit (1), the idle connection to one replica makes room for another
            # replica's request instead of making it wait.
            async with asyncio.timeout(10):
                status, _, _ = await pool.request(other.address, _chat(other.address))
            assert status == 200
            assert pool.connections(sim.address) == 0 and pool.connections(other.address) == 1
        finally:
            await scraper.close()
            await pool.close()


async def test_the_gateway_scrapes_over_its_proxy_pool(gateways) -> None:
    with Processes() as procs:
        (sim,) = procs.start(sim_process("m"))
        gateway = await gateways(None, StaticDiscovery([Endpoint(sim.address, {}, "m")]))
        assert gateway.proxy.pool is not None
        assert gateway.scraper.upstream is not None
        assert gateway.scraper.upstream() is gateway.proxy.pool
        await eventually(
            lambda: gateway.proxy.pool.connections(sim.address) >= 1,
            10,
            what="the scrape's connection in the proxy's pool",
        )
