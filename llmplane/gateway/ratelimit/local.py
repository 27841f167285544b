"""The fast path of one limit on local buckets (the common case: a Tenant's limit, or a
route's, held by this process): the buckets resolved once per limit, and one call that
refills, checks and takes them all and writes the ``x-ratelimit-*`` headers, without a state
object per bucket. It gives exactly what ``buckets.reserve_local`` + ``rate_headers`` give
for a single limit (``tests/unit/test_ratelimit_local.py`` compares them); a refusal, the
rarer case, is left to that general path, which builds the 429.

Everything constant per limit is made once: the header lines with their names and limit
values, as a format into which a take puts its remaining/reset values in one call; the
headers go to the client as these lines (``hooks.Reservation.response_lines``)."""

from __future__ import annotations

import contextlib
import math
from contextlib import AbstractContextManager

from llmplane.gateway.ratelimit.buckets import TokenBucket, duration
from llmplane.gateway.ratelimit.limits import REQUESTS

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


class LocalPlan:
    """One limit's local buckets in the order a request takes them (``amounts`` of a take
    name the same directions in the same order), with their header names, limit values and
    the headers' template made once. Valid until the limits change (the limiter drops its
    plans then)."""

    __slots__ = ("buckets", "format", "has_requests", "lock", "rows")

    def __init__(self, buckets: dict[str, TokenBucket]) -> None:
        self.buckets = buckets  # direction -> bucket, in the order of a take
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

    def take(self, amounts: list[tuple[str, int]], now: float) -> bytes | None:
        """Take every amount and return the header lines (``rate_headers`` of the buckets
        after the take, read under the lock as ``reserve_local`` reads them), or take nothing
        and return None (the request does not fit now)."""
        if self.lock is None:
            return self._take(amounts, now)
        with self.lock:  # the buckets of one limiter share it
            return self._take(amounts, now)

    def _take(self, amounts: list[tuple[str, int]], now: float) -> bytes | None:
        rows = self.rows
        fits = True
        for row, pair in zip(rows, amounts, strict=True):
            # Every bucket refilled, as reserve_local does: TokenBucket.refill, inline.
            bucket = row[0]
            stamp = bucket.stamp
            if now > stamp:
                level = bucket.level + (now - stamp) * bucket.rate
                burst = bucket.burst
                bucket.level = level = level if level < burst else burst
                bucket.stamp = now
            else:
                level = bucket.level
                if level > bucket.burst:  # the limit was lowered
                    bucket.level = level = float(bucket.burst)
            if level < pair[1]:
                fits = False
        if not fits:
            return None
        values: list[str | float] = []  # remaining (%d: whole tokens), reset of each bucket
        main = None  # (share left, limit, remaining, reset) of the scarcest token bucket
        for (bucket, limit_text, limit, is_tokens), pair in zip(rows, amounts, strict=True):
            level = bucket.level - pair[1]
            bucket.level = level
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
        return (self.format % tuple(values)).encode()

    def give(self, deltas: list[tuple[str, int]], now: float) -> None:
        """Give back (> 0) or debit (< 0), as ``TokenBucket.adjust``."""
        buckets = self.buckets
        for d, delta in deltas:
            buckets[d].adjust(delta, now)
