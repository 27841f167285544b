"""Token-bucket maths: the bucket (of this process or shared by the workers), the state every
kind of bucket reports, the ``x-ratelimit-*`` headers and what settling gives back or debits."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, MutableSequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from llmplane.gateway.ratelimit.limits import BUDGET, INPUT, REQUESTS


class TokenBucket:
    """``burst`` tokens at most, refilled at ``rate`` per second. ``level`` may go below zero
    after an overuse debit: requests then wait until it has refilled far enough.

    Level and refill stamp live in ``cells``: a list for a bucket of this process, two float64
    of shared memory for one every worker shares (``workers/buckets.py``), whose ``lock`` (a
    record lock) is held around a read-modify-write of them."""

    __slots__ = ("burst", "cells", "lock", "rate")

    def __init__(
        self,
        rate: float,
        burst: float,
        now: float,
        cells: MutableSequence[float] | None = None,
        lock: AbstractContextManager[None] | None = None,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.cells = [float(burst), now] if cells is None else cells
        self.lock = lock or contextlib.nullcontext()

    @property
    def level(self) -> float:
        return self.cells[0]

    @level.setter
    def level(self, value: float) -> None:
        self.cells[0] = value

    def refill(self, now: float) -> None:
        level, stamp = self.cells
        if now > stamp:
            self.cells[0] = min(self.burst, level + (now - stamp) * self.rate)
            self.cells[1] = now
        elif level > self.burst:  # the limit was lowered
            self.cells[0] = float(self.burst)

    def wait(self, amount: float) -> float:
        """Seconds until ``amount`` tokens are there (0 now); call ``refill`` first."""
        level = self.cells[0]
        return 0.0 if level >= amount else (amount - level) / self.rate

    def adjust(self, delta: float, now: float) -> None:
        """Give back (``delta`` > 0, up to the burst) or debit (< 0, may go negative)."""
        with self.lock:
            self.refill(now)
            self.cells[0] = min(float(self.burst), self.cells[0] + delta)

    def state(self, direction: str, wait: float = 0.0) -> BucketState:
        return BucketState(direction, int(self.burst), self.rate, self.cells[0], wait)


@dataclass(slots=True)
class BucketState:
    """One bucket as a reservation saw it (one per bucket and request: not frozen, which
    costs a call a field)."""

    direction: str
    limit: int  # the burst: tokens per unit
    rate: float  # tokens per second
    level: float  # tokens available now (after this reservation when it was admitted)
    wait: float = 0.0  # seconds until the request's amount fits (0: it did)

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.level))

    @property
    def reset(self) -> float:
        """Seconds until the bucket is full again (OpenAI's ``x-ratelimit-reset-tokens``)."""
        return max(0.0, (self.limit - self.level) / self.rate)


def reserve_local(
    buckets: list[tuple[str, TokenBucket, int]], now: float
) -> tuple[bool, list[BucketState]]:
    """Take every amount or none: (admitted, the buckets' states)."""
    if not buckets:
        return True, []
    with buckets[0][1].lock:  # the buckets of one limiter share one lock (or none)
        for _, bucket, _ in buckets:
            bucket.refill(now)
        waits = [bucket.wait(amount) for _, bucket, amount in buckets]
        ok = all(w == 0.0 for w in waits)
        if ok:
            for _, bucket, amount in buckets:
                bucket.level -= amount
        return ok, [b.state(d, w) for (d, b, _), w in zip(buckets, waits, strict=True)]


def retry_after(states: Iterable[BucketState]) -> int:
    """Whole seconds until the reservation fits in every bucket (at least 1)."""
    return max(1, math.ceil(max((s.wait for s in states), default=0.0) - 1e-9))


def duration(seconds: float) -> str:
    """OpenAI's (Go's) duration format for ``x-ratelimit-reset-tokens``: ``250ms``, ``6s``,
    ``1.5s``, ``6m0s``, ``2h3m4s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours >= 1:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes >= 1:
        return f"{int(minutes)}m{text}"
    return text


def _share(state: BucketState) -> float:
    return state.level / state.limit


def _put(headers: dict[str, str], suffix: str, s: BucketState) -> None:
    headers[f"x-ratelimit-limit-{suffix}"] = str(s.limit)
    headers[f"x-ratelimit-remaining-{suffix}"] = str(s.remaining)
    headers[f"x-ratelimit-reset-{suffix}"] = duration(s.reset)


def rate_headers(states: list[BucketState], main: BucketState | None = None) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-{limit,remaining,reset}-requests`` (when requests are limited)
    and ``-tokens`` for ``main`` (by default the token bucket with the smallest share left),
    and the same with ``-input`` / ``-output`` / ``-budget`` per direction. With a route's
    and a tenant's limit in one direction, the scarcer one is reported."""
    scarcest: dict[str, BucketState] = {}
    for s in states:
        seen = scarcest.get(s.direction)
        if seen is None or s is main or (seen is not main and _share(s) < _share(seen)):
            scarcest[s.direction] = s
    headers: dict[str, str] = {}
    requests = scarcest.pop(REQUESTS, None)
    if requests is not None:
        _put(headers, "requests", requests)
    if scarcest:
        if main is None or main.direction == REQUESTS:
            main = min(scarcest.values(), key=_share)
        _put(headers, "tokens", scarcest.get(main.direction, main))
        for direction, s in scarcest.items():
            _put(headers, f"tokens-{direction}", s)
    return headers


def settle_deltas(
    amounts: list[tuple[str, int]], prompt: int | None, completion: int | None, status: int
) -> list[tuple[str, int]]:
    """Tokens to give back (> 0) or debit (< 0) per direction once the response is known.

    With usage: reserved - used (input and budget only when the engine reported prompt
    tokens; a request counts as one whatever it used). Without usage: a failed request
    (status >= 400, not a client that went away) gets everything back, its request too;
    otherwise the reservation stands."""
    if prompt is None and completion is None:
        if status >= 400 and status != 499:
            return [(d, a) for d, a in amounts if a]
        return []
    deltas = []
    for direction, amount in amounts:
        if direction == REQUESTS or (direction in (INPUT, BUDGET) and not prompt):
            continue
        if direction == INPUT:
            used = prompt
        elif direction == BUDGET:
            used = (prompt or 0) + (completion or 0)
        else:
            used = completion
        delta = amount - (used or 0)
        if delta:
            deltas.append((direction, delta))
    return deltas
