"""The embedded store: resources in one SQLite file, shared safely by several processes.

Layout:

- ``objects``: the current object per (kind, namespace, name) as JSON text.
- ``events``: an append-only log (rv, type, kind, namespace, name, object) written in the same
  transaction as every change, so a watcher in any process sees every change in order by
  polling ``rv > last_seen``. Compacted to the newest ``max_events`` (and ``max_event_age``).
- ``counters``: ``rv``, the global, monotonic resourceVersion, and ``compacted``, the highest rv
  whose event was deleted (a watch resuming from below it gets ``Expired``).
- ``schema_version``: for migrations.

Writes take the database write lock up front (``BEGIN IMMEDIATE``), so writers from different
processes serialise instead of deadlocking, and resourceVersions commit in order. WAL mode lets
readers and watchers run while a write is in progress. Each call is a sub-millisecond local
transaction, so the sync methods may be called from the event loop (while another process
holds the write lock, a write waits for it, up to ``busy_timeout``: ``up`` sets
``LOOP_BUSY_TIMEOUT`` once it serves); ``watch`` is async, sleeps
on an ``asyncio.Event`` that same-process writes set at once, and polls every ``poll_interval``
for writes from other processes.

Over 500 lines on purpose: it is one class whose every method keeps the same invariants (one
write transaction per change with its event row, resourceVersions committed in order, the
corrupt-row rules); the schema and the helpers around it are short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from llmplane.aio import wait_event
from llmplane.store.base import (
    SERVER_FIELDS,
    Conflict,
    CorruptObject,
    Expired,
    InvalidObject,
    LabelSelector,
    NotFound,
    StoreError,
    StoreUnavailable,
    WatchEvent,
    object_key,
    ref,
)
from llmplane.store.owned import keep_owned
from llmplane.store.selectors import as_selector

SCHEMA_VERSION = 1

# Statements that bring a database from version N-1 to N.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE counters (
               name TEXT PRIMARY KEY,
               value INTEGER NOT NULL
           )""",
        "INSERT INTO counters (name, value) VALUES ('rv', 0), ('compacted', 0)",
        """CREATE TABLE objects (
               kind TEXT NOT NULL,
               namespace TEXT NOT NULL,
               name TEXT NOT NULL,
               rv INTEGER NOT NULL,
               object TEXT NOT NULL,
               PRIMARY KEY (kind, namespace, name)
           ) WITHOUT ROWID""",
        "CREATE INDEX objects_by_namespace ON objects (namespace, name)",
        """CREATE TABLE events (
               rv INTEGER PRIMARY KEY,
               type TEXT NOT NULL,
               kind TEXT NOT NULL,
               namespace TEXT NOT NULL,
               name TEXT NOT NULL,
               ts REAL NOT NULL,
               object TEXT NOT NULL
           )""",
    ),
}


log = logging.getLogger("llmplane.store")


def decode(body: str | bytes, key: tuple[str, str, str]) -> dict[str, Any]:
    """A stored row as an object; ``CorruptObject`` naming it by kind/name when it is not one."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        problem = f"not JSON ({e})"
    else:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict):
            problem = "no metadata mapping"
        elif meta.get("name") != key[2] or not isinstance(meta.get("resourceVersion"), str):
            problem = "metadata.name or metadata.resourceVersion is missing or wrong"
        else:
            return obj
    kind, namespace, name = key
    raise CorruptObject(
        f"{ref(kind, name, namespace)}: the stored object is corrupt: {problem}; delete it "
        f"(llmplane delete {kind} {name}) or apply it again"
    )


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    """A deep copy that also proves the object is plain JSON."""
    try:
        return orjson.loads(orjson.dumps(obj))
    except TypeError as e:
        raise InvalidObject(f"object is not plain JSON: {e}") from None


# --- in-process wakeups ----------------------------------------------------------------------
# Keyed by the database's real path, so every SQLiteStore on the same file in this process wakes
# the others' watchers immediately; other processes are seen by polling.


class _Waiter:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.event = asyncio.Event()

    def wake(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.event.set()
            return
        with contextlib.suppress(RuntimeError):  # the watcher's loop is closed
            self.loop.call_soon_threadsafe(self.event.set)


_waiters: dict[str, set[_Waiter]] = {}
_waiters_lock = threading.Lock()


def _notify(key: str) -> None:
    with _waiters_lock:
        waiters = list(_waiters.get(key, ()))
    for waiter in waiters:
        waiter.wake()


# The busy timeout of a process whose event loop serves traffic (``llmplane up``): a write
# waits on that loop, so it gives up after this long and its caller retries on its next pass,
# where the default would stall every request for up to ``busy_timeout`` at each write while
# another process holds the lock (a stopped ``llmplane apply``, an ``sqlite3`` shell).
LOOP_BUSY_TIMEOUT = 0.1


class SQLiteStore:
    """``Store`` on a SQLite file. Safe to share between threads and between processes."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 10.0,
        poll_interval: float = 0.05,
        max_events: int = 10_000,
        max_event_age: float = 3600.0,
        compact_every: int = 100,
    ):
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self.poll_interval = poll_interval
        self.max_events = max_events
        self.max_event_age = max_event_age
        self.compact_every = max(1, compact_every)
        self._lock = threading.RLock()
        self._reported: set[tuple[str, str, str, int]] = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._key = os.path.realpath(self.path)
        self._conn: sqlite3.Connection | None = self._connect()
        self._init_db()

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # --- connections and transactions ---------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # guarded by self._lock (or owned by one watch)
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the store at {self.path}: {e}{self._full(e)}") from e
        return conn

    def set_busy_timeout(self, seconds: float) -> None:
        """How long a write waits for another process's write lock before it fails with
        ``StoreUnavailable`` (``LOOP_BUSY_TIMEOUT`` where the event loop also serves traffic)."""
        with self._lock:
            self.busy_timeout = seconds
            self._db().execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")

    def _init_db(self) -> None:
        conn = self._db()
        deadline = time.monotonic() + self.busy_timeout
        while True:  # switching to WAL needs a moment of exclusivity; other openers may race
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as e:
                if time.monotonic() > deadline or "locked" not in str(e):
                    raise StoreUnavailable(
                        f"cannot open the store at {self.path}: {e}{self._full(e)}"
                    ) from e
                time.sleep(0.01)
        if str(mode).lower() != "wal":
            raise StoreError(f"cannot put {self.path} in WAL mode (got {mode!r})")
        with self._write() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = conn.execute("SELECT version FROM schema_version").fetchone()
            current = row[0] if row else 0
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {current}, newer than this llmplane "
                    f"understands ({SCHEMA_VERSION}); upgrade llmplane"
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version]:
                    conn.execute(statement)
            if row is None:
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            elif current != SCHEMA_VERSION:
                conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self!r} is closed")
        return self._conn

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding the database write lock from its start."""
        with self._lock:
            conn = self._db()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise StoreUnavailable(self._problem(e)) from e
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as e:
                # SQLite may have rolled back already (a full disk at COMMIT): then this fails.
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):  # disk full, I/O error: one line, not a trace
                    raise StoreUnavailable(self._problem(e)) from e
                raise

    def _problem(self, error: sqlite3.Error) -> str:
        text = str(error)
        if "locked" in text or "busy" in text:
            return (
                f"the store at {self.path} is busy: {text} (another process has held its "
                f"write lock for over {self.busy_timeout:g}s); nothing was written"
            )
        return (
            f"cannot write the store at {self.path}: {text}{self._full(error)}; nothing was written"
        )

    def _full(self, error: Exception) -> str:
        """A note that the disk is full when it is and ``error`` does not say so (SQLite says
        only "disk I/O error" when it cannot create its shared-memory file)."""
        if "disk is full" in str(error):
            return ""
        try:
            stats = os.statvfs(self.path.parent)
        except OSError:
            return ""
        return " (the disk is full)" if stats.f_bavail * stats.f_frsize < 65536 else ""

    @contextlib.contextmanager
    def _read(self, conn: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot for several SELECTs."""
        with contextlib.ExitStack() as stack:
            if conn is None:
                stack.enter_context(self._lock)
                conn = self._db()
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    @staticmethod
    def _counter(conn: sqlite3.Connection, name: str) -> int:
        return conn.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()[0]

    def _next_rv(self, conn: sqlite3.Connection) -> int:
        return conn.execute(
            "UPDATE counters SET value = value + 1 WHERE name = 'rv' RETURNING value"
        ).fetchone()[0]

    def _record(
        self, conn: sqlite3.Connection, event: str, key: tuple[str, str, str], obj: dict[str, Any]
    ) -> None:
        """Write the object's new state (or remove it) and its event, in the caller's txn."""
        rv = int(obj["metadata"]["resourceVersion"])
        body = _dumps(obj)
        if event == "DELETED":
            conn.execute("DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ?", key)
        else:
            conn.execute(
                "INSERT INTO objects (kind, namespace, name, rv, object) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (kind, namespace, name)"
                " DO UPDATE SET rv = excluded.rv, object = excluded.object",
                (*key, rv, body),
            )
        conn.execute(
            "INSERT INTO events (rv, type, kind, namespace, name, ts, object)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (rv, event, *key, time.time(), body),
        )
        if rv % self.compact_every == 0:
            self._compact(conn, rv)

    def _compact(self, conn: sqlite3.Connection, head: int) -> None:
        cutoff = conn.execute(
            "SELECT MAX(rv) FROM events WHERE rv <= ? OR ts < ?",
            (head - self.max_events, time.time() - self.max_event_age),
        ).fetchone()[0]
        if cutoff is not None:
            conn.execute("DELETE FROM events WHERE rv <= ?", (cutoff,))
            conn.execute(
                "UPDATE counters SET value = MAX(value, ?) WHERE name = 'compacted'", (cutoff,)
            )

    def compact(self) -> None:
        """Drop events beyond ``max_events`` / older than ``max_event_age`` now."""
        with self._write() as conn:
            self._compact(conn, self._counter(conn, "rv"))

    def _load(self, conn: sqlite3.Connection, key: tuple[str, str, str]) -> dict[str, Any] | None:
        row = conn.execute(
            "SELECT object FROM objects WHERE kind = ? AND namespace = ? AND name = ?", key
        ).fetchone()
        return decode(row[0], key) if row else None

    def _load_or_none(
        self, conn: sqlite3.Connection, key: tuple[str, str, str]
    ) -> dict[str, Any] | None:
        """As ``_load``, but a corrupt row counts as absent: writing over it repairs it."""
        try:
            return self._load(conn, key)
        except CorruptObject as e:
            log.warning("replacing %s", e)
            return None

    # --- writes -------------------------------------------------------------------------------

    def _apply_in(
        self, conn: sqlite3.Connection, obj: dict[str, Any], force_conflicts: bool
    ) -> tuple[dict[str, Any], bool]:
        """Apply within the caller's transaction; returns (stored object, changed?)."""
        key = object_key(obj)
        kind, namespace, name = key
        obj = _copy(obj)
        meta_in: dict[str, Any] = obj["metadata"]
        current = self._load_or_none(conn, key)
        given_rv = meta_in.get("resourceVersion")
        if given_rv not in (None, ""):
            if current is None:
                raise Conflict(
                    f"{ref(kind, name, namespace)}: resourceVersion {given_rv} was given but the "
                    "object does not exist (it may have been deleted); remove "
                    "metadata.resourceVersion to create it"
                )
            if str(given_rv) != current["metadata"]["resourceVersion"]:
                raise Conflict(
                    f"{ref(kind, name, namespace)} was modified: resourceVersion {given_rv} is "
                    f"stale (stored: {current['metadata']['resourceVersion']}); get it again "
                    "and reapply"
                )

        meta: dict[str, Any] = {"name": name}
        if namespace:
            meta["namespace"] = namespace
        for field in ("labels", "annotations"):
            if meta_in.get(field) is not None:
                meta[field] = meta_in[field]
        if current is None:
            cur_meta: dict[str, Any] = {
                "uid": str(uuid.uuid4()),
                "resourceVersion": "",
                "generation": 1,
                "creationTimestamp": now_rfc3339(),
            }
        else:
            cur_meta = current["metadata"]
        meta.update({f: cur_meta[f] for f in SERVER_FIELDS})
        meta.update(
            {
                k: v
                for k, v in meta_in.items()
                if k not in meta and k not in SERVER_FIELDS and k != "namespace"
            }
        )
        desired: dict[str, Any] = {}
        if "apiVersion" in obj:
            desired["apiVersion"] = obj["apiVersion"]
        desired["kind"] = kind
        desired["metadata"] = meta
        desired.update(
            {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}
        )
        if current is not None and "status" in current:
            desired["status"] = current["status"]  # apply never writes status
        keep_owned(current, desired, force_conflicts)

        if current is not None:
            if desired == current:
                return current, False
            if desired.get("spec") != current.get("spec"):
                meta["generation"] = current["metadata"]["generation"] + 1
        meta["resourceVersion"] = str(self._next_rv(conn))
        self._record(conn, "ADDED" if current is None else "MODIFIED", key, desired)
        return desired, True

    def apply(self, obj: dict[str, Any], *, force_conflicts: bool = False) -> dict[str, Any]:
        return self.apply_many([obj], force_conflicts=force_conflicts)[0]

    def apply_many(
        self, objs: list[dict[str, Any]], *, force_conflicts: bool = False
    ) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        changed = False
        with self._write() as conn:
            for obj in objs:
                stored, did_change = self._apply_in(conn, obj, force_conflicts)
                results.append(stored)
                changed |= did_change
        if changed:
            _notify(self._key)
        return [_copy(r) for r in results]

    def delete(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        key = (kind, namespace or "", name)
        with self._write() as conn:
            exists = conn.execute(
                "SELECT 1 FROM objects WHERE kind = ? AND namespace = ? AND name = ?", key
            ).fetchone()
            if exists is None:
                return None
            current = self._load_or_none(conn, key)
            if current is None:  # a corrupt row: its tombstone carries what is known
                current = {"kind": kind, "metadata": {"name": name}}
                if namespace:
                    current["metadata"]["namespace"] = namespace
            current["metadata"]["resourceVersion"] = str(self._next_rv(conn))
            self._record(conn, "DELETED", key, current)
        _notify(self._key)
        return current

    def update_status(
        self,
        kind: str,
        name: str,
        namespace: str | None,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        if not isinstance(status, dict):
            raise InvalidObject(f"{ref(kind, name, namespace)}: status must be a mapping")
        key = (kind, namespace or "", name)
        status = _copy(status)
        with self._write() as conn:
            current = self._load(conn, key)
            if current is None:
                raise NotFound(f"{ref(kind, name, namespace)} not found")
            stored_rv = current["metadata"]["resourceVersion"]
            if resource_version not in (None, "") and str(resource_version) != stored_rv:
                raise Conflict(
                    f"{ref(kind, name, namespace)} was modified: resourceVersion "
                    f"{resource_version} is stale (stored: {stored_rv}); get it again and retry"
                )
            if current.get("status") == status:
                return current
            current["status"] = status
            current["metadata"]["resourceVersion"] = str(self._next_rv(conn))
            self._record(conn, "MODIFIED", key, current)
        _notify(self._key)
        return _copy(current)

    # --- reads --------------------------------------------------------------------------------

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        with self._lock:
            return self._load(self._db(), (kind, namespace or "", name))

    @staticmethod
    def _filters(kind: str | None, namespace: str | None) -> tuple[str, list[Any]]:
        clauses, params = [], []
        if kind is not None:
            clauses.append("kind = ?")
            params.append(kind)
        if namespace is not None:
            clauses.append("namespace = ?")
            params.append(namespace)
        return "".join(f" AND {c}" for c in clauses), params

    def list(
        self,
        kind: str | None = None,
        namespace: str | None = None,
        label_selector: LabelSelector = None,
    ) -> list[dict[str, Any]]:
        selector = as_selector(label_selector)
        out = []
        for obj in self._rows(kind, namespace):
            if isinstance(obj, CorruptObject):
                continue
            if selector.matches(obj["metadata"].get("labels")):
                out.append(obj)
        return out

    def corrupt(self, kind: str | None = None, namespace: str | None = None) -> list[str]:
        """What ``list`` skipped: one message per corrupt row, naming it by kind/name."""
        return [str(o) for o in self._rows(kind, namespace) if isinstance(o, CorruptObject)]

    def _rows(
        self, kind: str | None, namespace: str | None
    ) -> Iterator[dict[str, Any] | CorruptObject]:
        where, params = self._filters(kind, namespace)
        with self._lock:
            rows = (
                self._db()
                .execute(
                    "SELECT kind, namespace, name, rv, object FROM objects "
                    f"WHERE 1{where} ORDER BY namespace, name, kind",
                    params,
                )
                .fetchall()
            )
        for row_kind, row_ns, row_name, rv, body in rows:
            try:
                yield decode(body, (row_kind, row_ns, row_name))
            except CorruptObject as e:
                self._report(e, (row_kind, row_ns, row_name, rv))
                yield e

    def _report(self, error: CorruptObject, row: tuple[str, str, str, int]) -> None:
        """Log a corrupt row once per version of it, not on every list."""
        if row not in self._reported:
            self._reported.add(row)
            log.warning("skipping %s", error)

    def resource_version(self) -> str:
        """The store's current (highest) resourceVersion."""
        with self._read() as conn:
            return str(self._counter(conn, "rv"))

    # --- watch --------------------------------------------------------------------------------

    async def watch(
        self,
        kind: str | None = None,
        namespace: str | None = None,
        since: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        if since is not None:
            try:
                after = int(since)
            except (TypeError, ValueError):
                raise ValueError(
                    f"invalid resourceVersion {since!r}: expected an integer"
                ) from None
        where, params = self._filters(kind, namespace)
        waiter = _Waiter(asyncio.get_running_loop())
        conn = self._connect()  # the watch's own reader: never waits on this store's lock
        with _waiters_lock:
            _waiters.setdefault(self._key, set()).add(waiter)
        batch = 500
        try:
            if since is None:
                with self._read(conn):
                    after = self._counter(conn, "rv")
                    rows = conn.execute(
                        "SELECT kind, namespace, name, rv, object FROM objects "
                        f"WHERE 1{where} ORDER BY rv",
                        params,
                    ).fetchall()
                # Ordered by resourceVersion, so resuming from any yielded object's
                # resourceVersion misses nothing.
                for row_kind, row_ns, row_name, rv, body in rows:
                    key = (row_kind, row_ns, row_name)
                    try:
                        obj = decode(body, key)
                    except CorruptObject as e:
                        self._report(e, (*key, rv))
                        continue
                    yield WatchEvent("ADDED", obj)
                del rows
            while True:
                waiter.event.clear()
                with self._read(conn):
                    head = self._counter(conn, "rv")
                    compacted = self._counter(conn, "compacted")
                    if after < compacted:
                        raise Expired(
                            f"watch from resourceVersion {after} is too old: events up to "
                            f"{compacted} were compacted; watch again without since"
                        )
                    if after > head:
                        raise Expired(
                            f"watch from resourceVersion {after} is ahead of the store "
                            f"({head}); it was probably recreated; watch again without since"
                        )
                    rows = conn.execute(
                        "SELECT rv, type, kind, namespace, name, object FROM events "
                        f"WHERE rv > ? AND rv <= ?{where} ORDER BY rv LIMIT ?",
                        [after, head, *params, batch],
                    ).fetchall()
                after = rows[-1][0] if len(rows) == batch else head
                for rv, event_type, *key, body in rows:
                    try:
                        obj = decode(body, tuple(key))  # type: ignore[arg-type]
                    except CorruptObject as e:
                        self._report(e, (*key, rv))  # type: ignore[arg-type]
                        continue
                    yield WatchEvent(event_type, obj)
                if len(rows) == batch:
                    continue
                await wait_event(waiter.event, self.poll_interval)
        finally:
            with _waiters_lock:
                waiters = _waiters.get(self._key)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del _waiters[self._key]
            conn.close()
