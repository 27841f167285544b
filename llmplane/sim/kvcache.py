"""Paged KV cache with automatic prefix caching (pure, no I/O).

Blocks of ``block_size`` tokens. A full block is identified by a chained hash: the hash of
block ``i`` is xxhash64 of its token ids seeded by the hash of block ``i-1`` (the first
block is seeded by an extra key, e.g. the LoRA adapter, so adapters never share cache).
Blocks no request holds stay in the cache until they are needed again: the free list is an
LRU, reused from its oldest end, and a request's blocks are freed tail first so that the
tail of a prompt is evicted before its head (as vLLM does).

With ``events`` set to a list, the pool records what vLLM's KV events report: a block's hash
leaving the prefix cache (``(REMOVED, hash)``, on eviction); the scheduler records the
blocks entering it (``register`` returns True for those). ``kvevents.py`` publishes them.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict

from xxhash import xxh64_intdigest

STORED, REMOVED = "stored", "removed"


def block_hash(parent: int, tokens: list[int]) -> int:
    return xxh64_intdigest(array("q", tokens).tobytes(), seed=parent)


def chain_hashes(
    tokens: list[int], block_size: int, seed: int = 0, start: int = 0, parent: int | None = None
) -> list[int]:
    """Hashes of the full blocks of ``tokens`` from block ``start`` on."""
    out = []
    h = seed if parent is None else parent
    for i in range(start * block_size, len(tokens) - block_size + 1, block_size):
        h = block_hash(h, tokens[i : i + block_size])
        out.append(h)
    return out


class BlockPool:
    """Reference-counted blocks, a hash -> block map and an LRU free list."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        # Free blocks, oldest (first to reuse) first. Values unused.
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # What entered and left the prefix cache since the publisher last took it (None: off).
        self.events: list[tuple] | None = None

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def usage(self) -> float:
        return (self.num_blocks - len(self.free)) / self.num_blocks

    def lookup(self, hashes: list[int], max_blocks: int) -> list[int]:
        """Cached blocks for the longest prefix of ``hashes`` (at most ``max_blocks``)."""
        if not self.enable_caching:
            return []
        out = []
        cached = self.cached
        for h in hashes[:max_blocks]:
            b = cached.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on cache hits (removing free ones from the free list)."""
        ref, free = self.ref, self.free
        for b in blocks:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks, evicting the least recently freed cached ones. Caller checks room."""
        if n > len(self.free):
            raise RuntimeError("out of KV blocks")
        out = []
        free, ref, hash_of, cached = self.free, self.ref, self.hash_of, self.cached
        for _ in range(n):
            b, _v = free.popitem(last=False)
            h = hash_of[b]
            if h is not None:
                if cached.get(h) == b:
                    del cached[h]
                    if self.events is not None:
                        self.events.append((REMOVED, h))
                hash_of[b] = None
            ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: list[int]) -> None:
        """Drop one reference on each block, tail first; unreferenced ones become free."""
        ref, free = self.ref, self.free
        for b in reversed(blocks):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None

    def register(self, block: int, h: int) -> bool:
        """Record that ``block`` now holds the full block with hash ``h``; True when that
        put ``h`` in the prefix cache (no other block had it)."""
        if not self.enable_caching or self.hash_of[block] is not None:
            return False
        self.hash_of[block] = h
        return self.cached.setdefault(h, block) == block
