"""The fast path of one limit on local buckets (the common case: a Tenant's limit, or a
route's, held by this process): the buckets resolved once per limit, and one call that
refills, checks and takes them all and writes the ``x-ratelimit-*`` headers, without a state
object per bucket. It gives exactly what ``buckets.reserve_local`` + ``rate_headers`` give
for a single limit (``tests/unit/test_ratelimit_local.py`` compares them); a refusal, the
rarer case, is left to that general path, which builds the 429."""

from __future__ import annotations

import math

from llmplane.gateway.ratelimit.buckets import TokenBucket, duration
from llmplane.gateway.ratelimit.limits import REQUESTS


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
    """One limit's local buckets by direction, with their header names and limit values
    formatted once. Valid until the limits change (the limiter drops its plans then)."""

    __slots__ = ("entries", "lock")

    def __init__(self, buckets: dict[str, TokenBucket]) -> None:
        # direction -> (bucket, str(limit), the limit as a number, header names)
        self.entries = {
            d: (b, str(int(b.burst)), int(b.burst), _names(d)) for d, b in buckets.items()
        }
        first = next(iter(buckets.values()), None)
        self.lock = first.lock if first is not None else None

    def take(self, amounts: list[tuple[str, int]], now: float) -> dict[str, str] | None:
        """Take every amount and return the headers (``rate_headers`` of the buckets after
        the take, read under the lock as ``reserve_local`` reads them), or take nothing and
        return None (the request does not fit now)."""
        entries = self.entries
        with self.lock:  # type: ignore[union-attr]  # the buckets of one limiter share it
            fits = True
            for d, amount in amounts:  # every bucket refilled, as reserve_local does
                bucket = entries[d][0]
                bucket.refill(now)
                if bucket.level < amount:
                    fits = False
            if not fits:
                return None
            headers: dict[str, str] = {}
            main = None  # (share left, limit, remaining, reset) of the scarcest token bucket
            per = []
            for d, amount in amounts:
                bucket, limit_text, limit, names = entries[d]
                level = bucket.level - amount
                bucket.level = level
                remaining = str(int(level)) if level > 0 else "0"
                seconds = (limit - level) / bucket.rate
                reset = (
                    _MILLISECONDS[math.ceil(seconds * 1000)]
                    if 0 < seconds < 1
                    else duration(seconds)
                )
                if d == REQUESTS:  # always the first direction
                    headers[names[0]] = limit_text
                    headers[names[1]] = remaining
                    headers[names[2]] = reset
                    continue
                share = level / limit
                if main is None or share < main[0]:
                    main = (share, limit_text, remaining, reset)
                per.append((names, limit_text, remaining, reset))
        if main is not None:
            headers["x-ratelimit-limit-tokens"] = main[1]
            headers["x-ratelimit-remaining-tokens"] = main[2]
            headers["x-ratelimit-reset-tokens"] = main[3]
            for names, limit_text, remaining, reset in per:
                headers[names[0]] = limit_text
                headers[names[1]] = remaining
                headers[names[2]] = reset
        return headers

    def give(self, deltas: list[tuple[str, int]], now: float) -> None:
        """Give back (> 0) or debit (< 0), as ``TokenBucket.adjust``."""
        entries = self.entries
        for d, delta in deltas:
            entries[d][0].adjust(delta, now)
