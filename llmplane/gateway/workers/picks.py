"""Prefix picks shared by the workers (docs/gateway.md, "Workers": prefix-aware routing): each
worker appends its picks to a ring only it writes, and applies its peers' new picks before it
scores, so every worker's prefix index learns every request.

A record: u32 length (whole record, 8-byte aligned), u16 scorer, u16 key length, u32 hash
count, the key (endpoint address), padding, u64 hashes. A ring's write position only grows; a
reader more than a ring behind (or overtaken while it copied) skips to the present and loses
those picks (counted in ``lost``)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from llmplane.gateway.scheduler.prefix import PrefixIndex
from llmplane.gateway.workers.shm import cells, region

RING_BYTES = 4 << 20  # per worker: at 64 blocks a pick, about 8,000 picks of slack
_HEAD = struct.Struct("<IHHI")


class PickRings:
    """One ring per worker plus each ring's write position (created before the fork)."""

    def __init__(self, workers: int, ring_bytes: int = RING_BYTES) -> None:
        self.workers = workers
        self.ring_bytes = ring_bytes
        self.rings = [region(ring_bytes) for _ in range(workers)]
        self.positions = cells(workers, "Q")

    def feed(self, index: int) -> PickFeed:
        return PickFeed(self, index)


class PickFeed:
    """Worker ``index``'s side: ``publish`` its picks, ``apply`` its peers'."""

    def __init__(self, rings: PickRings, index: int) -> None:
        self.rings = rings
        self.index = index
        self.size = rings.ring_bytes
        self.peers = [i for i in range(rings.workers) if i != index]
        self.read = {i: rings.positions[i] for i in self.peers}  # start at the present
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
        offset = at % self.size
        first = min(length, self.size - offset)  # the rest wraps to the ring's start
        ring = self.rings.rings[self.index]
        ring[offset : offset + first] = record[:first]
        ring[: length - first] = record[first:]
        positions[self.index] = at + length  # published once written

    def apply(self) -> None:
        """Add the picks peers published since the last call to our prefix indexes."""
        positions = self.rings.positions
        for peer in self.peers:
            start, end = self.read[peer], positions[peer]
            if end == start:
                continue
            offset = start % self.size
            first = min(end - start, self.size - offset)  # the rest from the ring's start
            ring = self.rings.rings[peer]
            data = ring[offset : offset + first] + ring[: end - start - first]
            if positions[peer] - start > self.size:  # lapped, before or while we copied
                self.lost += 1
                self.read[peer] = positions[peer]
                continue
            self.read[peer] = end
            offset = 0
            while offset < len(data):
                length, scorer, key_len, n = _HEAD.unpack_from(data, offset)
                key = data[offset + _HEAD.size : offset + _HEAD.size + key_len].decode()
                hashes = struct.unpack_from(f"<{n}Q", data, offset + length - 8 * n)
                if scorer < len(self.indexes):
                    self.indexes[scorer].add(key, hashes)
                offset += length
