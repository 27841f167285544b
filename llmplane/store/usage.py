"""Usage records: requests and tokens per tenant, model and minute, in ``<state dir>/usage.db``.

Why a file of its own and not resources in the store: usage is a counter written all the
time, not a declaration; it must not wake the store's watchers or grow its event log. Why not
only Prometheus: ``llmplane usage`` must answer on one machine without a Prometheus server,
and over windows longer than a gateway process lives.

Gateways write it in batches (``gateway/tenant_usage.py``: one transaction per flush, every
few seconds, in a worker thread: never on the request path). A row holds one minute of one
(tenant, model); a write adds to it (an upsert), so several gateways on one state directory
sum up. ``totals`` reads a window of whole minutes. Rows older than the retention are pruned
by the writer.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

USAGE_FILENAME = "usage.db"
RETENTION_DAYS = 400
_PRUNE_EVERY = 3600.0  # seconds between prunes by one writer

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    minute INTEGER NOT NULL,          -- epoch seconds at the start of the minute (UTC)
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, tenant, model)
) WITHOUT ROWID
"""
_UPSERT = """
INSERT INTO usage (minute, tenant, model, requests, input_tokens, output_tokens)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (minute, tenant, model) DO UPDATE SET
    requests = requests + excluded.requests,
    input_tokens = input_tokens + excluded.input_tokens,
    output_tokens = output_tokens + excluded.output_tokens
"""

# (minute, tenant, model) -> [requests, input tokens, output tokens]
Batch = Mapping[tuple[int, str, str], list[int]]


@dataclass(frozen=True)
class UsageRow:
    tenant: str
    model: str
    requests: int
    input_tokens: int
    output_tokens: int


class UsageLog:
    """One SQLite file (WAL: readers never block the writer); a connection per call, so any
    thread may call (the gateway flushes from a worker thread)."""

    def __init__(self, path: str | Path, busy_timeout: float = 10.0) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._pruned = 0.0

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(_SCHEMA)
        return conn

    def add(self, batch: Batch, now: float | None = None) -> None:
        """Add ``batch`` in one transaction (and prune old rows about once an hour)."""
        if not batch:
            return
        now = time.time() if now is None else now
        rows = [(m, t, model, *counts) for (m, t, model), counts in batch.items()]
        conn = self._connect()
        try:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(_UPSERT, rows)
                if now - self._pruned >= _PRUNE_EVERY:
                    conn.execute(
                        "DELETE FROM usage WHERE minute < ?", (int(now - RETENTION_DAYS * 86400),)
                    )
                    self._pruned = now
        finally:
            conn.close()

    def totals(
        self, since: float, until: float | None = None, tenant: str | None = None
    ) -> list[UsageRow]:
        """Sums per (tenant, model) over the minutes that overlap [since, until)."""
        if not self.path.exists():
            return []
        query = (
            "SELECT tenant, model, SUM(requests), SUM(input_tokens), SUM(output_tokens) "
            "FROM usage WHERE minute > ?"
        )
        args: list[object] = [int(since) - 60]
        if until is not None:
            query += " AND minute < ?"
            args.append(int(until))
        if tenant is not None:
            query += " AND tenant = ?"
            args.append(tenant)
        query += " GROUP BY tenant, model ORDER BY tenant, model"
        conn = self._connect()
        try:
            return [UsageRow(*row) for row in conn.execute(query, args)]
        finally:
            conn.close()
