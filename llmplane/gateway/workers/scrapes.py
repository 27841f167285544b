"""Engine metrics and model lists read once for every worker: worker 0 scrapes each endpoint
and publishes what ``EndpointState`` keeps from a scrape into a row of shared memory (the
endpoint's column of the in-flight table), and each changed ``/v1/models`` list into one shared
document; the other workers copy what changed into their own states and read nothing from the
engines. The design (rows published on change, the heartbeat that keeps idle rows fresh, what
followers do when it stops): docs/gateway.md, "Workers: several processes, one routing
state".

Each row is a seqlock: its one writer makes the sequence number odd, writes the fields, makes
it even again; a reader keeps its copy only if the number was even and unchanged around it.
Neither side waits, and nothing of it runs on a request's path. A worker that dies while
writing leaves its row odd; the next writer (its replacement) steps over it. LoRA adapter names
share ``TEXT_BYTES`` per row (past that, the last names are left out, logged once); model lists
are capped where they are read (``scraper.served_names``) and checked the same way when copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Callable, Iterable

import orjson

from llmplane.aio import Periodic
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scraper import MODELS_CHANGED_AT, adapter_names, served_names
from llmplane.gateway.workers.shm import Document, region

log = logging.getLogger("llmplane.gateway")

ROW_BYTES = 1024
# The ``EndpointState`` attributes a row copies, in the order of ``_FIELDS``, which then has
# the flags and the length of the adapters' text; a row's head is the sequence and the fields.
_ATTRS = (
    "waiting",
    "running",
    "kv_usage",
    "scraped_at",
    "prefix_hits",
    "prefix_queries",
    "capacity",
    "room",
    "kv_received",
    "ttft",
    "inflight_at_scrape",
    "max_lora",
    "block_size",
)
_SCRAPED_AT = _ATTRS.index("scraped_at")
_FIELDS = struct.Struct("<ddddddddddqqqqq")
_HEAD = struct.Struct("<q" + _FIELDS.format[1:])
TEXT_BYTES = ROW_BYTES - _HEAD.size
_TIME = struct.Struct("<d")
HAS_KV, KNOWN, HAS_LOAD, SCRAPE_OK, KEPT = 1, 2, 4, 8, 16
READ_TRIES = 4
MODELS_BYTES = 64 * 1024 * 1024  # the model-list document; pages are touched only as written


class ScrapeTable:
    """``capacity`` rows of scraped signals in shared memory, plus the publication counter."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.mem = region(capacity * ROW_BYTES + 16)
        self.words = memoryview(self.mem).cast("q")  # row i's seq: words[i * ROW_BYTES // 8]
        self.generation_word = capacity * ROW_BYTES // 8
        self.heartbeat_at = (capacity * ROW_BYTES) + 8  # a double: the scraper's clock
        self.models = Document(MODELS_BYTES)  # {column: [read at, workload, model, names]}
        self._truncated = False

    def generation(self) -> int:
        return self.words[self.generation_word]

    def beat(self, now: float) -> None:
        _TIME.pack_into(self.mem, self.heartbeat_at, now)

    def heartbeat(self) -> float:
        return _TIME.unpack_from(self.mem, self.heartbeat_at)[0]

    def publish(self, column: int, state: EndpointState, kept: bool = False) -> None:
        """Write ``state``'s scraped fields into row ``column`` (one writer per row)."""
        self.write(column, *row(state, kept))

    def write(self, column: int, fields: tuple, text: bytes) -> None:
        if len(text) > TEXT_BYTES:
            if not self._truncated:
                self._truncated = True
                log.warning("LoRA adapter names cut to %d bytes", TEXT_BYTES)
            text = text[:TEXT_BYTES]
        words = self.words
        at = column * (ROW_BYTES // 8)
        seq = words[at]
        begin = seq + 1 if seq % 2 == 0 else seq + 2  # odd: writing (a dead writer left it odd)
        words[at] = begin
        offset = column * ROW_BYTES
        _FIELDS.pack_into(self.mem, offset + 8, *fields, len(text))
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


def row(state: EndpointState, kept: bool) -> tuple[tuple, bytes]:
    """What a row holds of ``state``: its fields (``_FIELDS`` without the text's length) and
    its LoRA adapters' names."""
    flags = (
        (HAS_KV if state.has_kv else 0)
        | (KNOWN if state.has_load_metrics is not None else 0)
        | (HAS_LOAD if state.has_load_metrics else 0)
        | (SCRAPE_OK if state.scrape_ok else 0)
        | (KEPT if kept else 0)
    )
    text = b"\n".join(
        ",".join(sorted(names)).encode() for names in (state.lora_running, state.lora_waiting)
    )
    return (*(getattr(state, name) for name in _ATTRS), flags), text


def apply_row(state: EndpointState, fields: tuple, text: bytes) -> bool:
    """A published row into a follower's state; True if it was published as kept."""
    for name, value in zip(_ATTRS, fields, strict=False):
        setattr(state, name, value)
    flags = fields[len(_ATTRS)]
    state.has_kv = bool(flags & HAS_KV)
    state.has_load_metrics = bool(flags & HAS_LOAD) if flags & KNOWN else None
    state.scrape_ok = bool(flags & SCRAPE_OK)
    running, _, waiting = text.partition(b"\n")
    state.lora_running, state.lora_waiting = adapter_names(running), adapter_names(waiting)
    return bool(flags & KEPT)


def column_of(state: EndpointState) -> int | None:
    """The state's row in the shared tables (None: a worker-local state, the table was full)."""
    column = getattr(state, "column", -1)
    return column if column >= 0 else None


class ScrapePublisher:
    """Worker 0's side: rows published when their content changes (or, for an endpoint not
    kept fresh by the idle ticker, at each scrape: its ``scraped_at`` matters), model lists
    gathered into the shared document, and the heartbeat every ``tick`` seconds."""

    def __init__(
        self, table: ScrapeTable, states: Callable[[], Iterable[EndpointState]], tick: float
    ) -> None:
        self.table = table
        self.states = states
        self.tick = tick
        self.rows: dict[int, tuple] = {}  # column -> content last published
        self.models: dict[int, list] = {}  # column -> [read at, workload, model, names]
        self._models_dirty = False
        self._too_big = False
        self._ticker = Periodic(lambda: self.flush(time.monotonic()), tick, "scrape heartbeat")

    def follows(self, state: EndpointState) -> bool:
        return False  # worker 0 reads every endpoint itself

    def publish(self, state: EndpointState, kept: bool) -> None:
        column = column_of(state)
        if column is None:
            return
        fields, text = row(state, kept)
        content = (fields[:_SCRAPED_AT], fields[_SCRAPED_AT + 1 :], text)  # all but scraped_at
        if self.rows.get(column) == content and (
            kept or not state.has_load_metrics or not state.scrape_ok
        ):
            return  # the same, and its age is the heartbeat's (or does not matter)
        self.rows[column] = content
        self.table.write(column, fields, text)

    def models_read(self, state: EndpointState, started: float) -> None:
        column = column_of(state)
        if column is None or state.served_models is None:
            return
        endpoint = state.endpoint
        self.models[column] = [
            started,
            endpoint.workload,
            endpoint.model_name,
            sorted(state.served_models),
        ]
        if not self._models_dirty:
            self._models_dirty = True
            # Soon, not at the next beat: lists read together go out together, and before
            # this worker serves a request by them (a peer sees what it routes by).
            with contextlib.suppress(RuntimeError):  # no loop (tests): the next beat
                asyncio.get_running_loop().call_soon(self._flush_models)

    def flush(self, now: float) -> None:
        """Beat, and publish the model lists if any changed since the last flush (lists of
        endpoints gone are dropped: an address may come back serving something else)."""
        self.table.beat(now)
        self._flush_models()

    def _flush_models(self) -> None:
        if not self._models_dirty:
            return
        self._models_dirty = False
        live = {column_of(s) for s in self.states()}
        for gone in [c for c in self.models if c not in live]:
            del self.models[gone]
            self.rows.pop(gone, None)
        data = orjson.dumps(self.models, option=orjson.OPT_NON_STR_KEYS)
        if not self.table.models.write(data) and not self._too_big:
            self._too_big = True
            log.error("the endpoints' model lists do not fit the workers' shared document")

    def start(self) -> None:
        self._ticker.start()

    async def close(self) -> None:
        await self._ticker.close()


class ScrapeFollower:
    """A worker that does not scrape: every ``interval`` it copies the rows and model lists
    published since it last looked into its states and calls ``on_changed`` (metrics) or
    ``on_models_changed`` (routes) if any changed (``on_changed`` also when the heartbeat made
    a kept row fresh again).

    Kept rows take the heartbeat as ``scraped_at`` while the endpoint's shared in-flight count
    is the one at its scrape (see the module docstring). When the heartbeat is older than
    ``stale_after`` the scraper is gone (killed and not yet replaced, stopped): the states are
    marked ``scrape_ok = False``, so admission counts in-flight requests as for an engine
    whose metrics cannot be read, instead of taking every endpoint for saturated because its
    copy is old. When the heartbeat moves again every row is read again, restoring the
    states. Model lists stay as they were (they change rarely); a list missing from the
    document (a replaced worker 0 that has not read that endpoint yet) leaves a state's
    names alone."""

    def __init__(
        self,
        table: ScrapeTable,
        states: Callable[[], Iterable[EndpointState]],
        interval: float,
        on_changed: Callable[[], None] | None = None,
        stale_after: float = 0.2,
        on_models_changed: Callable[[], None] | None = None,
    ) -> None:
        self.table = table
        self.states = states
        self.interval = interval
        self.on_changed = on_changed
        self.on_models_changed = on_models_changed
        self.stale_after = stale_after
        self.seen: dict[int, int] = {}  # column -> seq applied
        self.kept: dict[int, EndpointState] = {}  # columns whose row is kept, their state
        self.models: dict[int, list] = {}  # the model-list document as last read
        self.orphaned = False  # heartbeat older than stale_after
        self._generation = -1
        self._heartbeat = 0.0
        self._models_seq = 0
        self._rescan = False
        self._ticker = Periodic(self.poll, interval, "reading the shared scrapes")

    def start(self) -> None:
        self._ticker.start()

    async def close(self) -> None:
        await self._ticker.close()

    def follows(self, state: EndpointState) -> bool:
        """A new state (perhaps for an address seen before): its row is copied at the next
        poll; a state without one (the table was full) is this worker's to scrape."""
        self._rescan = True
        column = column_of(state)
        if column is None:
            return False
        self.seen.pop(column, None)
        self.kept.pop(column, None)
        return True

    def publish(self, state: EndpointState, kept: bool) -> None:
        """Nothing: what this worker scrapes itself stays its own."""

    def models_read(self, state: EndpointState, started: float) -> None:
        """Nothing: what this worker reads itself stays its own."""

    def poll(self, now: float | None = None) -> bool:
        """Copy what changed; True if any metrics did."""
        now = time.monotonic() if now is None else now
        models_changed = self._poll_models()
        rescan, self._rescan = self._rescan, False
        heartbeat = self.table.heartbeat()
        changed = False
        if now - heartbeat > self.stale_after:
            if not self.orphaned:
                self.orphaned = True
                for state in self.states():
                    if column_of(state) is not None:
                        state.scrape_ok = False
                changed = True
        elif self.orphaned:
            self.orphaned = False  # back (or replaced): every row again, scrape_ok with it
            self.seen.clear()
            rescan = True
        if models_changed or rescan:
            self._apply_models()
        generation = self.table.generation()
        if generation != self._generation or rescan:
            self._generation = generation
            changed = self._copy_rows() or changed
        refreshed = False
        if heartbeat != self._heartbeat and not self.orphaned:
            self._heartbeat = heartbeat
            for state in self.kept.values():
                # Scraper._keep_idle_fresh's rule, on the shared in-flight count.
                if state.inflight == state.inflight_at_scrape and 0 < state.scraped_at < heartbeat:
                    state.scraped_at = heartbeat
                    refreshed = True
        # Fresh again is a change too: a request held while the copy was stale may go (no
        # row changes while every client waits here, so nothing else would release it).
        if (changed or refreshed) and self.on_changed is not None:
            self.on_changed()
        return changed

    def _copy_rows(self) -> bool:
        changed = False
        seen = self.seen
        kept = self.kept
        read = self.table.read
        for state in self.states():
            column = column_of(state)
            if column is None:
                continue
            row = read(column, seen.get(column, 0))
            if row is not None:
                seen[column] = row[0]
                if apply_row(state, row[1], row[2]):
                    kept[column] = state
                else:
                    kept.pop(column, None)
                if self.orphaned:
                    state.scrape_ok = False
                changed = True
        return changed

    def _poll_models(self) -> bool:
        got = self.table.models.read(self._models_seq)
        if got is None:
            return False
        self._models_seq = got[0]
        try:
            doc = orjson.loads(got[1])
        except orjson.JSONDecodeError:
            return False
        self.models = doc if isinstance(doc, dict) else {}
        return True

    def _apply_models(self) -> None:
        """The model lists read into the states they are for (same workload and model: an
        address may come back serving something else); a list the gateway changed here
        (loading an adapter) after its read began is not overwritten."""
        changed = False
        models = self.models
        for state in self.states():
            column = column_of(state)
            entry = models.get(str(column)) if column is not None else None
            if not isinstance(entry, list) or len(entry) != 4:
                continue
            started, workload, model, names = entry
            endpoint = state.endpoint
            if workload != endpoint.workload or model != endpoint.model_name:
                continue
            if not isinstance(started, float | int):
                continue
            if state.extra.get(MODELS_CHANGED_AT, 0.0) > started:  # type: ignore[operator]
                continue
            served = served_names([{"id": n} for n in names] if isinstance(names, list) else None)
            if served is not None and served != state.served_models:
                state.served_models = served
                changed = True
        if changed and self.on_models_changed is not None:
            self.on_models_changed()
