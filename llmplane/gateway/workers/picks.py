"""Prefix-aware routing with several workers: every worker publishes the prompt-prefix picks it
makes (endpoint, block hashes) to a ring in shared memory that only it writes, and before
scoring a request each worker applies the picks its peers published since it last looked. So
each worker's prefix index learns every request, as one process's would.

A ring record: u32 length (whole record, 8-byte aligned), u16 scorer, u16 key length, u32
hash count, the key (endpoint address) bytes, padding, u64 hashes. A ring's write position
only grows; a reader that fell more than a ring behind (or whose read the writer overtook)
skips to the present and loses those picks (counted in ``lost``)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from llmplane.gateway.scheduler.prefix import PrefixIndex
from llmplane.gateway.workers.shm import region

RING_BYTES = 4 << 20  # per worker: at 64 blocks a pick, about 8,000 picks of slack
_HEAD = struct.Struct("<IHHI")


class PickRings:
    """One ring per worker plus each ring's write position (created before the fork)."""

    def __init__(self, workers: int, ring_bytes: int = RING_BYTES) -> None:
        self.workers = workers
        self.ring_bytes = ring_bytes
        self.rings = [region(ring_bytes) for _ in range(workers)]
        self.positions_mem = region(workers * 8)
        self.positions = memoryview(self.positions_mem).cast("Q")

    def feed(self, index: int) -> PickFeed:
        return PickFeed(self, index)


class PickFeed:
    """Worker ``index``'s side: ``publish`` its picks, ``apply`` its peers'."""

    def __init__(self, rings: PickRings, index: int) -> None:
        self.rings = rings
        self.index = index
        self.size = rings.ring_bytes
        self.mine = rings.rings[index]
        self.peers = [i for i in range(rings.workers) if i != index]
        positions = rings.positions
        self.read = {i: positions[i] for i in self.peers}  # start at the present
        self.indexes: list[PrefixIndex] = []
        self.lost = 0

    def join(self, index: PrefixIndex) -> int:
        """Share the picks of a prefix scorer's ``index``; the number its picks go under
        (every worker builds its scorers from the same config in the same order, so a number
        names the same scorer in each)."""
        self.indexes.append(index)
        return len(self.indexes) - 1

    def publish(self, scorer: int, key: str, hashes: Sequence[int]) -> None:
        raw = key.encode()
        padded = raw + bytes(-(_HEAD.size + len(raw)) % 8)  # the hashes start 8-byte aligned
        n = len(hashes)
        length = _HEAD.size + len(padded) + 8 * n
        if length > self.size // 4:
            return
        record = _HEAD.pack(length, scorer, len(raw), n) + padded + struct.pack(f"<{n}Q", *hashes)
        positions = self.rings.positions
        at = positions[self.index]
        self._write(at % self.size, record)
        positions[self.index] = at + length  # published once written

    def _write(self, offset: int, data: bytes) -> None:
        end = offset + len(data)
        if end <= self.size:
            self.mine[offset:end] = data
            return
        first = self.size - offset
        self.mine[offset:] = data[:first]
        self.mine[0 : len(data) - first] = data[first:]

    def apply(self) -> None:
        """Add the picks peers published since the last call to our prefix indexes."""
        positions = self.rings.positions
        for peer in self.peers:
            end = positions[peer]
            start = self.read[peer]
            if end == start:
                continue
            if end - start > self.size:
                self.lost += 1
                self.read[peer] = end
                continue
            data = self._copy(self.rings.rings[peer], start, end)
            if positions[peer] - start > self.size:  # overwritten while we copied
                self.lost += 1
                self.read[peer] = positions[peer]
                continue
            self.read[peer] = end
            self._apply(data)

    def _copy(self, ring: Any, start: int, end: int) -> bytes:
        a, b = start % self.size, end % self.size
        if a < b or end == start:
            return ring[a:b]
        return ring[a:] + ring[:b]

    def _apply(self, data: bytes) -> None:
        indexes = self.indexes
        offset = 0
        total = len(data)
        while offset < total:
            length, scorer, key_len, n = _HEAD.unpack_from(data, offset)
            key_at = offset + _HEAD.size
            key = data[key_at : key_at + key_len].decode()
            hashes_at = offset + length - 8 * n
            hashes = struct.unpack_from(f"<{n}Q", data, hashes_at)
            if scorer < len(indexes):
                indexes[scorer].add(key, hashes)
            offset += length
