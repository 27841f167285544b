"""The scraper's pace: fast for busy endpoints, slow for idle ones, woken by the first request.

Two small HTTP servers stand in for engines' /metrics pages (one reports a running request, one
nothing) and count how often they are asked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scraper import Scraper
from llmplane.runtime.endpoint import Endpoint
from llmplane.testing import eventually

PAGE = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{}} {running}\n"
PAGE += "vllm:num_requests_waiting{{}} 0\nvllm:kv_cache_usage_perc{{}} {kv}\n"


class MetricsPage:
    def __init__(self, running: int) -> None:
        self.running = running
        self.hits = 0
        self.address = ""
        self.on_scrape: Callable[[], None] | None = None  # runs before the page is rendered

    async def handle(self, request: web.Request) -> web.Response:
        if request.path == "/metrics":
            self.hits += 1
            if self.on_scrape is not None:
                self.on_scrape()
            kv = 0.1 * self.running
            return web.Response(text=PAGE.format(running=self.running, kv=kv))
        return web.json_response({"data": [{"id": "m"}]})


@pytest.fixture
async def pages() -> AsyncIterator[Callable[[int], object]]:
    runners: list[web.AppRunner] = []

    async def start(running: int) -> MetricsPage:
        page = MetricsPage(running)
        app = web.Application()
        app.router.add_get("/{tail:.*}", page.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        page.address = f"127.0.0.1:{port}"
        runners.append(runner)
        return page

    yield start  # type: ignore[misc]
    for runner in runners:
        await runner.cleanup()


async def test_idle_endpoints_are_scraped_less_often_than_busy_ones(pages) -> None:
    busy_page, idle_page = await pages(1), await pages(0)
    scraper = Scraper(GatewayConfig())
    busy = EndpointState(Endpoint(busy_page.address))
    idle = EndpointState(Endpoint(idle_page.address))
    try:
        scraper.add(busy)
        scraper.add(idle)
        # 50 ms while busy (30 scrapes: 1.5 s, longer on a slow machine); idle backs off 50,
        # 100, 200, 400, 800 ms ... up to 2 s: about 6 scrapes in that time.
        await eventually(lambda: busy_page.hits >= 30, 15, what="30 scrapes of the busy one")
        assert idle_page.hits <= busy_page.hits / 3, (idle_page.hits, busy_page.hits)
        # The idle endpoint's metrics stay fresh for admission and scoring meanwhile.
        assert idle.metrics_fresh(GatewayConfig().metrics_staleness)
        assert idle.has_load_metrics and idle.running == 0

        # A request sent to the idle endpoint wakes its scraper long before its pause ends
        # (just after a scrape, now at least 0.8 s), and an engine that turned busy is
        # scraped fast again.
        seen = idle.scraped_at
        await eventually(lambda: idle.scraped_at > seen, 5, what="the idle one's next scrape")
        before = idle_page.hits
        idle_page.running = 1
        idle.inflight += 1
        await eventually(lambda: idle_page.hits > before, 0.5, what="the woken scrape")
        assert idle.running == 1
        # 12 scrapes take 0.6 s at the busy pace; backing off, even from 50 ms, over 6 s.
        await eventually(lambda: idle_page.hits - before >= 12, 1.5, what="the busy pace")
    finally:
        await scraper.close()


async def test_a_change_in_signals_keeps_the_fast_pace(pages) -> None:
    page = await pages(0)
    scraper = Scraper(GatewayConfig())
    state = EndpointState(Endpoint(page.address))
    try:
        scraper.add(state)
        # Idle: backed off (the pause after the 5th scrape is 0.8 s, then 1.6 s).
        await eventually(lambda: page.hits >= 6, 10, what="the idle back-off")
        page.running = 2  # the engine got work from elsewhere (another gateway)
        await eventually(lambda: state.running == 2, 5, what="the change to be seen")
        seen = page.hits
        await eventually(lambda: page.hits - seen >= 12, 1.5, what="the fast pace again")
    finally:
        await scraper.close()


async def test_a_new_endpoint_is_scraped_at_once(pages) -> None:
    """A replica that just became Ready must not wait out a jittered first pause: until its first
    scrape its load is unknown and it ranks behind idle replicas already scraped."""
    page = await pages(0)
    scraper = Scraper(GatewayConfig(scrape_interval=60.0, scrape_idle_interval=60.0))
    state = EndpointState(Endpoint(page.address))
    try:
        scraper.add(state)
        await eventually(lambda: state.scraped_at > 0, timeout=2.0, what="the first scrape")
        assert page.hits == 1
    finally:
        await scraper.close()


async def test_a_request_sent_during_a_scrape_still_counts_in_the_queue_estimate(pages) -> None:
    """The engine rendered its page before a request the gateway sent meanwhile reached it: the
    estimate must keep that request, or a saturated engine looks free for a moment (flow
    control then dispatched a Sheddable request past a Critical one still on the wire)."""
    page = await pages(0)
    state = EndpointState(Endpoint(page.address))
    page.on_scrape = lambda: state.add_inflight(1)  # a request sent while the scrape is out
    scraper = Scraper(GatewayConfig())
    try:
        assert await scraper.scrape_once(state)
        assert state.waiting == 0 and state.inflight == 1
        assert state.queue_estimate(GatewayConfig().metrics_staleness) == 1
    finally:
        await scraper.close()
