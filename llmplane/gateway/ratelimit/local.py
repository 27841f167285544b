"""The fast path of one limit on local buckets (the common case: a Tenant's limit, or a
route's, held by this process): the buckets resolved once per limit, one call that refills,
checks and takes them all and writes the ``x-ratelimit-*`` headers, and one that settles,
without a state object per bucket. It gives exactly what ``buckets.reserve_local`` +
``rate_headers`` (and ``settle_deltas`` + ``TokenBucket.adjust``) give for a single limit
(``tests/unit/test_ratelimit_local.py`` compares them); a refusal, the rarer case, is left
to that general path, which builds the 429.

Everything constant per limit is made once: the header lines with their names and limit
values, as a format into which a take puts its remaining/reset values in one call; the
headers go to the client as these lines (``hooks.Reservation.response_lines``). The lines
are a function of the buckets' levels after the take alone (limits and rates are fixed for
a plan's life), so a take that leaves every level as the last one did reuses the last lines
instead of formatting them again: a tenant well inside its limits finds its buckets full
before every request, and takes the same amounts."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from llmplane.gateway.ratelimit.buckets import TokenBucket, duration
from llmplane.gateway.ratelimit.limits import BUDGET, INPUT, OUTPUT, REQUESTS

_TOKENS = (
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
)


def _names(direction: str) -> tuple[str, str, str]:
    suffix = "requests" if direction == REQUESTS else f"tokens-{direction}"
    return (
        f"x-ratelimit-limit-{suffix}",
        f"x-ratelimit-remaining-{suffix}",
        f"x-ratelimit-reset-{suffix}",
    )


# ``duration`` of 1 ms .. 1 s (a bucket just taken from is nearly always refilled within a
# second), formatted once.
_MILLISECONDS = [f"{max(1, ms)}ms" for ms in range(1001)]


@functools.cache
def _straight_take(n: int) -> Callable[..., list[float] | None]:
    """``LocalPlan``'s refill, check and take of ``n`` buckets with its loop written out once
    per bucket (no iterator, no lists but the result: about half the loop's time, which is a
    good part of a limited request's). Made from this fixed template and ``n`` alone, as
    ``dataclasses`` makes an ``__init__``; ``tests/unit/test_ratelimit_local.py`` checks it
    against the general path for one to four buckets. Returns the levels after the take, or
    None (nothing taken; every bucket refilled, as ``reserve_local`` leaves them)."""
    lines = ["def take(buckets, amounts, now):"]
    if n:
        lines.append(f"    {', '.join(f'a{i}' for i in range(n))}, = amounts")
        lines.append(f"    {', '.join(f'b{i}' for i in range(n))}, = buckets")
    for i in range(n):
        # TokenBucket.refill, inline (a level above the burst after a limit was lowered is
        # cut to it)
        lines += [
            f"    l{i} = b{i}.level",
            f"    s = b{i}.stamp",
            "    if now > s:",
            f"        l{i} += (now - s) * b{i}.rate",
            f"        b{i}.stamp = now",
            f"    burst = b{i}.burst",
            f"    if l{i} >= burst:",
            f"        l{i} = burst",
        ]
    short = " or ".join(f"l{i} < a{i}" for i in range(n)) or "False"
    lines += [f"    if {short}:"]
    lines += [f"        b{i}.level = l{i}" for i in range(n)]
    lines += ["        return None"]  # (a plan without buckets never gets here)
    lines += [f"    b{i}.level = l{i} = l{i} - a{i}" for i in range(n)]
    lines += [f"    return [{', '.join(f'l{i}' for i in range(n))}]"]
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), namespace)  # a fixed template, see above
    return namespace["take"]  # type: ignore[no-any-return]


class LocalPlan:
    """One limit's local buckets in the order a request takes them (the amounts of a take
    and a settlement are given in ``directions``' order), with their header names, limit
    values and the headers' template made once. Valid until the limits change (the limiter
    drops its plans then)."""

    __slots__ = (
        "_levels",
        "_lines",
        "_straight",
        "bucket_list",
        "buckets",
        "directions",
        "format",
        "has_requests",
        "limits",
        "lock",
        "rows",
        "settle",
        "take",
    )

    def __init__(self, buckets: dict[str, TokenBucket]) -> None:
        self.buckets = buckets  # direction -> bucket, in the order of a take
        self.directions = tuple(buckets)
        self.bucket_list = tuple(buckets.values())
        # (direction, the limit: tokens per unit), what a request's amounts are checked against
        self.limits = tuple((d, int(b.burst)) for d, b in buckets.items())
        # (bucket, str(limit), the limit as a number, a token bucket?)
        self.rows = [
            (b, str(int(b.burst)), int(b.burst), d != REQUESTS) for d, b in buckets.items()
        ]
        first = next(iter(buckets.values()), None)
        lock = first.lock if first is not None else None
        # None for buckets of one process (entering a null context costs a call per take)
        self.lock: AbstractContextManager[None] | None = (
            None if isinstance(lock, contextlib.nullcontext) else lock
        )
        self.has_requests = REQUESTS in buckets
        self._straight = _straight_take(len(buckets))
        # ``take`` and ``settle``: straight to the work for buckets of this process, inside
        # the lock for buckets shared by worker processes.
        self.take: Callable[[Sequence[int], float], bytes | None] = (
            self._take if self.lock is None else self._take_locked
        )
        self.settle: Callable[
            [Sequence[int], int | None, int | None, int, Callable[[], float]], None
        ] = self._settle if self.lock is None else self._settle_locked
        # The header lines in ``rate_headers``' order (requests, the scarcest token bucket,
        # each token bucket) with the limits filled in; a take formats the rest in one go.
        lines = []
        scarcest = f"{_TOKENS[0]}: %s\r\n{_TOKENS[1]}: %d\r\n{_TOKENS[2]}: %s\r\n"
        for d, bucket in buckets.items():  # requests first, if limited at all
            if d != REQUESTS and scarcest not in lines:  # before the first token bucket
                lines.append(scarcest)
            names = _names(d)
            lines.append(f"{names[0]}: {int(bucket.burst)}\r\n{names[1]}: %d\r\n{names[2]}: %s\r\n")
        self.format = "".join(lines)
        # The levels the last take left and the lines it wrote for them.
        self._levels: list[float] | None = None
        self._lines = b""

    def _take_locked(self, amounts: Sequence[int], now: float) -> bytes | None:
        assert self.lock is not None
        with self.lock:  # the buckets of one limiter share it
            return self._take(amounts, now)

    def _take(self, amounts: Sequence[int], now: float) -> bytes | None:
        """``take``: every amount taken and the header lines returned (``rate_headers`` of
        the buckets after the take, read under the lock as ``reserve_local`` reads them), or
        nothing taken and None returned (the request does not fit now)."""
        levels = self._straight(self.bucket_list, amounts, now)
        if levels is None:
            return None
        if levels == self._levels:  # the same levels: the same lines
            return self._lines
        values: list[str | float] = []  # remaining (%d: whole tokens), reset of each bucket
        main = None  # (share left, limit, remaining, reset) of the scarcest token bucket
        for (bucket, limit_text, limit, is_tokens), level in zip(self.rows, levels, strict=True):
            remaining = level if level > 0 else 0
            seconds = (limit - level) / bucket.rate
            reset = (
                _MILLISECONDS[math.ceil(seconds * 1000)] if 0 < seconds < 1 else duration(seconds)
            )
            values.append(remaining)
            values.append(reset)
            if is_tokens:
                share = level / limit
                if main is None or share < main[0]:
                    main = (share, limit_text, remaining, reset)
        if main is not None:  # after the requests' two values, before the token buckets'
            values[2 if self.has_requests else 0 : 2 if self.has_requests else 0] = main[1:]
        lines = (self.format % tuple(values)).encode()
        self._levels = levels
        self._lines = lines
        return lines

    def give(self, deltas: Sequence[int], now: float) -> None:
        """Give back (> 0) or debit (< 0) per bucket (0: nothing), as ``TokenBucket.adjust``
        (the rarer case: what a failed request took, all of it)."""
        for bucket, delta in zip(self.bucket_list, deltas, strict=True):
            if delta:
                bucket.adjust(delta, now)

    def _settle_locked(
        self,
        amounts: Sequence[int],
        prompt: int | None,
        completion: int | None,
        status: int,
        clock: Callable[[], float],
    ) -> None:
        if prompt is None and completion is None:  # give() takes the lock per bucket
            self._settle(amounts, prompt, completion, status, clock)
            return
        assert self.lock is not None
        with self.lock:
            self._settle(amounts, prompt, completion, status, clock)

    def _settle(
        self,
        amounts: Sequence[int],
        prompt: int | None,
        completion: int | None,
        status: int,
        clock: Callable[[], float],
    ) -> None:
        """``settle``: ``buckets.settle_deltas`` and the give in one pass over the buckets
        (the clock read once, and only when something moves)."""
        if prompt is None and completion is None:
            if status >= 400 and status != 499:  # a failure without usage: all of it back
                self.give(amounts, clock())
            return
        prompt = prompt or 0
        completion = completion or 0
        now = None
        for direction, bucket, amount in zip(
            self.directions, self.bucket_list, amounts, strict=True
        ):
            # The engine's usage replaces what was reserved: a request counts as one, the
            # input (and budget) only when the engine reported prompt tokens.
            if direction == OUTPUT:
                delta = amount - completion
            elif direction == REQUESTS or not prompt:
                continue
            elif direction == INPUT:
                delta = amount - prompt
            else:
                assert direction == BUDGET
                delta = amount - prompt - completion
            if not delta:
                continue
            if now is None:
                now = clock()
            # TokenBucket.adjust, inline: refill, then add up to the burst.
            stamp = bucket.stamp
            burst = bucket.burst
            if now > stamp:
                level = bucket.level + (now - stamp) * bucket.rate
                level = level if level < burst else burst
                bucket.stamp = now
            else:
                level = bucket.level
                if level > burst:
                    level = float(burst)
            level += delta
            cap = float(burst)
            bucket.level = level if level < cap else cap
