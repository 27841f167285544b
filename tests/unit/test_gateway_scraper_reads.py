"""The gateway's engine scraper (``llmplane.gateway.scraper.Scraper``) against a real HTTP
server on 127.0.0.1 (aiohttp) whose ``/metrics`` and ``/v1/models`` the test controls: what a
scrape reads into an endpoint's state, engines without metrics, failures, and the per-endpoint
background task. (Its pace: test_gateway_scraper.py.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from llmplane.aio import PAGE_MAX_BYTES
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scraper import Scraper
from llmplane.gateway.upstream_client import UpstreamPool
from llmplane.runtime.endpoint import Endpoint
from llmplane.testing import eventually

VLLM_PAGE = b"""# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
vllm:num_requests_waiting_by_priority{model_name="m"} 99.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2.0
vllm:num_requests_running{model_name="m-lora"} 1.0
vllm:kv_cache_usage_perc{model_name="m"} 0.25
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 1.0
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,legal",waiting_lora_adapters="chat"} 2.0
vllm:prefix_cache_queries_total{model_name="m"} 100.0
vllm:prefix_cache_hits_total{model_name="m"} 40.0
"""
SGLANG_PAGE = b"""sglang:num_queue_reqs 5
sglang:num_running_reqs 7
sglang:token_usage 0.5
"""


@dataclass
class Engine:
    """What the test server answers; ``hits`` counts requests per path."""

    metrics: bytes = VLLM_PAGE
    metrics_status: int = 200
    metrics_delay: float = 0.0
    models: bytes = b'{"object": "list", "data": [{"id": "m"}, {"id": "sql"}]}'
    hits: dict[str, int] = field(default_factory=dict)

    async def handle(self, request: web.Request) -> web.Response:
        self.hits[request.path] = self.hits.get(request.path, 0) + 1
        if request.path == "/metrics":
            await asyncio.sleep(self.metrics_delay)
            return web.Response(body=self.metrics, status=self.metrics_status)
        if request.path == "/v1/models":
            return web.Response(body=self.models, content_type="application/json")
        return web.Response(status=404)


@pytest.fixture
async def engine() -> AsyncIterator[tuple[Engine, str]]:
    behaviour = Engine()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", behaviour.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield behaviour, f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def scraper() -> AsyncIterator[Scraper]:
    s = Scraper(GatewayConfig(scrape_interval=0.02, scrape_timeout=0.5))
    try:
        yield s
    finally:
        await s.close()


def state_of(address: str, engine: str = "vllm") -> EndpointState:
    return EndpointState(Endpoint(address, model_name="m", engine=engine))


async def test_a_scrape_sets_load_kv_and_lora_from_the_engine_page(engine, scraper) -> None:
    _, address = engine
    state = state_of(address)
    state.inflight = 4
    before = time.monotonic()
    assert await scraper.scrape_once(state)
    assert (state.waiting, state.running) == (3.0, 3.0)  # summed over model_name; no prefix match
    assert state.has_kv and state.kv_usage == 0.25
    assert state.has_load_metrics and state.scrape_ok and state.scraped_at >= before
    assert state.inflight_at_scrape == 4
    # The newest lora_requests_info sample (largest timestamp value) wins.
    assert state.lora_running == {"sql", "legal"} and state.lora_waiting == {"chat"}
    assert state.max_lora == 4
    assert (state.prefix_queries, state.prefix_hits) == (100.0, 40.0)


async def test_an_unknown_engine_is_read_with_every_table(engine, scraper) -> None:
    behaviour, address = engine
    behaviour.metrics = SGLANG_PAGE
    state = state_of(address, engine="my-fork")
    assert await scraper.scrape_once(state)
    assert (state.waiting, state.running, state.kv_usage) == (5.0, 7.0, 0.5)


async def test_engines_without_metrics(engine, scraper) -> None:
    behaviour, address = engine
    # An engine known to have none is not even asked.
    ollama = state_of(address, engine="ollama")
    assert await scraper.scrape_once(ollama)
    assert ollama.has_load_metrics is False and behaviour.hits == {}
    # No /metrics: answered 404, so scheduled on the gateway's own counts, and healthy.
    behaviour.metrics_status = 404
    state = state_of(address)
    assert await scraper.scrape_once(state)
    assert state.has_load_metrics is False and state.scrape_ok
    # A page with none of the names: the same.
    behaviour.metrics_status, behaviour.metrics = 200, b"process_cpu_seconds_total 1.0\n"
    state = state_of(address)
    assert await scraper.scrape_once(state)
    assert state.has_load_metrics is False and state.scraped_at == 0.0


async def test_a_failing_slow_or_absent_engine_is_not_scrape_ok(engine, scraper) -> None:
    behaviour, address = engine
    state = state_of(address)
    assert await scraper.scrape_once(state) and state.scrape_ok
    behaviour.metrics_status = 500
    assert not await scraper.scrape_once(state)
    assert not state.scrape_ok
    behaviour.metrics_status, behaviour.metrics_delay = 200, 2.0  # over scrape_timeout
    started = time.monotonic()
    assert not await scraper.scrape_once(state)
    assert not state.scrape_ok and time.monotonic() - started < 1.5
    nobody = state_of("127.0.0.1:9")  # discard port: nothing listens
    assert not await scraper.scrape_once(nobody)
    assert not nobody.scrape_ok


async def test_served_models_come_from_v1_models(engine, scraper) -> None:
    behaviour, address = engine
    state = state_of(address)
    await scraper.refresh_models(state)
    assert state.served_models == {"m", "sql"}
    behaviour.models = b"{not json"  # a broken answer keeps what was known
    await scraper.refresh_models(state)
    assert state.served_models == {"m", "sql"}


async def test_the_background_task_follows_the_engine_until_removed(engine, scraper) -> None:
    behaviour, address = engine
    state = state_of(address)
    scraper.add(state)
    scraper.add(state)  # idempotent: one task per endpoint
    assert len(scraper.tasks) == 1
    await eventually(lambda: state.served_models and state.waiting == 3.0, what="first scrape")
    behaviour.metrics = VLLM_PAGE.replace(
        b'waiting{model_name="m"} 3.0', b'waiting{model_name="m"} 8.0'
    )
    await eventually(lambda: state.waiting == 8.0, what="the new queue length")
    task = scraper.tasks[state.key]
    scraper.remove(state)
    await asyncio.wait([task], timeout=5)
    assert task.cancelled() and scraper.tasks == {}


async def test_close_stops_every_task_and_the_session(engine) -> None:
    _, address = engine
    scraper = Scraper(GatewayConfig(scrape_interval=0.02))
    states = [state_of(address), EndpointState(Endpoint("127.0.0.1:9", engine="vllm"))]
    for s in states:
        scraper.add(s)
    await eventually(lambda: states[0].has_load_metrics, what="a scrape")
    tasks = list(scraper.tasks.values())
    await scraper.close()
    assert all(t.done() for t in tasks) and scraper.tasks == {} and scraper.session is None


@dataclass
class Sharing:
    """A ``ScrapeSharing`` that records what the scraper tells it; it follows ``peer``'s
    addresses (as a worker whose peer scrapes them)."""

    peer: set[str]
    published: list[tuple[str, bool]] = field(default_factory=list)
    models: list[tuple[str, frozenset[str] | None]] = field(default_factory=list)

    def follows(self, state: EndpointState) -> bool:
        return state.address in self.peer

    def publish(self, state: EndpointState, kept: bool) -> None:
        self.published.append((state.address, kept))

    def models_read(self, state: EndpointState, started: float) -> None:
        self.models.append((state.address, state.served_models))


async def test_the_sharing_given_to_the_scraper_hears_each_scrape_and_model_list(engine) -> None:
    """With several workers the scraper gets its sharing at construction: a state the sharing
    follows gets no task here; every other is published after each scrape, and its changed
    model list is passed on."""
    _, address = engine
    sharing = Sharing(peer={"127.0.0.1:9"})
    scraper = Scraper(GatewayConfig(scrape_interval=0.02), sharing=sharing)
    try:
        scraper.add(EndpointState(Endpoint("127.0.0.1:9", engine="vllm")))
        assert scraper.tasks == {}  # its peer reads it
        scraper.add(state_of(address))
        await eventually(lambda: len(sharing.published) >= 2, what="two scrapes published")
        assert {a for a, _ in sharing.published} == {address}
        assert sharing.models == [(address, frozenset({"m", "sql"}))]
    finally:
        await scraper.close()


@pytest.mark.parametrize("pooled", [False, True], ids=["session", "upstream-pool"])
async def test_a_page_over_the_limit_is_not_read(engine, pooled, caplog) -> None:
    """A /metrics page larger than PAGE_MAX_BYTES (a broken or hostile server) is a failed
    scrape, over either client the scraper uses, and says why in the log."""
    behaviour, address = engine
    pool = UpstreamPool()
    scraper = Scraper(GatewayConfig(scrape_timeout=5), upstream=lambda: pool if pooled else None)
    state = state_of(address)
    try:
        assert await scraper.scrape_once(state) and state.waiting == 3
        behaviour.metrics = VLLM_PAGE + b"# " + b"x" * PAGE_MAX_BYTES + b"\n"
        assert not await scraper.scrape_once(state)
        assert not state.scrape_ok
        assert f"{address}/metrics is not read: a " in caplog.text
    finally:
        await scraper.close()
        await pool.close()
