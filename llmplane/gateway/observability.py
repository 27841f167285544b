"""Prometheus metrics (on the gateway's own registry) and the structured access log.

Every request ends in one ``llmplane.gateway.access`` log line (JSON) with the route, the
endpoint, a summary of the scores and the timings; it costs nothing when that logger is not
enabled for INFO. The CLI writes the lines through ``AccessSink`` (batched, no logging
records); in-process users (tests) get them as records of that logger.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Any, Generic, TypeVar

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from llmplane.gateway.registry import EndpointState

C = TypeVar("C")
access_log = logging.getLogger("llmplane.gateway.access")

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
SCHED_BUCKETS = (
    0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05,
)  # fmt: skip


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class _Labelled(Generic[C]):
    """A labelled metric for the request path: a plain child per label set, no lock.

    prometheus_client's metrics take a lock per update and a Python loop over the buckets per
    observation (about 5 % of the gateway's CPU per request); these are only ever touched
    from the event loop's thread. ``collect`` gives the family, rendered as prometheus_client
    renders its own."""

    def __init__(
        self, name: str, doc: str, labelnames: Sequence[str], child: Callable[[], C]
    ) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], C] = {}
        self._child = child

    def labels(self, *values: str) -> C:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = self._child()
        return child


class Counter(_Labelled[_CounterChild]):
    def __init__(self, name: str, doc: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, doc, labelnames, _CounterChild)

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def collect(self) -> Metric:
        family = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in list(self.children.items()):
            family.add_metric(list(values), child.value)
        return family


class Histogram(_Labelled[_HistogramChild]):
    def __init__(
        self,
        name: str,
        doc: str,
        labelnames: Sequence[str] = (),
        buckets: tuple[float, ...] = LATENCY_BUCKETS,
    ) -> None:
        self.bounds = bounds = tuple(float(b) for b in buckets)
        super().__init__(name, doc, labelnames, lambda: _HistogramChild(bounds))
        self.edges = [repr(b) for b in bounds] + ["+Inf"]

    def observe(self, value: float) -> None:
        self.labels().observe(value)

    def collect(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in list(self.children.items()):
            buckets = list(zip(self.edges, accumulate(child.counts), strict=True))
            family.add_metric(list(values), buckets, child.sum)
        return family


# Per endpoint, from its state at ``now``: (family, metric name, help, value; None leaves the
# endpoint out).
# fmt: off
_PER_ENDPOINT: tuple[tuple[Any, str, str, Callable[[EndpointState, float], float | None]], ...] = (
    (GaugeMetricFamily, "llmplane_gateway_endpoint_inflight", "Requests in flight per endpoint", lambda s, now: s.inflight),
    (GaugeMetricFamily, "llmplane_gateway_endpoint_waiting", "Waiting requests per endpoint, as last scraped", lambda s, now: s.waiting),
    (GaugeMetricFamily, "llmplane_gateway_endpoint_kv_usage", "KV-cache utilisation per endpoint, as last scraped", lambda s, now: s.kv_usage),
    (GaugeMetricFamily, "llmplane_gateway_endpoint_prefill_tokens", "Prompt tokens (estimated) of requests sent to the endpoint that have not answered their first byte", lambda s, now: s.prefill_tokens),
    (GaugeMetricFamily, "llmplane_gateway_endpoint_ttft_seconds", "The endpoint's engine's mean time to first token since the scrape before, held while busy, 0 when idle", lambda s, now: s.ttft if s.ttft >= 0 else None),
    (GaugeMetricFamily, "llmplane_gateway_endpoint_ejected", "1 while the endpoint is ejected", lambda s, now: 1.0 if s.ejected(now) else 0.0),
    (CounterMetricFamily, "llmplane_gateway_endpoint_prefix_cache_hits", "Prompt tokens the endpoint's engine found in its prefix cache, as last scraped", lambda s, now: s.prefix_hits if s.prefix_queries else None),
    (CounterMetricFamily, "llmplane_gateway_endpoint_prefix_cache_queries", "Prompt tokens the endpoint's engine looked up in its prefix cache, as last scraped", lambda s, now: s.prefix_queries or None),
)
# fmt: on


class _EndpointCollector:
    def __init__(self, endpoints: Callable[[], Iterable[EndpointState]]) -> None:
        self.endpoints = endpoints

    def collect(self) -> Any:
        now = time.monotonic()
        states = list(self.endpoints())
        for family_type, name, doc, value_of in _PER_ENDPOINT:
            family = family_type(name, doc, labels=["endpoint"])
            for state in states:
                value = value_of(state, now)
                if value is not None:
                    family.add_metric([state.address], value)
            yield family
        endpoints = GaugeMetricFamily(
            "llmplane_gateway_model_endpoints",
            "Ready endpoints (replicas) per served model name",
            labels=["model"],
        )
        per_model: dict[str, int] = {}
        for state in states:
            model = state.endpoint.model_name
            per_model[model] = per_model.get(model, 0) + 1
        for model, n in sorted(per_model.items()):
            endpoints.add_metric([model], n)
        yield endpoints


class _Families:
    def __init__(self, metrics: list[Counter | Histogram]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return (metric.collect() for metric in self.metrics)


class GatewayMetrics:
    """The request path's metrics and the per-endpoint gauges of the states ``endpoints()``
    gives, on one registry of the gateway's own."""

    def __init__(self, endpoints: Callable[[], Iterable[EndpointState]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        # fmt: off
        self.requests = Counter("llmplane_gateway_requests", "Requests by model, route, endpoint and status", ("model", "route", "endpoint", "status"))
        self.e2e = Histogram("llmplane_gateway_request_duration_seconds", "End-to-end request latency at the gateway", ("model",))
        self.ttft = Histogram("llmplane_gateway_time_to_first_token_seconds", "Time to the first streamed chunk", ("model",))
        self.tpot = Histogram("llmplane_gateway_time_per_output_token_seconds", "Time per output token after the first (streaming)", ("model",), TPOT_BUCKETS)
        self.prompt_tokens = Counter("llmplane_gateway_prompt_tokens", "Prompt tokens (from usage)", ("model",))
        self.output_tokens = Counter("llmplane_gateway_output_tokens", "Output tokens (from usage)", ("model",))
        self.scheduling = Histogram("llmplane_gateway_scheduling_duration_seconds", "Time to pick an endpoint (filters, scorers, picker)", (), SCHED_BUCKETS)
        self.shed = Counter("llmplane_gateway_shed", "Sheddable requests refused (429)", ("model",))
        self.retries = Counter("llmplane_gateway_retries", "Requests sent again to another endpoint", ("model",))
        self.resends = Counter("llmplane_gateway_upstream_resends", "Requests sent again on a new connection because the endpoint closed the reused keep-alive one before answering", ("endpoint",))
        self.stalls = Counter("llmplane_gateway_stream_stalls", "Streams ended because the upstream sent nothing for the stall timeout", ("route",))
        self.ejections = Counter("llmplane_gateway_ejections", "Endpoints ejected after repeated failures", ("endpoint",))
        self.pd_requests = Counter("llmplane_gateway_pd_requests", "Requests served by a prefill/decode pair, by model and KV connector", ("model", "connector"))
        self.pd_prefill = Histogram("llmplane_gateway_pd_prefill_duration_seconds", "Prefill request latency (sent to response read) in prefill/decode serving", ("model",))
        # fmt: on
        self.add(m for m in vars(self).values() if isinstance(m, Counter | Histogram))
        if endpoints is not None:
            self.registry.register(_EndpointCollector(endpoints))  # type: ignore[arg-type]

    def add(self, metrics: Iterable[Counter | Histogram]) -> None:
        """Export request-path metrics kept by another module (the activator's)."""
        self.registry.register(_Families(list(metrics)))  # type: ignore[arg-type]

    def render(self) -> bytes:
        return generate_latest(self.registry)


class AccessSink:
    """The access log written straight to a file descriptor (the CLI's stdout): lines gathered
    for up to ``DELAY`` seconds into writes of at most ``PIPE_BUF`` bytes, each whole lines.
    Instead of the logging module's record, formatter, handler lock and one ``write`` per
    request (about 7 % of a request's CPU); a write of at most ``PIPE_BUF`` to a pipe is
    atomic, so the lines of several worker processes sharing the descriptor never mix. Under
    load a write carries a dozen lines (one per loop turn was most of a write per request);
    a process killed outright loses at most ``DELAY`` seconds of lines."""

    DELAY = 0.02

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lines: list[bytes] = []
        self.size = 0  # bytes in ``lines``, newlines included
        self.timer: asyncio.TimerHandle | None = None
        # Kept: on Python 3.11 every asyncio.get_running_loop() is a getpid() system call.
        self.loop: asyncio.AbstractEventLoop | None = None

    def add(self, line: bytes) -> None:
        size = self.size + len(line) + 1
        if size > select.PIPE_BUF and self.lines:
            self.flush()  # a full write's worth: out now, whole lines
            size = len(line) + 1
        self.lines.append(line)
        self.size = size
        if self.timer is None:
            loop = self.loop
            if loop is None or loop.is_closed():
                try:
                    loop = self.loop = asyncio.get_running_loop()
                except RuntimeError:
                    self.flush()
                    return
            self.timer = loop.call_later(self.DELAY, self._due)

    def _due(self) -> None:
        self.timer = None
        self.flush()

    def flush(self) -> None:
        """Out in one write: ``add`` keeps the lines within ``PIPE_BUF`` (or one longer line)."""
        if not self.lines:
            return
        self.lines.append(b"")
        view = memoryview(b"\n".join(self.lines))
        self.lines, self.size = [], 0
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as err:  # stdout closed or full beyond repair: stop logging requests
            global access_sink
            access_sink = None
            logging.getLogger("llmplane.gateway").warning("access log stopped: %s", err)


access_sink: AccessSink | None = None


def install_access_sink(fd: int) -> AccessSink:
    """Write the access log to ``fd`` from now on (``flush_access_log`` before exiting)."""
    global access_sink
    access_sink = AccessSink(fd)
    return access_sink


def flush_access_log() -> None:
    sink = access_sink
    if sink is not None:
        if sink.timer is not None:
            sink.timer.cancel()
            sink.timer = None
        sink.flush()


def write_access(record: dict[str, Any]) -> None:
    """One access-log line; the caller checked ``access_log.isEnabledFor(logging.INFO)``."""
    sink = access_sink
    if sink is not None:
        sink.add(orjson.dumps(record))
    else:
        access_log.info(orjson.dumps(record).decode())
