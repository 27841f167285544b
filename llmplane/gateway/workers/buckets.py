"""Local token buckets exact across workers: each bucket's level and stamp live in shared
memory, and a reservation or a settlement is one short critical section under a record lock
(refill, compare, take: a few hundred nanoseconds of work). Only requests on a rate-limited
route pay for it; a bucket is found by its key in a shared directory when it is first used."""

from __future__ import annotations

from llmplane.gateway.ratelimit.buckets import TokenBucket
from llmplane.gateway.workers.shm import LOCK_BUCKET_KEYS, LOCK_BUCKETS, Directory, Locks, cells


class SharedBuckets:
    """``capacity`` buckets (level, stamp as float64) shared by every worker."""

    def __init__(self, capacity: int, locks: Locks) -> None:
        self.locks = locks
        self.directory = Directory(capacity, locks.held(LOCK_BUCKET_KEYS))
        self.values = cells(2 * capacity, "d")

    def bucket(self, key: str, rate: float, burst: float, now: float) -> TokenBucket:
        """The bucket named ``key`` (full if no worker had it yet); a local one if the table
        is full."""
        found = self.directory.row(key)
        if found is None:
            return TokenBucket(rate, burst, now)
        row, new = found
        cells = self.values[2 * row : 2 * row + 2]
        bucket = TokenBucket(rate, burst, now, cells, self.locks.held(LOCK_BUCKETS))
        if new:
            with bucket.lock:
                cells[0], cells[1] = float(burst), now
        return bucket
