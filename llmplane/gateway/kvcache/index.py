"""Which replica holds which KV blocks, from the engines' own events, keyed by token ids
(docs/gateway.md, "The index").

Keys are the gateway's own, chained over token ids, so nothing depends on an engine's hash
function or seed; the engine's hash -> key map per replica only serves ``BlockRemoved``. A
partition (model, block size) maps key -> bit mask of the replicas holding it: a lookup is one
dict read per block however many replicas there are. Blocks sent to a replica and not yet
reported count as on their way there (``expect``) for ``EXPECT_SECONDS`` at most. Memory is
bounded per model (``max_blocks``, about 190 bytes a block: tests/unit/test_kv_index.py);
over the bound the replica holding the most blocks loses its oldest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice
from struct import pack

import msgpack
import xxhash

from llmplane.gateway.kvcache.events import Batch, Cleared, EngineHash, Removed, Stored
from llmplane.gateway.scheduler.prefix import leading_runs, name_bit, run_groups

_xxh64 = xxhash.xxh64_intdigest
ROOT = _xxh64(b"llmplane kv block")
BYTES_PER_BLOCK = 190
DEFAULT_MAX_BLOCKS = 4_000_000  # per model: about 0.75 GB at most
MAX_LOOKUP_BLOCKS = 4_096  # of a request: 512K tokens at block size 128
# Blocks sent to a replica count as on their way there for this long at most (a request that
# failed, or events that never came), and at most this many are remembered.
EXPECT_SECONDS = 10.0
MAX_EXPECTED = 1_000_000


def root_key(lora: str | None = None) -> int:
    """The seed of block 0: adapters never share a block with the base model."""
    return ROOT if not lora else _xxh64(lora.encode(), ROOT)


def block_keys(
    token_ids: Sequence[int],
    block_size: int,
    parent: int = ROOT,
    extra: Sequence[object] | None = None,
    lora: str | None = None,
    limit: int = MAX_LOOKUP_BLOCKS,
) -> list[int]:
    """Chained keys of the full blocks of ``token_ids`` (at most ``limit``), block 0 seeded
    by ``parent``; ``extra`` (per block, what the engine hashed besides the tokens) and
    ``lora`` (the adapter named there too, already in the root) as ``Stored`` carries them."""
    count = min(len(token_ids) // block_size, limit)
    if count <= 0:
        return []
    # (struct packs a list 2.5x faster than array("q", ...): most of a request's keys' cost)
    data = pack(f"<{count * block_size}q", *token_ids[: count * block_size])
    step = 8 * block_size
    keys = []
    h = parent
    for i in range(count):
        h = _xxh64(data[i * step : (i + 1) * step], h)
        if extra is not None and extra[i] is not None:
            rest = [x for x in extra[i] if x != lora] if isinstance(extra[i], list) else extra[i]
            if rest:
                h = _xxh64(msgpack.packb(rest, default=repr), h)
        keys.append(h)
    return keys


class _Replica:
    __slots__ = ("bit", "block_size", "blocks", "model")

    def __init__(self, bit: int, model: str) -> None:
        self.bit = bit
        self.model = model
        self.block_size = 0  # from its first BlockStored
        # Engine block hash -> our key, oldest first.
        self.blocks: dict[EngineHash, int] = {}


class BlockIndex:
    """The blocks every subscribed replica holds (see the module's docstring)."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self.replicas: dict[str, _Replica] = {}
        self.names: list[str | None] = []  # bit -> replica (None: free)
        self._free: list[int] = []
        # model -> block size -> key -> bit mask of the replicas holding it.
        self.partitions: dict[str, dict[int, dict[int, int]]] = {}
        self.sizes: dict[str, int] = {}  # model -> blocks indexed
        self.evicted = 0  # blocks dropped over the bound
        self.orphans = 0  # stored blocks whose parent the index does not know
        # Blocks sent, not reported: key -> replica -> until when (monotonic) it counts, and
        # the sends in the order they expire.
        self.expected: dict[int, dict[str, float]] = {}
        self._expiries: deque[tuple[float, list[int], str]] = deque()
        self._expected_blocks = 0

    # --- replicas ---------------------------------------------------------------------------

    def add_replica(self, replica: str, model: str) -> None:
        if replica in self.replicas:
            return
        self.replicas[replica] = _Replica(name_bit(self.names, self._free, replica), model)

    def remove_replica(self, replica: str) -> None:
        self.clear(replica)
        state = self.replicas.pop(replica, None)
        if state is not None:
            self.names[state.bit] = None
            self._free.append(state.bit)

    def clear(self, replica: str) -> None:
        """Forget every block of ``replica`` (AllBlocksCleared, a restart, a gap), and those
        on their way there."""
        if self.expected:
            for _, keys, to in self._expiries:
                if to == replica:
                    self._unexpect(keys, replica)
        state = self.replicas.get(replica)
        if state is not None and state.blocks:
            self._forget(state, list(state.blocks))
            state.blocks = {}  # (a dict keeps its size after its entries are gone)

    def held(self, replica: str) -> int:
        state = self.replicas.get(replica)
        return len(state.blocks) if state is not None else 0

    # --- events -------------------------------------------------------------------------------

    def apply(self, replica: str, batch: Batch) -> None:
        state = self.replicas.get(replica)
        if state is None:
            return
        for event in batch.events:
            if isinstance(event, Stored):
                self._stored(replica, state, event)
            elif isinstance(event, Removed):
                if state.blocks:
                    self._forget(state, event.hashes)
            elif isinstance(event, Cleared):
                self.clear(replica)
        if self.sizes.get(state.model, 0) > self.max_blocks:
            self._evict(state.model)

    def _stored(self, replica: str, state: _Replica, event: Stored) -> None:
        if state.block_size != event.block_size:
            if state.blocks:
                return  # one block size a replica (vLLM's group 0): a stray event
            state.block_size = event.block_size
        if event.parent is None:
            parent = root_key(event.lora)
        else:
            known = state.blocks.get(event.parent)
            if known is None:
                self.orphans += len(event.hashes)
                return
            parent = known
        keys = block_keys(
            event.token_ids, event.block_size, parent, event.extra, event.lora, len(event.hashes)
        )
        model = self.partitions.setdefault(state.model, {})
        holders = model.get(event.block_size)
        if holders is None:
            holders = model[event.block_size] = {}
        flag = 1 << state.bit
        blocks = state.blocks
        before = len(blocks)
        for engine_hash, key in zip(event.hashes, keys, strict=True):
            old = blocks.pop(engine_hash, None)
            if old is not None and old != key:
                self._unhold(holders, old, flag)
            blocks[engine_hash] = key
            holders[key] = holders.get(key, 0) | flag
        self.sizes[state.model] = self.sizes.get(state.model, 0) + len(blocks) - before
        if self.expected:  # reported: from now on its events say whether it is there
            self._unexpect(keys, replica)

    def _forget(self, state: _Replica, hashes: Iterable[EngineHash]) -> int:
        """Drop ``hashes`` from ``state``'s blocks; how many it held."""
        holders = self.partitions[state.model][state.block_size]
        flag = 1 << state.bit
        blocks = state.blocks
        before = len(blocks)
        for engine_hash in hashes:
            key = blocks.pop(engine_hash, None)
            if key is not None:
                self._unhold(holders, key, flag)
        forgotten = before - len(blocks)
        self.sizes[state.model] -= forgotten
        return forgotten

    @staticmethod
    def _unhold(holders: dict[int, int], key: int, flag: int) -> None:
        left = holders.get(key, 0) & ~flag
        if left:
            holders[key] = left
        else:
            holders.pop(key, None)

    def _evict(self, model: str) -> None:
        """The model's largest replica loses its oldest blocks until the model is within
        the bound (one replica flooding the index takes only its own blocks)."""
        excess = self.sizes[model] - self.max_blocks
        while excess > 0:
            largest = max(
                (s for s in self.replicas.values() if s.model == model),
                key=lambda s: len(s.blocks),
            )
            oldest = list(islice(largest.blocks, excess))
            forgotten = self._forget(largest, oldest)
            self.evicted += forgotten
            excess -= forgotten

    # --- blocks sent, not reported yet -----------------------------------------------------

    def expect(self, replica: str, block_size: int, keys: list[int], now: float) -> None:
        """``keys`` (at ``block_size``) were sent to ``replica`` at ``now``: those it has not
        reported are on their way there (see the module's docstring). Only for a subscribed
        replica, at its block size once it reported one."""
        state = self.replicas.get(replica)
        if state is None or (state.block_size and state.block_size != block_size):
            return
        holders = self.partitions.get(state.model, {}).get(block_size)
        if holders:
            flag = 1 << state.bit
            keys = [key for key in keys if not holders.get(key, 0) & flag]
            if not keys:
                return
        self.prune(now)
        until = now + EXPECT_SECONDS
        expected = self.expected
        for key in keys:
            to = expected.get(key)
            if to is None:
                expected[key] = {replica: until}
            else:
                to[replica] = until
        self._expiries.append((until, keys, replica))
        self._expected_blocks += len(keys)

    def expected_runs(
        self, model: str, block_size: int, keys: Sequence[int], held: dict[str, int], now: float
    ) -> dict[str, int]:
        """Leading blocks of ``keys`` each replica holds or has on their way, for the replicas
        with blocks on their way right after those they hold (``held``: ``matches``)."""
        expected = self.expected
        if not keys or not expected:
            return {}
        first = expected.get(keys[0])
        candidates = {r for r, until in first.items() if until > now} if first else set()
        count = len(keys)
        for n in set(held.values()):  # a lookup a run length, not one a holder
            to = expected.get(keys[n]) if n < count else None
            if to:
                candidates.update(r for r, until in to.items() if until > now and held.get(r) == n)
        if not candidates:
            return {}
        holders = self.partitions.get(model, {}).get(block_size, {})
        runs = {}
        for replica in candidates:
            flag = 1 << self.replicas[replica].bit
            i = held.get(replica, 0)
            while i < count:
                key = keys[i]
                to = expected.get(key)
                if (to is None or to.get(replica, 0.0) <= now) and not holders.get(key, 0) & flag:
                    break
                i += 1
            runs[replica] = i
        return runs

    def prune(self, now: float) -> None:
        """Forget the sends past their time, and the oldest beyond ``MAX_EXPECTED`` blocks."""
        expiries, expected = self._expiries, self.expected
        while expiries and (expiries[0][0] <= now or self._expected_blocks > MAX_EXPECTED):
            until, keys, replica = expiries.popleft()
            self._expected_blocks -= len(keys)
            for key in keys:
                holders = expected.get(key)
                if holders is not None and holders.get(replica) == until:
                    del holders[replica]
                    if not holders:
                        del expected[key]

    def _unexpect(self, keys: Sequence[int], replica: str) -> None:
        expected = self.expected
        for key in keys:
            holders = expected.get(key)
            if holders is not None and holders.pop(replica, None) is not None and not holders:
                del expected[key]

    # --- lookups ------------------------------------------------------------------------------

    def block_sizes(self, model: str) -> list[int]:
        return [size for size, holders in self.partitions.get(model, {}).items() if holders]

    def matches(self, model: str, block_size: int, keys: Sequence[int]) -> dict[str, int]:
        """Leading blocks of ``keys`` (``block_keys`` of a request at ``block_size``) each
        replica of ``model`` holds (only replicas holding at least one)."""
        holders = self.partitions.get(model, {}).get(block_size)
        if not holders:
            return {}
        return leading_runs(holders, self.names, keys)

    def run_groups(
        self, model: str, block_size: int, keys: Sequence[int]
    ) -> list[tuple[int, list[str]]]:
        """``matches`` as (leading blocks held, the replicas holding that many), shallowest
        first (``scheduler/prefix.run_groups``)."""
        holders = self.partitions.get(model, {}).get(block_size)
        if not holders:
            return []
        return run_groups(holders, self.names, keys)
