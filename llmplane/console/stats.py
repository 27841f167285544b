"""Recent per-second request statistics for the console's live charts.

A sampler reads the gateway's own metrics (request counter, TTFT / latency / TPOT histograms,
output tokens) once a second and keeps the differences in a ring of a few minutes. Nothing is
added to the request path: the histograms the request path already fills are the source, and
percentiles come from their bucket differences (linear interpolation inside a bucket, as
Prometheus's ``histogram_quantile`` does).

Engines' prefix-cache counters (scraped per endpoint) are sampled the same way, so the fleet
view shows each endpoint's recent prefix-hit rate rather than a lifetime average.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

RING_SECONDS = 300  # what the charts can show
WINDOW = 10  # seconds of histogram differences behind each percentile point
PREFIX_WINDOW = 30  # seconds of engine prefix-cache counters behind a hit rate


def quantile(q: float, bounds: Sequence[float], counts: Sequence[int]) -> float | None:
    """The ``q`` quantile of a histogram given per-bucket (not cumulative) counts; the last
    count is the +Inf bucket. None without observations."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    running = 0
    lower = 0.0
    for i, n in enumerate(counts):
        if running + n >= rank and n > 0:
            if i >= len(bounds):  # +Inf: the highest finite bound is all that is known
                return bounds[-1] if bounds else None
            upper = bounds[i]
            return lower + (upper - lower) * (rank - running) / n
        running += n
        if i < len(bounds):
            lower = bounds[i]
    return bounds[-1] if bounds else None


def _summed(histogram: Any) -> list[int]:
    """A labelled histogram's bucket counts summed over its label sets."""
    out = [0] * (len(histogram.bounds) + 1)
    for child in list(histogram.children.values()):
        for i, n in enumerate(child.counts):
            out[i] += n
    return out


def _total(counter: Any, keep: Callable[[tuple[str, ...]], bool] | None = None) -> float:
    return sum(
        c.value for values, c in list(counter.children.items()) if keep is None or keep(values)
    )


def _error_status(values: tuple[str, ...]) -> bool:
    status = values[-1] if values else ""
    return not status.startswith("2")


@dataclass(slots=True)
class Point:
    t: float  # wall-clock seconds
    requests: float  # finished in this second
    errors: float  # of which not 2xx
    output_tokens: float
    ttft: tuple[float | None, float | None, float | None]  # p50, p95, p99 over WINDOW s
    latency: tuple[float | None, float | None, float | None]
    tpot: tuple[float | None, float | None, float | None]

    def to_json(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 3),
            "requests": self.requests,
            "errors": self.errors,
            "outputTokens": self.output_tokens,
            "ttft": _ms(self.ttft),
            "latency": _ms(self.latency),
            "tpot": _ms(self.tpot),
        }


def _ms(values: tuple[float | None, ...]) -> list[float | None]:
    return [None if v is None else round(v * 1000, 2) for v in values]


QUANTILES = (0.5, 0.95, 0.99)


class _HistogramWindow:
    """The last WINDOW per-second differences of one histogram, summed on demand."""

    def __init__(self, histogram: Any) -> None:
        self.histogram = histogram
        self.last = _summed(histogram)
        self.deltas: deque[list[int]] = deque(maxlen=WINDOW)

    def step(self) -> tuple[float | None, float | None, float | None]:
        now = _summed(self.histogram)
        self.deltas.append([a - b for a, b in zip(now, self.last, strict=True)])
        self.last = now
        window = [sum(col) for col in zip(*self.deltas, strict=True)]
        p50, p95, p99 = (quantile(q, self.histogram.bounds, window) for q in QUANTILES)
        return p50, p95, p99


class RequestStats:
    """The ring of per-second points, and recent prefix-hit rates per endpoint."""

    def __init__(
        self,
        metrics: Any,
        endpoints: Callable[[], Iterable[Any]] = tuple,
        seconds: int = RING_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics
        self.endpoints = endpoints
        self.clock = clock
        self.points: deque[Point] = deque(maxlen=seconds)
        self._requests = _total(metrics.requests)
        self._errors = _total(metrics.requests, _error_status)
        self._tokens = _total(metrics.output_tokens)
        self._ttft = _HistogramWindow(metrics.ttft)
        self._latency = _HistogramWindow(metrics.e2e)
        self._tpot = _HistogramWindow(metrics.tpot)
        self._prefix: dict[str, deque[tuple[float, float]]] = {}
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> Point:
        """Take one second's point (called once a second)."""
        m = self.metrics
        requests, errors = _total(m.requests), _total(m.requests, _error_status)
        tokens = _total(m.output_tokens)
        point = Point(
            t=self.clock(),
            requests=requests - self._requests,
            errors=errors - self._errors,
            output_tokens=tokens - self._tokens,
            ttft=self._ttft.step(),
            latency=self._latency.step(),
            tpot=self._tpot.step(),
        )
        self._requests, self._errors, self._tokens = requests, errors, tokens
        self.points.append(point)
        self._sample_prefix()
        return point

    def _sample_prefix(self) -> None:
        seen = set()
        for state in self.endpoints():
            address = state.address
            seen.add(address)
            ring = self._prefix.get(address)
            if ring is None:
                ring = self._prefix[address] = deque(maxlen=PREFIX_WINDOW + 1)
            if ring and state.prefix_queries < ring[-1][1]:
                ring.clear()  # the engine restarted: its counters start again from 0
            ring.append((state.prefix_hits, state.prefix_queries))
        for gone in [a for a in self._prefix if a not in seen]:
            del self._prefix[gone]

    def prefix_hit_rate(self, address: str) -> float | None:
        """Cached prompt tokens / prompt tokens the engine looked up over the last
        PREFIX_WINDOW seconds; None without lookups (or an engine that does not report them)."""
        ring = self._prefix.get(address)
        if not ring or len(ring) < 2:
            return None
        hits = ring[-1][0] - ring[0][0]
        queries = ring[-1][1] - ring[0][1]
        if queries <= 0:  # no prompt looked up lately
            return None
        return hits / queries

    def series(self, since: float | None = None) -> list[dict[str, Any]]:
        return [p.to_json() for p in self.points if since is None or p.t > since]

    # --- the sampling task -----------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="console stats")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + 1.0
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = max(next_at + 1.0, loop.time())  # a stalled loop skips, not bunches
            self.sample()
