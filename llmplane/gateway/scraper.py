"""Engine load metrics and served models, read per endpoint (docs/gateway.md, "Metrics
scraping"): a busy endpoint's /metrics every ``scrape_interval``, an idle one's after a pause
that doubles up to ``scrape_idle_interval`` (a scrape costs a vLLM API server about a
millisecond of CPU and an access-log line), its figures kept fresh meanwhile by one ticker
while nothing is sent to it. Only the few lines routing needs are read, by ``bytes.find``: a
vLLM page is tens of kilobytes of histograms that a Prometheus parser would turn into
thousands of objects 20 times a second per replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Protocol

import aiohttp
import orjson

from llmplane.aio import PAGE_MAX_BYTES, BodyTooLarge, read_bounded, wait_event
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.registry import UNSEEN_LOAD, EndpointState, scraped_room, unseen_load
from llmplane.gateway.upstream_client import UpstreamPool

log = logging.getLogger("llmplane.gateway")


@dataclass(frozen=True)
class MetricNames:
    """An engine's names for each ``LoadMetrics`` figure: the first name present is read, the
    sum of its samples (``kv``: the largest); newer names come first."""

    waiting: tuple[bytes, ...] = ()
    running: tuple[bytes, ...] = ()
    kv: tuple[bytes, ...] = ()
    prefix_hits: tuple[bytes, ...] = ()
    prefix_queries: tuple[bytes, ...] = ()
    kv_received: tuple[bytes, ...] = ()
    ttft_sum: tuple[bytes, ...] = ()
    ttft_count: tuple[bytes, ...] = ()
    lora: bytes | None = None  # an info gauge: the adapters running and waiting, as labels
    cache_info: bytes | None = None  # an info gauge: the KV ``block_size`` label


VLLM = MetricNames(
    waiting=(b"vllm:num_requests_waiting",),
    running=(b"vllm:num_requests_running",),
    kv=(b"vllm:kv_cache_usage_perc", b"vllm:gpu_cache_usage_perc"),
    prefix_hits=(b"vllm:prefix_cache_hits_total", b"vllm:gpu_prefix_cache_hits_total"),
    prefix_queries=(b"vllm:prefix_cache_queries_total", b"vllm:gpu_prefix_cache_queries_total"),
    kv_received=(b"vllm:external_prefix_cache_hits_total",),
    ttft_sum=(b"vllm:time_to_first_token_seconds_sum",),
    ttft_count=(b"vllm:time_to_first_token_seconds_count",),
    lora=b"vllm:lora_requests_info",
    cache_info=b"vllm:cache_config_info",
)
SGLANG = MetricNames(
    waiting=(b"sglang:num_queue_reqs",),
    running=(b"sglang:num_running_reqs",),
    kv=(b"sglang:token_usage",),
    ttft_sum=(b"sglang:time_to_first_token_seconds_sum",),
    ttft_count=(b"sglang:time_to_first_token_seconds_count",),
)
LLAMACPP = MetricNames(
    waiting=(b"llamacpp:requests_deferred",),
    running=(b"llamacpp:requests_processing",),
    kv=(b"llamacpp:kv_cache_usage_ratio",),
)
TGI = MetricNames(waiting=(b"tgi_queue_size",), running=(b"tgi_batch_current_size",))
NONE = MetricNames()

ENGINE_METRICS: dict[str, MetricNames] = {
    "vllm": VLLM,
    "sim": VLLM,
    "sglang": SGLANG,
    "llamacpp": LLAMACPP,
    "tgi": TGI,
    "ollama": NONE,
}
# Other names backends and Endpoint objects give an engine type.
_ALIASES = {
    "llama.cpp": "llamacpp",
    "llama-cpp": "llamacpp",
    "text-generation-inference": "tgi",
    "llmplane-sim": "sim",
}
# The figures read from samples (the rest are info gauges' labels).
_FIGURES = [f.name for f in fields(MetricNames) if f.default == ()]


def engine_of(backend: str | None) -> str:
    """The engine type a backend or Endpoint names: a known name or alias, else a name that
    contains one ("vllm-openai"), else the name as it is (every metrics table is tried); no
    name: vllm."""
    if not backend:
        return "vllm"
    name = backend.lower()
    for known in (name, *ENGINE_METRICS, *_ALIASES):
        if known in name:
            engine = _ALIASES.get(known, known)
            if engine in ENGINE_METRICS:
                return engine
    return name


def metric_names(engine: str) -> MetricNames | None:
    """The engine's names; None for an unknown engine (every table is tried)."""
    return ENGINE_METRICS.get(engine_of(engine)) if engine else None


def _samples(body: bytes, name: bytes) -> Iterator[tuple[bytes, float]]:
    """(labels text, value) of every sample of ``name``; skips names that only share a prefix."""
    pos = 0 if body.startswith(name) else body.find(b"\n" + name)
    if pos > 0:
        pos += 1
    while pos != -1:
        after = pos + len(name)
        pos = body.find(b"\n" + name, after)  # the next line of it
        if pos != -1:
            pos += 1
        nxt = body[after : after + 1]
        if nxt not in (b"{", b" "):
            continue
        end = body.find(b"\n", after)
        line = body[after:] if end == -1 else body[after:end]
        labels = b""
        if nxt == b"{":
            close = line.rfind(b"}")
            labels, line = line[1:close], line[close + 1 :]
        try:
            value = float(line.split(maxsplit=1)[0])
        except (ValueError, IndexError):
            continue  # not a number
        yield labels, value


def _read(
    body: bytes, names: tuple[bytes, ...], combine: Callable[[list[float]], float]
) -> float | None:
    """``combine`` of the samples of the first of ``names`` that has any; None if none has."""
    for name in names:
        values = [v for _, v in _samples(body, name)]
        if values:
            return combine(values)
    return None


_LABEL = re.compile(rb'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class LoadMetrics:
    waiting: float | None = None
    running: float | None = None
    kv: float | None = None
    lora_running: frozenset[str] = frozenset()
    lora_waiting: frozenset[str] = frozenset()
    max_lora: int = 0
    prefix_hits: float | None = None  # prompt tokens found cached (console and /metrics)
    prefix_queries: float | None = None  # prompt tokens looked up
    block_size: int = 0
    kv_received: float | None = None  # prompt tokens whose KV came over the KV connector
    ttft_sum: float | None = None  # the time-to-first-token histogram (autoscaling)
    ttft_count: float | None = None

    @property
    def any(self) -> bool:
        return self.waiting is not None or self.running is not None or self.kv is not None


def adapter_names(value: bytes) -> frozenset[str]:
    """The names in a comma-separated list of LoRA adapters."""
    return frozenset(a for a in value.decode("utf-8", "replace").split(",") if a)


def parse_metrics(body: bytes, engine: str) -> LoadMetrics:
    """The figures of the engine's table (an unknown engine's: of the first table with any)."""
    names = metric_names(engine)
    for table in [names] if names is not None else [VLLM, SGLANG, LLAMACPP, TGI]:
        m = LoadMetrics(
            **{f: _read(body, getattr(table, f), max if f == "kv" else sum) for f in _FIGURES}
        )
        if not m.any:
            continue
        newest: tuple[float, bytes] | None = None  # the adapters' gauge is set to a timestamp
        for labels, value in _samples(body, table.lora) if table.lora else ():
            if newest is None or value >= newest[0]:
                newest = (value, labels)
        if newest is not None:
            lora = dict(_LABEL.findall(newest[1]))
            m.lora_running = adapter_names(lora.get(b"running_lora_adapters", b""))
            m.lora_waiting = adapter_names(lora.get(b"waiting_lora_adapters", b""))
            with contextlib.suppress(ValueError):
                m.max_lora = int(float(lora.get(b"max_lora", b"0") or 0))
        for labels, _ in _samples(body, table.cache_info) if table.cache_info else ():
            size = dict(_LABEL.findall(labels)).get(b"block_size", b"")
            if size.isdigit() and 0 < int(size) <= 65_536:
                m.block_size = int(size)
                break
        return m
    return LoadMetrics()


def apply_metrics(
    state: EndpointState, m: LoadMetrics, now: float, inflight_at_start: int | None = None
) -> None:
    """``inflight_at_start``: the gateway's in-flight count when the scrape was sent. A
    request sent while the scrape was on the wire is probably not in the engine's figures, so
    the queue estimate keeps counting it (see ``registry.queue_estimates``), and the engine's
    capacity and room are learned from it (``registry.scraped_room``)."""
    waited = state.waiting > 0 and bool(state.scraped_at)  # the scrape before this one
    sent = state.inflight if inflight_at_start is None else inflight_at_start
    state.waiting, state.running = m.waiting or 0.0, m.running or 0.0
    state.has_kv, state.kv_usage = m.kv is not None, m.kv or 0.0
    state.lora_running, state.lora_waiting = m.lora_running, m.lora_waiting
    state.max_lora = m.max_lora
    if m.prefix_queries is not None:
        state.prefix_hits, state.prefix_queries = m.prefix_hits or 0.0, m.prefix_queries
    state.block_size = m.block_size or state.block_size
    state.kv_received = -1.0 if m.kv_received is None else m.kv_received
    state.unseen = unseen_load(state.unseen, state.waiting, state.running, sent) if m.any else 0
    state.has_load_metrics = m.any and state.unseen < UNSEEN_LOAD  # see ``unseen_load``
    state.scraped_at = now if m.any else 0.0
    state.inflight_at_scrape = sent
    state.capacity, state.room = scraped_room(
        state.capacity, state.waiting, state.running, sent, waited, state.endpoint.max_num_seqs
    )
    if m.ttft_sum is None or m.ttft_count is None:
        state.ttft = -1.0
    elif not (math.isfinite(m.ttft_sum) and math.isfinite(m.ttft_count)):
        state.ttft, state.ttft_seen = -1.0, (-1.0, -1.0)  # NaN or Inf: not a reading
    else:
        state.observe_ttft(m.ttft_sum, m.ttft_count, bool(state.waiting or state.running or sent))
    state.scrape_ok = True


# EndpointState.extra key: when the gateway itself changed the endpoint's model list (LoRA).
MODELS_CHANGED_AT = "models_changed_at"
# What one engine's /v1/models may name: past these, names are left out (a hostile or broken
# engine costs little, and the list fits the workers' shared document).
MAX_SERVED_NAMES = 1024
MAX_NAME_CHARS = 512


def served_names(data: object) -> frozenset[str] | None:
    """The model names of a /v1/models ``data`` list (None if it is not one): each entry's
    ``id``, at most ``MAX_SERVED_NAMES`` of them, none longer than ``MAX_NAME_CHARS``."""
    if not isinstance(data, list):
        return None
    names: set[str] = set()
    for entry in data:
        if isinstance(entry, dict) and entry.get("id") is not None:
            name = str(entry["id"])
            if len(name) <= MAX_NAME_CHARS:
                names.add(name)
                if len(names) >= MAX_SERVED_NAMES:
                    break
    return frozenset(names)


class ScrapeSharing(Protocol):
    """With several workers one scrapes for all (``workers/scrapes.py``): its publisher, or
    another worker's follower of what it publishes. ``follows``: a peer reads this state's
    metrics and models (nothing of it is read here); ``publish``: after a scrape (``kept``:
    the idle ticker keeps its ``scraped_at`` fresh from now); ``models_read``: a changed
    /v1/models list, read from ``started`` on."""

    def follows(self, state: EndpointState) -> bool: ...

    def publish(self, state: EndpointState, kept: bool) -> None: ...

    def models_read(self, state: EndpointState, started: float) -> None: ...


class Scraper:
    """One background task per endpoint, started and stopped as endpoints come and go.

    ``on_scraped`` is called after each scrape and idle refresh (fresh load: flow control may
    dispatch), ``on_models_changed`` when an endpoint's /v1/models list changed (routes
    change). ``upstream``, if given, is the proxy's upstream pool: the engines are read over its
    keep-alive connections, so the first request routed to an idle replica finds a warm
    connection (the scrape keeps it open, within vLLM's 5 s keep-alive), not a TCP connect."""

    def __init__(
        self,
        config: GatewayConfig,
        on_models_changed: Callable[[], None] = lambda: None,
        on_scraped: Callable[[], None] = lambda: None,
        upstream: Callable[[], UpstreamPool | None] = lambda: None,
        sharing: ScrapeSharing | None = None,
    ) -> None:
        self.config = config
        self.on_models_changed = on_models_changed
        self.on_scraped = on_scraped
        self.upstream = upstream
        self.sharing = sharing
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.session: aiohttp.ClientSession | None = None
        self.scrapes: dict[str, int] = {}  # /metrics requests per endpoint (tests, debugging)
        # Idle endpoints: their state and the event that wakes their scraper early.
        self._idle: dict[str, tuple[EndpointState, asyncio.Event]] = {}
        self._keeper: asyncio.Task[None] | None = None

    def client(self) -> aiohttp.ClientSession:
        """The scraper's HTTP session (engine-side admin calls share it)."""
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=256, keepalive_timeout=self.config.keepalive_timeout, ttl_dns_cache=300
                ),
                timeout=aiohttp.ClientTimeout(total=self.config.scrape_timeout),
                skip_auto_headers=("User-Agent",),
            )
        return self.session

    def add(self, state: EndpointState) -> None:
        if state.key in self.tasks or (self.sharing is not None and self.sharing.follows(state)):
            return  # already scraped, or a peer reads it for us
        self.tasks[state.key] = asyncio.create_task(self._run(state), name=f"scrape {state.key}")

    def remove(self, state: EndpointState) -> None:
        task = self.tasks.pop(state.key, None)
        if task is not None:
            task.cancel()
        self._idle.pop(state.key, None)
        self.scrapes.pop(state.key, None)

    async def close(self) -> None:
        tasks = [*self.tasks.values(), *([self._keeper] if self._keeper else [])]
        self.tasks.clear()
        self._idle.clear()
        self._keeper = None
        for task in tasks:  # all cancelled before any is awaited: none starts anything anew
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def scrape_once(self, state: EndpointState) -> bool:
        """One scrape of /metrics; False if the endpoint did not answer."""
        engine = state.endpoint.engine
        if metric_names(engine) is NONE:
            state.has_load_metrics = False
            return True
        self.scrapes[state.key] = self.scrapes.get(state.key, 0) + 1
        sent = state.inflight
        status, body = await self._get(state.address, "/metrics")
        if status == 404:  # no /metrics: scheduled on the in-flight counts
            state.has_load_metrics = False
        elif status != 200:
            state.scrape_ok = False
            return False
        else:
            apply_metrics(state, parse_metrics(body, engine), time.monotonic(), sent)
        state.scrape_ok = True
        return True

    async def refresh_models(self, state: EndpointState) -> None:
        started = time.monotonic()
        status, body = await self._get(state.address, "/v1/models")
        try:
            doc = orjson.loads(body) if status == 200 else None
        except orjson.JSONDecodeError:
            return
        served = served_names(doc.get("data") if isinstance(doc, dict) else None)
        if served is None or served == state.served_models:
            return
        if state.extra.get(MODELS_CHANGED_AT, 0.0) > started:
            return  # an adapter was loaded or unloaded meanwhile: this list may predate it
        state.served_models = served
        if self.sharing is not None:
            self.sharing.models_read(state, started)
        self.on_models_changed()

    async def _get(self, address: str, path: str) -> tuple[int, bytes]:
        """(status, body) of a GET of ``path``; status 0 if the endpoint did not answer, or
        answered with more than ``PAGE_MAX_BYTES``."""
        pool = self.upstream()
        try:
            if pool is not None:
                wire = f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode()
                status, _, body = await pool.request(
                    address, wire, self.config.scrape_timeout, PAGE_MAX_BYTES
                )
                return status, body
            async with self.client().get(f"http://{address}{path}") as resp:
                return resp.status, await read_bounded(resp, PAGE_MAX_BYTES)
        except BodyTooLarge as err:
            log.warning("%s%s is not read: %s", address, path, err)
            return 0, b""
        except (aiohttp.ClientError, TimeoutError, OSError):
            return 0, b""

    async def _run(self, state: EndpointState) -> None:
        interval = self.config.scrape_interval
        idle_max = max(self.config.scrape_idle_interval, interval)
        # The first scrape is at once: until it the endpoint's load is unknown, which scorers
        # treat as neutral and so rank a replica that just became Ready behind idle ones already
        # scraped. The pause after it spreads the endpoints over the period.
        spread = random.random() * interval
        next_models = 0.0
        pause = interval
        while True:
            started = time.monotonic()
            if started >= next_models:
                await self.refresh_models(state)
                next_models = started + self.config.models_refresh_interval
            before = _signals(state)
            try:
                await self.scrape_once(state)
            except Exception:
                log.exception("scraping %s failed", state.address)
            # An engine whose gauges do not show the load (``unseen_load``) is scraped as one
            # that has them: the first scrape that reports a request gives them back.
            healthy = state.scrape_ok and (state.has_load_metrics or blind(state))
            busy = state.inflight or state.running or state.waiting or _signals(state) != before
            pause = (interval if busy else min(pause * 2, idle_max)) if healthy else interval
            kept = bool(healthy and not busy and pause > interval)  # _idle_wait follows
            if self.sharing is not None:
                self.sharing.publish(state, kept)
            self.on_scraped()
            if not healthy:
                # Engines without load metrics (or unreachable ones) are asked again more slowly.
                await asyncio.sleep(max(0.0, max(interval, 1.0) - (time.monotonic() - started)))
                continue
            wait = max(
                0.0, pause * random.uniform(0.8, 1.2) + spread - (time.monotonic() - started)
            )
            spread = 0.0
            if kept:
                await self._idle_wait(state, wait)
            else:
                await asyncio.sleep(wait)

    async def _idle_wait(self, state: EndpointState, seconds: float) -> None:
        """Sleep ``seconds`` unless a request is sent to the endpoint first."""
        wake = asyncio.Event()
        self._idle[state.key] = (state, wake)
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.create_task(self._keep_idle_fresh(), name="scrape idle keeper")
        try:
            await wait_event(wake, seconds)
        finally:
            if self._idle.get(state.key, (None,))[0] is state:
                del self._idle[state.key]

    async def _keep_idle_fresh(self) -> None:
        """One ticker for every idle endpoint: nothing sent to it since its last scrape means its
        engine is as idle as it was (fresh metrics); anything sent wakes its scraper."""
        tick = max(self.config.metrics_staleness / 2, 0.01)
        while self._idle:
            now = time.monotonic()
            refreshed = False
            for state, wake in list(self._idle.values()):
                if state.inflight != state.inflight_at_scrape:
                    wake.set()
                else:
                    refreshed = state.keep_fresh(now) or refreshed
            if refreshed:
                self.on_scraped()  # fresh again: a request held on the stale age may go
            await asyncio.sleep(tick)


def blind(state: EndpointState) -> bool:
    """Whether the engine has load metrics that do not show this gateway's load
    (``registry.unseen_load``)."""
    return state.unseen >= UNSEEN_LOAD


def _signals(state: EndpointState) -> tuple[object, ...]:
    """What routing reads from a scrape; a change keeps the endpoint on the fast interval."""
    return (
        state.waiting,
        state.running,
        round(state.kv_usage, 3),
        state.lora_running,
        state.lora_waiting,
    )
