"""Local token buckets exact across workers: each bucket's level and stamp live in shared
memory, and a reservation or a settlement is one short critical section under a record lock
(refill, compare, take: a few hundred nanoseconds of work). Only requests on a rate-limited
route pay for it; a bucket is found by its key in a shared directory when it is first used."""

from __future__ import annotations

from contextlib import AbstractContextManager

from llmplane.gateway.ratelimit.buckets import TokenBucket
from llmplane.gateway.workers.shm import LOCK_BUCKET_KEYS, LOCK_BUCKETS, Directory, Locks, region


class SharedBuckets:
    """``capacity`` buckets (level, stamp as float64) shared by every worker."""

    def __init__(self, capacity: int, locks: Locks) -> None:
        self.capacity = capacity
        self.locks = locks
        self.directory = Directory(capacity, locks, LOCK_BUCKET_KEYS)
        self.mem = region(capacity * 16)
        self.values = memoryview(self.mem).cast("d")

    def bucket(self, key: str, rate: float, burst: float, now: float) -> TokenBucket:
        """The bucket named ``key`` (full if no worker had it yet); a local one if the table
        is full."""
        found = self.directory.row(key)
        if found is None:
            return TokenBucket(rate, burst, now)
        row, new = found
        bucket = SharedTokenBucket(rate, burst, self.values, row * 2, self.locks.held(LOCK_BUCKETS))
        if new:
            with bucket.lock:
                bucket.level = float(burst)
                bucket.stamp = now
        return bucket


class SharedTokenBucket(TokenBucket):
    """A ``TokenBucket`` whose level and stamp are shared; ``lock`` must be held around a
    read-modify-write (``reserve_local`` and ``adjust`` take it)."""

    __slots__ = ("_at", "_values")

    def __init__(
        self,
        rate: float,
        burst: float,
        values: memoryview,
        at: int,
        lock: AbstractContextManager[None],
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._values = values
        self._at = at
        self.lock = lock

    @property  # type: ignore[override]
    def level(self) -> float:
        return self._values[self._at]

    @level.setter
    def level(self, value: float) -> None:
        self._values[self._at] = value

    @property  # type: ignore[override]
    def stamp(self) -> float:
        return self._values[self._at + 1]

    @stamp.setter
    def stamp(self, value: float) -> None:
        self._values[self._at + 1] = value
