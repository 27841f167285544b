"""Tenant usage: the usage log (real SQLite files; two writers add up), the hook's counters
and batching (fake clock), and ``llmplane usage`` reading the state directory."""

from __future__ import annotations

import orjson
from typer.testing import CliRunner

from llmplane.cli import app
from llmplane.gateway.hooks import Usage
from llmplane.gateway.tenant_usage import TenantUsage, usage_log_for
from llmplane.store.sqlite import SQLiteStore
from llmplane.store.usage import RETENTION_DAYS, USAGE_FILENAME, UsageLog, UsageRow
from tests.ratelimit_requests import chat, hook_ctx


class _Decision:
    def __init__(self, tenant):
        self.tenant = tenant
        self.route = "Model/m"
        self.model = "m"


def test_usage_log_adds_up_across_writers_and_reads_a_window(tmp_path):
    path = tmp_path / USAGE_FILENAME
    now = 1_800_000_000.0
    minute = int(now // 60) * 60
    UsageLog(path).add({(minute, "a", "m"): [2, 20, 10]}, now)
    UsageLog(path).add({(minute, "a", "m"): [1, 5, 5], (minute, "b", "m"): [1, 1, 1]}, now)
    UsageLog(path).add({(minute - 7200, "a", "m"): [100, 100, 100]}, now)  # two hours ago
    log = UsageLog(path)
    assert log.totals(now - 3600) == [UsageRow("a", "m", 3, 25, 15), UsageRow("b", "m", 1, 1, 1)]
    assert log.totals(now - 3 * 3600, tenant="a") == [UsageRow("a", "m", 103, 125, 115)]
    assert UsageLog(tmp_path / "none.db").totals(0) == []  # nothing written yet


def test_usage_log_location(tmp_path):
    store = SQLiteStore(tmp_path / "llmplane.db")
    try:
        assert usage_log_for(store, None).path == tmp_path / USAGE_FILENAME
    finally:
        store.close()
    assert usage_log_for(store, "off") is None
    assert usage_log_for(object(), None) is None  # Kubernetes: Prometheus only
    assert usage_log_for(None, str(tmp_path / "u.db")).path == tmp_path / "u.db"


async def test_hook_counts_answered_requests_and_tokens_and_batches_them(tmp_path):
    now = [1_800_000_000.0]
    usage = TenantUsage(UsageLog(tmp_path / "u.db"), clock=lambda: now[0])
    for status, tokens in (
        (200, Usage(10, 3)),
        (200, Usage(5, 2)),
        (503, None),
        (499, Usage(4, 1)),
    ):
        req = chat("hi")
        res = await usage.reserve(hook_ctx(req, _Decision("a")))
        usage.settle(hook_ctx(req, _Decision("a"), status), res, tokens)
    req = chat("hi")
    usage.settle(hook_ctx(req, _Decision(None), 200), None, Usage(7, 7))  # no tenant: not counted
    assert usage.requests.children == {("a", "m"): usage.requests.labels("a", "m")}
    assert usage.requests.labels("a", "m").value == 2  # the 503 and the 499 were not answered
    assert usage.tokens.labels("a", "m", "input").value == 19  # the 499's tokens count
    assert usage.tokens.labels("a", "m", "output").value == 6
    assert len(usage.pending) == 1  # one row for the minute, in memory until the flush
    await usage.flush()
    assert usage.pending == {}
    assert UsageLog(tmp_path / "u.db").totals(now[0] - 60) == [UsageRow("a", "m", 2, 19, 6)]


async def test_each_minute_and_each_flush_gets_its_own_counts(tmp_path):
    """A tenant/model keeps its entry of the current minute between requests: a new minute,
    or a flush that took the batch away, starts the next entry (nothing counted twice or
    lost)."""
    start = 1_800_000_000.0 - 1_800_000_000.0 % 60
    now = [start + 10]
    usage = TenantUsage(UsageLog(tmp_path / "u.db"), clock=lambda: now[0])
    req = chat("hi")
    usage.settle(hook_ctx(req, _Decision("a"), 200), None, Usage(1, 1))
    now[0] = start + 70  # the next minute
    usage.settle(hook_ctx(req, _Decision("a"), 200), None, Usage(2, 2))
    now[0] = start + 30  # the clock stepped back: the earlier minute again
    usage.settle(hook_ctx(req, _Decision("a"), 200), None, Usage(4, 4))
    assert usage.pending == {
        (int(start), "a", "m"): [2, 5, 5],
        (int(start) + 60, "a", "m"): [1, 2, 2],
    }
    await usage.flush()
    usage.settle(hook_ctx(req, _Decision("a"), 200), None, Usage(8, 8))  # same minute, new batch
    assert usage.pending == {(int(start), "a", "m"): [1, 8, 8]}
    await usage.flush()
    assert sorted(UsageLog(tmp_path / "u.db").totals(start - 60)) == [UsageRow("a", "m", 4, 15, 15)]


def test_usage_log_prunes_rows_past_the_retention(tmp_path):
    path = tmp_path / USAGE_FILENAME
    now = 1_800_000_000.0
    minute = int(now // 60) * 60
    old = minute - (RETENTION_DAYS + 1) * 86400
    UsageLog(path).add({(old, "a", "m"): [1, 1, 1]}, old + 60)  # kept: recent when written
    assert UsageLog(path).totals(0) == [UsageRow("a", "m", 1, 1, 1)]
    UsageLog(path).add({(minute, "a", "m"): [2, 2, 2]}, now)
    assert UsageLog(path).totals(0) == [UsageRow("a", "m", 2, 2, 2)]


async def test_a_failed_flush_keeps_the_counts_for_the_next(tmp_path):
    now = [1_800_000_000.0]
    path = tmp_path / "not-yet" / "u.db"  # its directory missing: SQLite cannot open it
    usage = TenantUsage(UsageLog(path), clock=lambda: now[0])
    req = chat("hi")
    usage.settle(hook_ctx(req, _Decision("a"), 200), None, Usage(10, 3))
    await usage.flush()
    usage.settle(hook_ctx(req, _Decision("a"), 200), None, Usage(5, 2))
    assert usage.pending == {(int(now[0] // 60) * 60, "a", "m"): [2, 15, 5]}
    path.parent.mkdir()
    await usage.flush()
    assert usage.pending == {}
    assert UsageLog(path).totals(now[0] - 60) == [UsageRow("a", "m", 2, 15, 5)]


async def test_streams_of_tenants_get_usage_without_the_client_seeing_it():
    usage = TenantUsage(None)
    req = chat("hi", stream=True)
    res = await usage.reserve(hook_ctx(req, _Decision("a")))
    assert req.dirty and req.doc["stream_options"] == {"include_usage": True}
    assert res.stream_filter is not None
    req = chat("hi", stream=True)
    assert await usage.reserve(hook_ctx(req, _Decision(None))) is None and not req.dirty


def test_usage_command_prints_the_window(tmp_path):
    import time

    now = time.time()
    UsageLog(tmp_path / USAGE_FILENAME).add(
        {
            (int(now // 60) * 60, "team-a", "tiny"): [3, 30, 12],
            (int(now // 60) * 60, "team-b", "tiny"): [1, 4, 2],
            (int(now // 60) * 60 - 3 * 86400, "team-a", "tiny"): [50, 50, 50],
        }
    )
    runner = CliRunner()
    result = runner.invoke(app, ["usage", "--since", "1h", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = [line.split() for line in result.output.splitlines()]
    assert lines[0] == ["TENANT", "MODEL", "REQUESTS", "INPUT", "TOKENS", "OUTPUT", "TOKENS"]
    assert ["team-a", "tiny", "3", "30", "12"] in lines
    assert ["TOTAL", "4", "34", "14"] in lines
    result = runner.invoke(
        app,
        [
            "usage",
            "--since",
            "7d",
            "--tenant",
            "team-a",
            "-o",
            "json",
            "--state-dir",
            str(tmp_path),
        ],
    )
    assert orjson.loads(result.output) == [
        {
            "tenant": "team-a",
            "model": "tiny",
            "requests": 53,
            "input_tokens": 80,
            "output_tokens": 62,
        }
    ]
    for bad in ("soon", "-1h", "0"):
        result = runner.invoke(app, ["usage", "--since", bad, "--state-dir", str(tmp_path)])
        assert result.exit_code != 0 and "--since" in str(result.exception or result.output)
