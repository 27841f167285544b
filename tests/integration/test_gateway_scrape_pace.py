"""The gateway's scraper against real sim engines: a replica serving a request is scraped at
the busy pace, idle ones back off (a fleet of hundreds stays cheap), and the busy one's
metrics show its request while it runs."""

from __future__ import annotations

import asyncio

import aiohttp

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scraper import Scraper
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
                await asyncio.sleep(2.0)  # the idle ones back off (50, 100, 200 ... ms)
                start = dict(scraper.scrapes)
                await asyncio.sleep(2.0)
                counts = {s.key: scraper.scrapes[s.key] - start[s.key] for s in states}
                assert busy.running == 1, "the request ended early: the window was not busy"
            # 50 ms while busy (about 40 in 2 s); idle ones are near one per 2 s by now.
            assert counts[busy.key] >= 12, counts
            for s in idle:
                assert counts[s.key] <= counts[busy.key] / 3, counts
                # Backed off, yet fresh for admission and scoring, and read as idle.
                assert s.metrics_fresh(GatewayConfig().metrics_staleness)
                assert s.has_load_metrics and s.running == 0 and s.waiting == 0
        finally:
            await scraper.close()
