"""Token buckets whose level lives in shared memory (``workers/buckets.py``, one per
rate-limited direction shared by the gateway's workers) against buckets of this process:
the same admissions, levels and headers through ``reserve_local`` and ``rate_headers``."""

from __future__ import annotations

import contextlib
import random

from llmplane.gateway.ratelimit.buckets import TokenBucket, rate_headers, reserve_local
from llmplane.gateway.ratelimit.limits import BUDGET, INPUT, OUTPUT, REQUESTS
from llmplane.gateway.workers.buckets import SharedBuckets
from llmplane.gateway.workers.shm import Locks

LIMITS = {REQUESTS: 5, INPUT: 300, OUTPUT: 120, BUDGET: 2000}
PERIOD = {REQUESTS: 60.0, INPUT: 60.0, OUTPUT: 1.0, BUDGET: 86400.0}


def local(directions: list[str]) -> dict[str, TokenBucket]:
    return {d: TokenBucket(LIMITS[d] / PERIOD[d], LIMITS[d], 0.0) for d in directions}


def test_a_tie_between_token_buckets_reports_the_first():
    buckets = local([INPUT, OUTPUT, BUDGET])
    amounts = [(INPUT, 30), (OUTPUT, 12), (BUDGET, 200)]  # a tenth of each: equal shares
    ok, states = reserve_local([(d, buckets[d], a) for d, a in amounts], 0.0)
    assert ok and rate_headers(states)["x-ratelimit-limit-tokens"] == "300"


class _Lock(contextlib.AbstractContextManager):  # type: ignore[type-arg]
    def __exit__(self, *exc: object) -> None:
        return None


def test_shared_buckets_take_as_local_buckets():
    """A bucket whose level lives elsewhere (shared by workers) takes through the same
    ``reserve_local``: the same admissions, levels and headers as a bucket of this process."""
    rng = random.Random(17)
    table = SharedBuckets(8, Locks())
    shared = {
        d: table.bucket(f"r\n{d}", LIMITS[d] / PERIOD[d], LIMITS[d], 0.0)
        for d in (REQUESTS, OUTPUT)
    }
    assert all(isinstance(b.cells, memoryview) for b in shared.values())  # in shared memory
    theirs = local([REQUESTS, OUTPUT])
    now, admitted = 0.0, 0
    for _ in range(200):
        now += rng.choice((0.0, 0.3, 20.0))
        amounts = [(REQUESTS, 1), (OUTPUT, rng.randint(0, 90))]
        ok, states = reserve_local([(d, shared[d], a) for d, a in amounts], now)
        ok2, states2 = reserve_local([(d, theirs[d], a) for d, a in amounts], now)
        assert ok == ok2 and rate_headers(states) == rate_headers(states2)
        admitted += ok
        assert [b.level for b in shared.values()] == [b.level for b in theirs.values()]
    assert 0 < admitted < 200


def test_a_shared_bucket_keeps_the_arithmetic_of_a_local_one():
    """A bucket whose level and stamp are two float64 of shared memory refills, waits, adjusts
    and reports as one of this process does."""
    rng = random.Random(3)
    values = memoryview(bytearray(16)).cast("d")
    values[0], values[1] = 100.0, 0.0
    shared = TokenBucket(2.0, 100, 0.0, values, _Lock())
    mine = TokenBucket(2.0, 100, 0.0)
    now = 0.0
    for _ in range(300):
        now += rng.choice((0.0, 0.5, 3.0))
        amount = rng.randint(0, 60)
        for bucket in (shared, mine):
            bucket.refill(now)
        assert shared.wait(amount) == mine.wait(amount)
        if shared.wait(amount) == 0.0:
            shared.level -= amount
            mine.level -= amount
        delta = rng.randint(-40, 40)
        shared.adjust(delta, now)
        mine.adjust(delta, now)
        assert (values[0], values[1]) == tuple(mine.cells)
        assert shared.state("requests") == mine.state("requests")
    assert values[0] < 0 < values[1]  # an overuse debit was covered too
