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

from collections import deque
from collections.abc import Container, Iterable, Sequence
from itertools import compress, islice, repeat
from operator import attrgetter
from typing import Protocol

import xxhash

from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.framework import SchedulingContext, best

_xxh64 = xxhash.xxh64_intdigest
_key = attrgetter("address")  # EndpointState.key, without the property call


def block_hashes(
    prompt: bytes, model: str, block_size: int = 64, max_blocks: int = 256
) -> list[int]:
    """Chained hashes of the prompt's leading full blocks."""
    count = min(len(prompt) // block_size, max_blocks)
    if count == 0:
        return []
    h = _xxh64(model.encode())
    # bytes slices (a 64-byte copy) cost less than memoryview slices; one comprehension.
    return [
        h := _xxh64(prompt[start : start + block_size], h)
        for start in range(0, count * block_size, block_size)
    ]


class PrefixIndex:
    """Block hash -> endpoints holding it, as an integer bit mask (one bit per endpoint), plus
    one insertion-ordered dict per endpoint as its LRU. Only ints, strings and dicts of them:
    CPython's garbage collector does not track such dicts, so a full index (millions of
    entries) costs no GC pauses, and matching is one ``&`` per block."""

    def __init__(self, capacity: int = 31_250) -> None:
        self.capacity = capacity
        self.lrus: dict[str, dict[int, bool]] = {}
        self.holders: dict[int, int] = {}
        self.bits: dict[str, int] = {}
        self.names: list[str | None] = []  # bit -> endpoint (None: free)
        self._free: list[int] = []

    def _bit(self, endpoint: str) -> int:
        bit = self.bits.get(endpoint)
        if bit is None:
            bit = self.bits[endpoint] = name_bit(self.names, self._free, endpoint)
        return bit

    def add(self, endpoint: str, hashes: Sequence[int], held: int | None = None) -> None:
        """Record that ``endpoint`` holds ``hashes`` (a prompt's chain, block 0 first).

        The chain goes in deepest block first, so block 0 ends up the youngest: eviction takes
        the tails of old prompts before their heads, and a head is what a match starts from.
        ``held`` = how many leading blocks the endpoint is already known to hold (the scorer's
        match for it): only those are looked up and moved, which saves a lookup per block in
        dicts too large for the CPU cache (the cost of this method is memory latency)."""
        flag = 1 << self._bit(endpoint)
        lru = self.lrus.get(endpoint)
        if lru is None:
            lru = self.lrus[endpoint] = {}
        holders = self.holders
        # Out with the known blocks and back in at the young end: all in C.
        if held is None:
            known: Iterable[int] = lru.keys() & hashes
            new: Iterable[int] = set(hashes).difference(known) if known else hashes
        else:
            known = hashes[:held]
            new = hashes[held:]
        deque(map(lru.pop, known, repeat(None)), maxlen=0)
        lru.update(dict.fromkeys(reversed(hashes), True))
        for h in new:
            holders[h] = holders.get(h, 0) | flag
        if len(lru) > self.capacity:
            keep = ~flag
            excess = len(lru) - self.capacity
            for old in list(islice(lru, excess)):
                del lru[old]
                left = holders.get(old, 0) & keep
                if left:
                    holders[old] = left
                else:
                    holders.pop(old, None)

    def remove(self, endpoint: str) -> None:
        bit = self.bits.pop(endpoint, None)
        lru = self.lrus.pop(endpoint, None)
        if bit is None:
            return
        self.names[bit] = None
        keep = ~(1 << bit)
        holders = self.holders
        for h in lru or ():
            left = holders.get(h, 0) & keep
            if left:
                holders[h] = left
            else:
                holders.pop(h, None)
        self._free.append(bit)

    def matches(
        self, hashes: Sequence[int], endpoints: Container[str] | None = None
    ) -> dict[str, int]:
        """Consecutive leading blocks each endpoint holds (only endpoints with at least one,
        and of those only the ones in ``endpoints`` if given).

        The walk starts from the endpoints holding the first block (one lookup) and follows
        them block by block, so its cost does not grow with the number of endpoints: at a
        thousand endpoints, looking each one up was most of a pick."""
        return leading_runs(self.holders, self.names, hashes, endpoints)


def name_bit(names: list[str | None], free: list[int], name: str) -> int:
    """A bit for ``name`` in a bit mask index: a freed one (``free``) if any, else a new one;
    ``names[bit]`` is ``name`` from now on."""
    if free:
        bit = free.pop()
        names[bit] = name
    else:
        bit = len(names)
        names.append(name)
    return bit


_BIT_FLAGS = bytes.maketrans(b"01", b"\0\1")


def run_groups(
    holders: dict[int, int], names: Sequence[str | None], hashes: Sequence[int]
) -> list[tuple[int, list[str]]]:
    """(depth, the names holding exactly the first ``depth`` of ``hashes`` in a row), for
    each depth where some stop, shallowest first; from ``holders`` (hash -> bit mask of the
    names holding it) and ``names`` (bit -> name). One dict read and one ``&`` a block, and a
    mask's names in C-level steps (its binary digits select from ``names``): picking bits one
    by one cost three big-integer operations per holder, 0.3 ms when 1,000 replicas hold the
    request's first block."""
    if not hashes:
        return []
    alive = holders.get(hashes[0], 0)
    if not alive:
        return []
    masks = []
    for i in range(1, len(hashes)):
        now = alive & holders.get(hashes[i], 0)
        if now != alive:
            masks.append((i, alive & ~now))
            alive = now
            if not alive:
                break
    else:
        masks.append((len(hashes), alive))
    return [
        (depth, list(compress(names, bin(mask)[:1:-1].encode().translate(_BIT_FLAGS))))
        for depth, mask in masks
    ]


def runs_by_name(
    groups: Iterable[tuple[int, Iterable[str]]], endpoints: Container[str] | None = None
) -> dict[str, int]:
    """``run_groups`` as name -> depth (only the names in ``endpoints`` if given)."""
    result: dict[str, int] = {}
    for depth, held in groups:
        result.update(
            dict.fromkeys(
                held if endpoints is None else filter(endpoints.__contains__, held), depth
            )
        )
    return result


def leading_runs(
    holders: dict[int, int],
    names: Sequence[str | None],
    hashes: Sequence[int],
    endpoints: Container[str] | None = None,
) -> dict[str, int]:
    """Consecutive leading ``hashes`` each endpoint holds (see ``run_groups``,
    ``PrefixIndex.matches``). Shared with the index of the engines' real blocks
    (``gateway/kvcache/index.py``)."""
    return runs_by_name(run_groups(holders, names, hashes), endpoints)


class SharedPicks(Protocol):
    """The picks of the other gateway workers (``gateway/workers/picks.py``): a scorer joins
    with its index (and gets the number its picks go under), applies its peers' picks before
    it scores and publishes its own."""

    def join(self, index: PrefixIndex) -> int: ...

    def apply(self) -> None: ...

    def publish(self, scorer: int, key: str, hashes: Sequence[int]) -> None: ...


class PrefixCacheScorer:
    """score = consecutive leading blocks the endpoint probably holds / blocks in the prompt.
    ``feed``: with several gateway workers, the picks shared with the others."""

    def __init__(
        self,
        name: str = "prefix-cache",
        block_size: int = 64,
        max_blocks: int = 256,
        capacity: int = 31_250,
        feed: SharedPicks | None = None,
    ) -> None:
        self.name = name
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.index = PrefixIndex(capacity)
        self.feed = feed
        self.feed_id = feed.join(self.index) if feed is not None else 0

    def hashes(self, ctx: SchedulingContext) -> list[int]:
        key = ("prefix", self.block_size, self.max_blocks)
        cached = ctx.cache.get(key)
        if cached is None:
            if 0 <= ctx.prompt_bound < self.block_size:
                cached = ctx.cache[key] = []  # not one full block: what block_hashes gives
            else:
                cached = ctx.cache[key] = block_hashes(
                    ctx.prompt, ctx.model, self.block_size, self.max_blocks
                )
        return cached

    def scores(self, ctx: SchedulingContext) -> dict[str, float]:
        """Endpoint -> score for the endpoints holding the request's first block (any endpoint
        of the index: only the candidates' are read); computed once a request."""
        key = (self, "scores")
        scores = ctx.cache.get(key)
        if scores is not None:
            return scores
        if self.feed is not None:
            self.feed.apply()
        scores = ctx.cache[key] = {}
        hashes = self.hashes(ctx)
        if not hashes:
            return scores
        groups = run_groups(self.index.holders, self.index.names, hashes)
        ctx.cache[self] = runs_by_name(groups)
        total = len(hashes)
        for depth, held in groups:  # a run length at a time, in C
            scores.update(dict.fromkeys(held, depth / total))
        return scores

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        scores = self.scores(ctx)
        if not scores:
            return [0.0] * len(endpoints)
        # One lookup per endpoint, all in C (EndpointState.key is endpoint.address).
        return list(map(scores.get, map(_key, endpoints), repeat(0.0)))

    def favoured(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState], k: int
    ) -> list[EndpointState]:
        return best(endpoints, self.scores(ctx), k)

    def on_pick(self, ctx: SchedulingContext, endpoint: EndpointState) -> None:
        hashes = self.hashes(ctx)
        if hashes:
            matched = ctx.cache.get(self)  # from score(), when this request was scored
            held = matched.get(endpoint.key, 0) if matched is not None else None
            self.index.add(endpoint.key, hashes, held)
            if self.feed is not None:
                self.feed.publish(self.feed_id, endpoint.key, hashes)

    def on_remove(self, endpoint: EndpointState) -> None:
        self.index.remove(endpoint.key)
