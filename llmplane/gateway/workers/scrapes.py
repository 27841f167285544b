"""Engine metrics and model lists read once for every worker: worker 0 scrapes each endpoint
and publishes what ``EndpointState`` keeps from a scrape into the endpoint's row of a shared
table (a seqlock ``shm.Document`` per in-flight table column), and each changed
``/v1/models`` list into one shared document; the other workers copy what changed into their
own states. Rows published on change, the heartbeat that keeps idle rows fresh, what
followers do when it stops: docs/gateway.md, "Workers: several processes, one routing state".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import struct
import time
from collections.abc import Callable, Iterable

import orjson

from llmplane.aio import Periodic
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scraper import MODELS_CHANGED_AT, adapter_names, served_names
from llmplane.gateway.workers.shm import Document, cells, region

log = logging.getLogger("llmplane.gateway")

ROW_BYTES = 1024
# What a row holds: these ``EndpointState`` attributes, the flags, then the adapters' names.
_DOUBLES = (
    *("waiting", "running", "kv_usage", "scraped_at", "prefix_hits", "prefix_queries"),
    *("capacity", "room", "kv_received", "ttft"),
)
_INTEGERS = ("inflight_at_scrape", "max_lora", "block_size")
_ATTRS = (*_DOUBLES, *_INTEGERS)
_FIELDS = struct.Struct(f"<{len(_DOUBLES)}d{len(_INTEGERS) + 1}q")  # + 1: the flags
_AGE = 8 * _ATTRS.index("scraped_at")  # where a row's ``scraped_at`` is
TEXT_BYTES = ROW_BYTES - 16 - _FIELDS.size  # 16: the document's sequence and length
HAS_KV, KNOWN, HAS_LOAD, SCRAPE_OK, KEPT = 1, 2, 4, 8, 16
MODELS_BYTES = 64 * 1024 * 1024  # the model-list document; pages are touched only as written


def encode_row(state: EndpointState, kept: bool = False) -> bytes:
    """What a row holds of ``state`` (``kept``: the idle ticker keeps it fresh from now)."""
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
    if len(text) > TEXT_BYTES:
        _log_once(logging.WARNING, f"LoRA adapter names cut to {TEXT_BYTES} bytes")
    return _FIELDS.pack(*(getattr(state, name) for name in _ATTRS), flags) + text[:TEXT_BYTES]


@functools.cache
def _log_once(level: int, message: str) -> None:
    log.log(level, message)  # a condition that, once met, stays so: said once


def apply_row(state: EndpointState, data: bytes) -> bool:
    """A published row into a follower's state; True if it was published as kept."""
    *values, flags = _FIELDS.unpack_from(data)
    for name, value in zip(_ATTRS, values, strict=True):
        setattr(state, name, value)
    state.has_kv = bool(flags & HAS_KV)
    state.has_load_metrics = bool(flags & HAS_LOAD) if flags & KNOWN else None
    state.scrape_ok = bool(flags & SCRAPE_OK)
    running, _, waiting = data[_FIELDS.size :].partition(b"\n")
    state.lora_running, state.lora_waiting = adapter_names(running), adapter_names(waiting)
    return bool(flags & KEPT)


class ScrapeTable:
    """``capacity`` rows in shared memory, the count of rows written (the generation, which
    tells a follower whether to look at the rows at all), the scraper's heartbeat and the
    model lists' document."""

    def __init__(self, capacity: int) -> None:
        self.mem = region(capacity * ROW_BYTES)
        self._generation = cells(1)
        self._heartbeat = cells(1, "d")
        self._rows: dict[int, Document] = {}
        self.models = Document(MODELS_BYTES)  # {column: [read at, workload, model, names]}

    def row(self, column: int) -> Document:
        if column not in self._rows:
            self._rows[column] = Document(ROW_BYTES, self.mem, column * ROW_BYTES)
        return self._rows[column]

    def write(self, column: int, data: bytes) -> None:
        """Row ``column`` (one writer per row)."""
        self.row(column).write(data)
        self._generation[0] += 1

    def generation(self) -> int:
        return self._generation[0]

    def beat(self, now: float) -> None:
        self._heartbeat[0] = now

    def heartbeat(self) -> float:
        return self._heartbeat[0]


def column_of(state: EndpointState) -> int | None:
    """The state's row in the shared tables (None: a worker-local state, the table was full)."""
    column = getattr(state, "column", -1)
    return column if column >= 0 else None


class ScrapePublisher(Periodic):
    """Worker 0's ``ScrapeSharing``: a row is written when its content changes (or, for an
    endpoint not kept fresh by the idle ticker, at each scrape: its ``scraped_at`` matters),
    model lists are gathered into the shared document, and from ``start()`` to ``close()``
    the heartbeat beats every ``tick`` seconds."""

    def __init__(
        self, table: ScrapeTable, states: Callable[[], Iterable[EndpointState]], tick: float
    ) -> None:
        self.table = table
        self.states = states
        self.models: dict[int, list] = {}  # column -> [read at, workload, model, names]
        self._models_dirty = False
        super().__init__(lambda: self.flush(time.monotonic()), tick, "scrape heartbeat")

    def follows(self, state: EndpointState) -> bool:
        return False  # worker 0 reads every endpoint itself

    def publish(self, state: EndpointState, kept: bool) -> None:
        column = column_of(state)
        if column is None:
            return
        data = encode_row(state, kept)
        # A kept row's age is the heartbeat's (and an unreadable one's does not matter): it is
        # written only if anything but its ``scraped_at`` changed.
        if kept or not state.has_load_metrics or not state.scrape_ok:
            old = self.table.row(column).read(0)
            if old and (old[1][:_AGE], old[1][_AGE + 8 :]) == (data[:_AGE], data[_AGE + 8 :]):
                return
        self.table.write(column, data)

    def models_read(self, state: EndpointState, started: float) -> None:
        column = column_of(state)
        if column is None or state.served_models is None:
            return
        e = state.endpoint
        self.models[column] = [started, e.workload, e.model_name, sorted(state.served_models)]
        if not self._models_dirty:
            self._models_dirty = True
            # Soon, not at the next beat: lists read together go out together, and before
            # this worker serves a request by them (a peer sees what it routes by).
            with contextlib.suppress(RuntimeError):  # no loop (tests): the next beat
                asyncio.get_running_loop().call_soon(self._flush_models)

    def flush(self, now: float) -> None:
        """Beat, and publish the model lists if any changed since the last flush."""
        self.table.beat(now)
        self._flush_models()

    def _flush_models(self) -> None:
        if not self._models_dirty:
            return
        self._models_dirty = False
        # Lists of endpoints gone are dropped: an address may come back serving something else.
        live = {column_of(s) for s in self.states()}
        for gone in [c for c in self.models if c not in live]:
            del self.models[gone]
        data = orjson.dumps(self.models, option=orjson.OPT_NON_STR_KEYS)
        if not self.table.models.write(data):
            _log_once(logging.ERROR, "the model lists do not fit the workers' shared document")


class ScrapeFollower(Periodic):
    """A worker that does not scrape (a ``ScrapeSharing`` that follows every endpoint with a
    row): from ``start()`` to ``close()``, every ``interval`` it copies the rows and model
    lists published since it last looked into its states and calls ``on_changed`` (metrics,
    also when the heartbeat made a kept row fresh again) or ``on_models_changed`` (routes). A
    heartbeat older than
    ``stale_after`` means the scraper is gone: the states are marked ``scrape_ok = False``
    (admission counts in-flight requests, rather than take every endpoint for saturated)
    until it beats again; model lists stay as they were."""

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
        self.on_changed = on_changed or (lambda: None)
        self.on_models_changed = on_models_changed or (lambda: None)
        self.stale_after = stale_after
        self.seen: dict[int, int] = {}  # column -> sequence applied
        self.kept: dict[int, EndpointState] = {}  # columns whose row is kept, their state
        self.models: dict[str, object] = {}  # the model-list document as last read
        self.orphaned = False  # heartbeat older than stale_after
        self._generation = -1
        self._heartbeat = 0.0
        self._models_seq = 0
        self._rescan = False
        super().__init__(self.poll, interval, "reading the shared scrapes")

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
        rescan, self._rescan = self._rescan, False
        heartbeat = self.table.heartbeat()
        changed = False
        if now - heartbeat > self.stale_after:
            if not self.orphaned:
                self.orphaned = changed = True
                for state in self.states():
                    if column_of(state) is not None:
                        state.scrape_ok = False
        elif self.orphaned:
            self.orphaned = False  # back (or replaced): every row again, scrape_ok with it
            self.seen.clear()
            rescan = True
        self._copy_models(rescan)
        generation = self.table.generation()
        if generation != self._generation or rescan:
            self._generation = generation
            changed = self._copy_rows() or changed
        # Fresh again is a change too: a request held while the copy was stale may go (no
        # row changes while every client waits here, so nothing else would release it).
        refreshed = False
        if heartbeat != self._heartbeat and not self.orphaned:
            self._heartbeat = heartbeat
            for state in self.kept.values():
                refreshed = state.keep_fresh(heartbeat) or refreshed
        if changed or refreshed:
            self.on_changed()
        return changed

    def _copy_rows(self) -> bool:
        changed = False
        for state in self.states():
            column = column_of(state)
            if column is None:
                continue
            got = self.table.row(column).read(self.seen.get(column, 0))
            if got is None:
                continue
            self.seen[column], data = got
            if apply_row(state, data):
                self.kept[column] = state
            else:
                self.kept.pop(column, None)
            if self.orphaned:
                state.scrape_ok = False
            changed = True
        return changed

    def _copy_models(self, rescan: bool) -> None:
        """The model lists, if the document changed (or ``rescan``), into the states they are
        for (same workload and model: an address may come back serving something else); a
        list the gateway changed here (loading an adapter) after its read began is not
        overwritten."""
        got = self.table.models.read(self._models_seq)
        if got is not None:
            self._models_seq = got[0]
            with contextlib.suppress(orjson.JSONDecodeError):
                doc = orjson.loads(got[1])
                self.models, rescan = (doc if isinstance(doc, dict) else {}), True
        if not rescan:
            return
        changed = False
        for state in self.states():
            column = column_of(state)
            entry = None if column is None else self.models.get(str(column))
            if not isinstance(entry, list) or len(entry) != 4:
                continue
            started, workload, model, names = entry
            if (
                (workload, model) != (state.endpoint.workload, state.endpoint.model_name)
                or not isinstance(started, float | int)
                or state.extra.get(MODELS_CHANGED_AT, 0.0) > started  # type: ignore[operator]
            ):
                continue
            served = served_names([{"id": n} for n in names] if isinstance(names, list) else None)
            if served is not None and served != state.served_models:
                state.served_models = served
                changed = True
        if changed:
            self.on_models_changed()
