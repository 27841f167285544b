"""Recent per-second request statistics for the console's live charts (and ``llmplane up``'s
status line).

A sampler reads the gateway's own metrics (request counter, TTFT / latency / TPOT histograms,
output tokens) once a second and keeps the differences in a ring of a few minutes. Nothing is
added to the request path: the histograms the request path already fills are the source, and
percentiles come from their bucket differences (linear interpolation inside a bucket, as
Prometheus's ``histogram_quantile`` does). With several gateway workers (``llmplane up
--workers N``, ``llmplane gateway --workers N``) every worker publishes its ``totals`` once a
second as its report in shared memory (``Seat.report``), the console reads the
other workers' latest reports each second (``peers``) and adds their differences, each
worker's against its own previous totals (the totals read as the sampler starts are its
baseline; a worker first seen later, one started since or a replacement, counts from zero),
so the charts count the whole gateway. Nobody asks anybody: N workers cost N writes
and N reads of shared memory a second.

Engines' prefix-cache counters (scraped per endpoint) are sampled the same way, so the fleet
view shows each endpoint's recent prefix-hit rate rather than a lifetime average.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from llmplane.aio import cancel

log = logging.getLogger("llmplane.console")

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


HISTOGRAMS = ("ttft", "latency", "tpot")
COUNTERS = ("requests", "errors", "tokens")


def totals(metrics: Any) -> dict[str, Any]:
    """One process's totals so far: counters and histogram bucket counts (what ``sample``
    differences; what a worker answers its peers with)."""
    return {
        "requests": _total(metrics.requests),
        "errors": _total(metrics.requests, _error_status),
        "tokens": _total(metrics.output_tokens),
        "ttft": _summed(metrics.ttft),
        "latency": _summed(metrics.e2e),
        "tpot": _summed(metrics.tpot),
    }


def report_totals(seat: Any) -> Callable[[dict[str, Any]], None]:
    """Publish totals as worker ``seat``'s report (``Seat.report``), with its
    pid: what the other workers' ``peer_totals`` read."""

    def publish(own: dict[str, Any]) -> None:
        seat.report(orjson.dumps([os.getpid(), own]))

    return publish


def peer_totals(seat: Any) -> Callable[[], list[tuple[Hashable, dict[str, Any]]]]:
    """``RequestStats.peers`` for worker ``seat``: every other worker's latest ((index, pid),
    totals) from their reports in shared memory (a report is parsed again only once it
    changed; a replacement worker has the same index and a new pid)."""
    reader = seat.report_reader()
    parsed: dict[int, tuple[bytes, tuple[Hashable, dict[str, Any]] | None]] = {}

    def read() -> list[tuple[Hashable, dict[str, Any]]]:
        out: list[tuple[Hashable, dict[str, Any]]] = []
        for index, data in reader.read():
            cached = parsed.get(index)
            if cached is None or cached[0] is not data:
                cached = parsed[index] = (data, _peer(index, data))
            if cached[1] is not None:
                out.append(cached[1])
        return out

    return read


def _peer(index: int, data: bytes) -> tuple[Hashable, dict[str, Any]] | None:
    try:
        pid, peer = orjson.loads(data)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None
    if isinstance(pid, int) and isinstance(peer, dict):
        return (index, pid), peer
    return None


def _difference(now: dict[str, Any], last: dict[str, Any] | None) -> dict[str, Any] | None:
    """``now - last`` per counter and bucket (a counter that went down restarted: all of it is
    new); None for a first sight or totals of another shape."""
    if last is None:
        return None
    out: dict[str, Any] = {}
    try:
        for key in COUNTERS:
            d = float(now[key]) - float(last[key])
            out[key] = d if d >= 0 else float(now[key])
        for key in HISTOGRAMS:
            counts, before = now[key], last[key]
            if len(counts) != len(before):
                return None
            diffs = [int(a) - int(b) for a, b in zip(counts, before, strict=True)]
            out[key] = diffs if min(diffs, default=0) >= 0 else [int(a) for a in counts]
    except (KeyError, TypeError, ValueError):
        return None
    return out


def _zeros(now: dict[str, Any]) -> dict[str, Any]:
    """Totals of ``now``'s shape, all zero (a peer's baseline when all of it is new)."""
    out: dict[str, Any] = {key: 0.0 for key in COUNTERS}
    for key in HISTOGRAMS:
        counts = now.get(key) if isinstance(now, dict) else None
        out[key] = [0] * len(counts) if isinstance(counts, list) else []
    return out


class _HistogramWindow:
    """The last WINDOW per-second differences of one histogram, summed on demand."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.deltas: deque[list[int]] = deque(maxlen=WINDOW)

    def step(self, delta: list[int]) -> tuple[float | None, float | None, float | None]:
        self.deltas.append(delta)
        window = [sum(col) for col in zip(*self.deltas, strict=True)]
        p50, p95, p99 = (quantile(q, self.bounds, window) for q in QUANTILES)
        return p50, p95, p99


class RequestStats:
    """The ring of per-second points, and recent prefix-hit rates per endpoint."""

    def __init__(
        self,
        metrics: Any,
        endpoints: Callable[[], Iterable[Any]] = tuple,
        seconds: int = RING_SECONDS,
        clock: Callable[[], float] = time.time,
        peers: Callable[[], Iterable[tuple[Hashable, dict[str, Any]]]] | None = None,
        publish: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.metrics = metrics
        self.endpoints = endpoints
        self.clock = clock
        self.peers = peers  # the other workers' (identity, totals), read before each sample
        self.publish = publish  # our totals for the other workers, at each sample
        self.points: deque[Point] = deque(maxlen=seconds)
        self._last: dict[Hashable, dict[str, Any]] = {None: totals(metrics)}  # None: ours
        # After ``baseline``: a peer first seen later started after us, all of it is new.
        self._new_from_zero = False
        self._windows = {
            "ttft": _HistogramWindow(metrics.ttft.bounds),
            "latency": _HistogramWindow(metrics.e2e.bounds),
            "tpot": _HistogramWindow(metrics.tpot.bounds),
        }
        self._prefix: dict[str, deque[tuple[float, float]]] = {}
        self._task: asyncio.Task[None] | None = None

    def baseline(self, peers: Iterable[tuple[Hashable, dict[str, Any]]]) -> None:
        """Where the ring starts for ``peers`` (read as we start): their totals now. A peer
        first seen after this (a worker that started after us, or a replacement) counts
        from zero; without a baseline, a peer's first totals are its baseline."""
        for source, now in peers:
            self._last[source] = now
        self._new_from_zero = True

    def sample(self, peers: Iterable[tuple[Hashable, dict[str, Any]]] = ()) -> Point:
        """Take one second's point (called once a second) from our totals and ``peers``'
        (other workers': their identity, e.g. the pid, and their ``totals``). A peer that
        did not answer this time keeps its previous totals: its next answer covers the gap."""
        sums: dict[str, Any] = {key: 0.0 for key in COUNTERS}
        for key, window in self._windows.items():
            sums[key] = [0] * (len(window.bounds) + 1)
        own = totals(self.metrics)
        if self.publish is not None:
            self.publish(own)
        for source, now in [(None, own), *peers]:
            last = self._last.get(source)
            if last is None and self._new_from_zero:
                last = _zeros(now)
            delta = _difference(now, last)
            self._last[source] = now
            if delta is None:
                continue
            for key in COUNTERS:
                sums[key] += delta[key]
            for key in HISTOGRAMS:
                if len(delta[key]) == len(sums[key]):
                    sums[key] = [a + b for a, b in zip(sums[key], delta[key], strict=True)]
        point = Point(
            t=self.clock(),
            requests=sums["requests"],
            errors=sums["errors"],
            output_tokens=sums["tokens"],
            ttft=self._windows["ttft"].step(sums["ttft"]),
            latency=self._windows["latency"].step(sums["latency"]),
            tpot=self._windows["tpot"].step(sums["tpot"]),
        )
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
            # Our totals for the peers at once, and theirs as our starting point: a request a
            # peer serves in our first second is counted (the first sample is a second away).
            if self.publish is not None:
                self.publish(totals(self.metrics))
            if self.peers is not None:
                try:
                    self.baseline(self.peers())
                except Exception:
                    log.exception("reading the other workers' request totals failed")
            self._task = asyncio.get_running_loop().create_task(self._run(), name="console stats")

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel(task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + 1.0
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = max(next_at + 1.0, loop.time())  # a stalled loop skips, not bunches
            peers: Iterable[tuple[Hashable, dict[str, Any]]] = ()
            if self.peers is not None:
                try:
                    peers = self.peers()
                except Exception:
                    log.exception("reading the other workers' request totals failed")
            self.sample(peers)
