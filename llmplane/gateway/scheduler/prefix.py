"""Approximate prefix-cache index: which endpoint has probably cached which prompt prefix.

The prompt is cut into ``block_size``-byte blocks (64 = 16 tokens x 4 characters, the
Inference Extension's figure; bytes of the UTF-8 prompt, as Go's string indexing does); each
block's hash is xxhash64 of the block seeded by the previous block's hash, the first seeded by
the model's hash, so a hash names a whole prefix. At most ``max_blocks`` (256) leading blocks
are hashed; a trailing partial block is ignored.

One LRU of block hashes per endpoint, bounded at ``capacity`` (31,250) entries, plus a reverse
map hash -> endpoints, so scoring costs one dict lookup per matched block however many
endpoints there are (not blocks x endpoints). The index is updated for the endpoint a request
is actually sent to.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import xxhash

from llmplane.gateway.scheduler.framework import SchedulingContext
from llmplane.gateway.state import EndpointState

_xxh64 = xxhash.xxh64_intdigest


def block_hashes(
    prompt: bytes, model: str, block_size: int = 64, max_blocks: int = 256
) -> list[int]:
    """Chained hashes of the prompt's leading full blocks."""
    count = min(len(prompt) // block_size, max_blocks)
    if count == 0:
        return []
    h = _xxh64(model.encode())
    view = memoryview(prompt)
    out = [0] * count
    for i in range(count):
        start = i * block_size
        h = _xxh64(view[start : start + block_size], h)
        out[i] = h
    return out


class PrefixIndex:
    def __init__(self, capacity: int = 31_250) -> None:
        self.capacity = capacity
        self.lrus: dict[str, OrderedDict[int, None]] = {}
        self.holders: dict[int, set[str]] = {}

    def add(self, endpoint: str, hashes: Sequence[int]) -> None:
        lru = self.lrus.get(endpoint)
        if lru is None:
            lru = self.lrus[endpoint] = OrderedDict()
        holders = self.holders
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            members = holders.get(h)
            if members is None:
                holders[h] = {endpoint}
            else:
                members.add(endpoint)
        while len(lru) > self.capacity:
            old, _ = lru.popitem(last=False)
            self._drop(old, endpoint)

    def _drop(self, h: int, endpoint: str) -> None:
        members = self.holders.get(h)
        if members is not None:
            members.discard(endpoint)
            if not members:
                del self.holders[h]

    def remove(self, endpoint: str) -> None:
        lru = self.lrus.pop(endpoint, None)
        for h in lru or ():
            self._drop(h, endpoint)

    def matches(self, hashes: Sequence[int], endpoints: set[str]) -> dict[str, int]:
        """Consecutive leading blocks each endpoint holds (only endpoints with at least one)."""
        result: dict[str, int] = {}
        holders = self.holders
        alive = endpoints
        for i, h in enumerate(hashes):
            members = holders.get(h)
            now = (alive & members) if members else set()
            if i and len(now) != len(alive):
                for gone in alive - now:
                    result[gone] = i
            alive = now
            if not alive:
                return result
        for e in alive:
            result[e] = len(hashes)
        return result


class PrefixCacheScorer:
    """score = consecutive leading blocks the endpoint probably holds / blocks in the prompt."""

    def __init__(
        self,
        name: str = "prefix-cache",
        block_size: int = 64,
        max_blocks: int = 256,
        capacity: int = 31_250,
    ) -> None:
        self.name = name
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.index = PrefixIndex(capacity)

    def hashes(self, ctx: SchedulingContext) -> list[int]:
        key = ("prefix", self.block_size, self.max_blocks)
        cached = ctx.cache.get(key)
        if cached is None:
            cached = ctx.cache[key] = block_hashes(
                ctx.prompt, ctx.model, self.block_size, self.max_blocks
            )
        return cached

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        hashes = self.hashes(ctx)
        if not hashes:
            return [0.0] * len(endpoints)
        matched = self.index.matches(hashes, {e.key for e in endpoints})
        total = len(hashes)
        return [matched.get(e.key, 0) / total for e in endpoints]

    def on_pick(self, ctx: SchedulingContext, endpoint: EndpointState) -> None:
        hashes = self.hashes(ctx)
        if hashes:
            self.index.add(endpoint.key, hashes)

    def on_remove(self, endpoint: EndpointState) -> None:
        self.index.remove(endpoint.key)
