"""Engine metrics scraped once for every worker: worker 0 scrapes each endpoint and publishes
what ``EndpointState`` keeps from a scrape into a row of shared memory (the endpoint's column
of the in-flight table); the other workers copy changed rows into their own states.

Each row is a seqlock: its one writer makes the sequence number odd, writes the fields, makes
it even again; a reader copies the fields and keeps them only if the number was even and
unchanged around the copy. Neither side ever waits for the other, and nothing of it runs on a
request's path: followers copy in a background task (``ScrapeFollower``), so the scheduler
keeps reading plain attributes. A table-wide counter, bumped after each publication, lets an
idle follower see "nothing new" in one read.

A worker that dies while writing leaves its row odd; the next writer (its replacement) steps
over it. LoRA adapter names share ``TEXT_BYTES`` per row; past that, the last names are left
out (and logged once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Callable, Iterable

from llmplane.gateway.registry import EndpointState
from llmplane.gateway.workers.shm import region

log = logging.getLogger("llmplane.gateway")

ROW_BYTES = 1024
# seq, waiting, running, kv, scraped_at, prefix hits, prefix queries, inflight at scrape,
# flags, max_lora, adapters text length
_HEAD = struct.Struct("<qddddddqqqq")
TEXT_BYTES = ROW_BYTES - _HEAD.size
_FIELDS = struct.Struct("<ddddddqqqq")  # the head without seq
HAS_KV, KNOWN, HAS_LOAD, SCRAPE_OK = 1, 2, 4, 8
READ_TRIES = 4


class ScrapeTable:
    """``capacity`` rows of scraped signals in shared memory, plus the publication counter."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.mem = region(capacity * ROW_BYTES + 8)
        self.words = memoryview(self.mem).cast("q")  # row i's seq: words[i * ROW_BYTES // 8]
        self.generation_word = capacity * ROW_BYTES // 8
        self._truncated = False

    def generation(self) -> int:
        return self.words[self.generation_word]

    def publish(self, column: int, state: EndpointState) -> None:
        """Write ``state``'s scraped fields into row ``column`` (one writer per row)."""
        running = ",".join(sorted(state.lora_running)).encode()
        waiting = ",".join(sorted(state.lora_waiting)).encode()
        text = running + b"\n" + waiting
        if len(text) > TEXT_BYTES:
            if not self._truncated:
                self._truncated = True
                log.warning("LoRA adapter names of %s cut to %d bytes", state.address, TEXT_BYTES)
            text = text[:TEXT_BYTES]
        flags = (
            (HAS_KV if state.has_kv else 0)
            | (KNOWN if state.has_load_metrics is not None else 0)
            | (HAS_LOAD if state.has_load_metrics else 0)
            | (SCRAPE_OK if state.scrape_ok else 0)
        )
        words = self.words
        at = column * (ROW_BYTES // 8)
        seq = words[at]
        begin = seq + 1 if seq % 2 == 0 else seq + 2  # odd: writing (a dead writer left it odd)
        words[at] = begin
        offset = column * ROW_BYTES
        _FIELDS.pack_into(
            self.mem,
            offset + 8,
            state.waiting,
            state.running,
            state.kv_usage,
            state.scraped_at,
            state.prefix_hits,
            state.prefix_queries,
            state.inflight_at_scrape,
            flags,
            state.max_lora,
            len(text),
        )
        self.mem[offset + _HEAD.size : offset + _HEAD.size + len(text)] = text
        words[at] = begin + 1
        words[self.generation_word] += 1

    def read(self, column: int, seen: int) -> tuple[int, tuple, bytes] | None:
        """(seq, fields, adapters text) of row ``column`` if it changed since ``seen`` and a
        consistent copy was had; else None."""
        words = self.words
        at = column * (ROW_BYTES // 8)
        offset = column * ROW_BYTES
        for _ in range(READ_TRIES):
            seq = words[at]
            if seq == seen or seq == 0:
                return None
            if seq % 2:
                continue
            fields = _FIELDS.unpack_from(self.mem, offset + 8)
            start = offset + _HEAD.size
            text = self.mem[start : start + min(max(fields[-1], 0), TEXT_BYTES)]
            if words[at] == seq:
                return seq, fields, text
        return None


def apply_row(state: EndpointState, fields: tuple, text: bytes) -> None:
    """A published row into a follower's state."""
    waiting, running, kv, scraped_at, hits, queries, at_scrape, flags, max_lora, _ = fields
    state.waiting, state.running, state.kv_usage = waiting, running, kv
    state.scraped_at = scraped_at
    state.prefix_hits, state.prefix_queries = hits, queries
    state.inflight_at_scrape = at_scrape
    state.has_kv = bool(flags & HAS_KV)
    state.has_load_metrics = bool(flags & HAS_LOAD) if flags & KNOWN else None
    state.scrape_ok = bool(flags & SCRAPE_OK)
    state.max_lora = max_lora
    running_text, _, waiting_text = text.partition(b"\n")
    state.lora_running = _names(running_text)
    state.lora_waiting = _names(waiting_text)


def _names(text: bytes) -> frozenset[str]:
    return (
        frozenset(n for n in text.decode("utf-8", "replace").split(",") if n)
        if text
        else frozenset()
    )


def column_of(state: EndpointState) -> int | None:
    """The state's row in the shared tables (None: a worker-local state, the table was full)."""
    column = getattr(state, "column", -1)
    return column if column >= 0 else None


class ScrapeFollower:
    """A worker that does not scrape: every ``interval`` it copies the rows published since it
    last looked into its states and calls ``on_changed`` if any changed.

    Publications come at least every half ``stale_after`` while the scraper runs (its idle
    ticker refreshes ``scraped_at``). When none came for ``stale_after`` seconds the scraper
    is gone (killed and not yet replaced, stopped): the states are marked ``scrape_ok =
    False``, so admission counts in-flight requests as for an engine whose metrics cannot be
    read, instead of taking every endpoint for saturated because its copy is old. Each row
    published again restores its state."""

    def __init__(
        self,
        table: ScrapeTable,
        states: Callable[[], Iterable[EndpointState]],
        interval: float,
        on_changed: Callable[[], None] | None = None,
        stale_after: float = 0.2,
    ) -> None:
        self.table = table
        self.states = states
        self.interval = interval
        self.on_changed = on_changed
        self.stale_after = stale_after
        self.seen: dict[int, int] = {}  # column -> seq applied
        self.orphaned = False  # no publication for stale_after seconds
        self._generation = -1
        self._moved = time.monotonic()
        self._rescan = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="scrape follower")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def added(self, state: EndpointState) -> None:
        """A new state (perhaps for an address seen before): copy its row at the next poll."""
        column = column_of(state)
        if column is not None:
            self.seen.pop(column, None)
        self._rescan = True

    def poll(self, now: float | None = None) -> bool:
        """Copy what changed; True if anything did."""
        now = time.monotonic() if now is None else now
        generation = self.table.generation()
        if generation != self._generation:
            self._generation = generation
            self._moved = now
            self.orphaned = False
        elif not self.orphaned and now - self._moved > self.stale_after:
            self.orphaned = True
            for state in self.states():
                if column_of(state) is not None:
                    state.scrape_ok = False
            if self.on_changed is not None:
                self.on_changed()
            return True
        elif not self._rescan:
            return False
        self._rescan = False
        changed = False
        seen = self.seen
        read = self.table.read
        for state in self.states():
            column = column_of(state)
            if column is None:
                continue
            row = read(column, seen.get(column, 0))
            if row is not None:
                seen[column] = row[0]
                apply_row(state, row[1], row[2])
                if self.orphaned:
                    state.scrape_ok = False
                changed = True
        if changed and self.on_changed is not None:
            self.on_changed()
        return changed

    async def _run(self) -> None:
        while True:
            try:
                self.poll()
            except Exception:
                log.exception("reading the shared scrapes failed")
            await asyncio.sleep(self.interval)
