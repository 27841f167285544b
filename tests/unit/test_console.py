"""The console's pieces without a browser: percentiles from histogram differences, the
per-second ring fed by the gateway's real metrics objects, credential masking, and the terminal
status of ``llmplane up`` in both its forms."""

from __future__ import annotations

import contextlib
import io
import os
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from llmplane.console.redact import MASK, redact, redact_text, secret_key
from llmplane.console.stats import RequestStats, peer_totals, quantile, report_totals, totals
from llmplane.gateway.discovery import Endpoint
from llmplane.gateway.observability import GatewayMetrics
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.server import GatewayView
from llmplane.gateway.workers.share import Share, listen
from llmplane.upstatus import UpStatus, panel, settled, status_line


def test_ring_adds_the_other_workers_totals() -> None:
    """With several workers: each peer's totals are differenced against its own previous
    ones (a first answer is the baseline, a restarted worker's counts start again)."""
    ours, theirs = GatewayMetrics(), GatewayMetrics()
    stats = RequestStats(ours)
    assert stats.sample([(11, totals(theirs))]).requests == 0  # its first answer: baseline
    ours.requests.labels("m", "r", "e", "200").inc(2)
    theirs.requests.labels("m", "r", "e", "200").inc(3)
    theirs.requests.labels("m", "r", "e", "500").inc()
    theirs.ttft.labels("m").observe(0.3)
    point = stats.sample([(11, totals(theirs))])
    assert (point.requests, point.errors) == (6, 1)
    assert 0.25 < point.ttft[0] <= 0.5  # the peer's only first token
    # Worker 11 did not answer this second: its totals wait for the next answer.
    theirs.requests.labels("m", "r", "e", "200").inc(4)
    assert stats.sample([]).requests == 0
    assert stats.sample([(11, totals(theirs))]).requests == 4
    # Replaced (a new pid): its first answer is its baseline; junk from a peer is ignored.
    replacement = GatewayMetrics()
    replacement.requests.labels("m", "r", "e", "200").inc(7)
    assert stats.sample([(12, totals(replacement)), (13, {"requests": "x"})]).requests == 0
    replacement.requests.labels("m", "r", "e", "200").inc()
    assert stats.sample([(12, totals(replacement))]).requests == 1


def test_after_the_baseline_a_new_peer_counts_from_zero() -> None:
    """The peers' totals read as the sampler starts are its baseline; a peer first seen
    later (it started after us, or replaced one) counts everything it reports."""
    ours, early, late = GatewayMetrics(), GatewayMetrics(), GatewayMetrics()
    early.requests.labels("m", "r", "e", "200").inc(5)  # before our ring: not ours to count
    stats = RequestStats(ours)
    stats.baseline([(1, totals(early))])
    late.requests.labels("m", "r", "e", "200").inc(3)  # all after our start
    late.ttft.labels("m").observe(0.3)
    early.requests.labels("m", "r", "e", "200").inc()
    point = stats.sample([(1, totals(early)), (2, totals(late))])
    assert point.requests == 4
    assert point.ttft[0] is not None
    assert stats.sample([(2, {"requests": "junk"})]).requests == 0  # junk is still ignored


def test_workers_read_each_others_totals_from_shared_memory() -> None:
    """Each worker's sampler publishes its totals as its report and reads the others' (the
    real shared-memory share the supervisor makes; no socket, nobody asked): worker 0's ring
    counts worker 2's requests, worker 1's counts worker 0's; a report being rewritten
    reads as its previous copy."""
    share = Share(3, listen("127.0.0.1", 0, 3))
    try:
        seats = [share.seat(i) for i in range(3)]
        metrics = [GatewayMetrics() for _ in seats]
        stats = [
            RequestStats(m, peers=peer_totals(seat), publish=report_totals(seat))
            for m, seat in zip(metrics, seats, strict=True)
        ]
        assert stats[0].peers() == []  # nobody has reported yet
        report_totals(seats[2])(totals(metrics[2]))  # worker 2 (no console): its baseline
        assert stats[0].sample(stats[0].peers()).requests == 0
        metrics[2].requests.labels("m", "r", "e", "200").inc(3)
        metrics[0].requests.labels("m", "r", "e", "500").inc()
        report_totals(seats[2])(totals(metrics[2]))
        point = stats[0].sample(stats[0].peers())
        assert (point.requests, point.errors) == (4, 1)
        # Worker 0 published its totals when it sampled: worker 1 sees them (baseline, then
        # the difference), and worker 2's unchanged report adds nothing.
        assert stats[1].sample(stats[1].peers()).requests == 0
        metrics[0].requests.labels("m", "r", "e", "200").inc(2)
        stats[0].sample(stats[0].peers())
        assert stats[1].sample(stats[1].peers()).requests == 2
        # A writer caught mid-write (odd sequence): the reader keeps the last whole copy.
        doc = share.reports[2]
        doc.words[0] += 1
        assert dict(stats[0].peers())[(2, os.getpid())] == totals(metrics[2])
    finally:
        share.close()


def test_quantile_interpolates_inside_the_bucket() -> None:
    bounds = (0.1, 0.2, 0.4)
    # 10 in (0, 0.1], 10 in (0.1, 0.2], none above.
    assert quantile(0.5, bounds, [10, 10, 0, 0]) == pytest.approx(0.1)
    assert quantile(0.75, bounds, [10, 10, 0, 0]) == pytest.approx(0.15)
    assert quantile(0.25, bounds, [10, 10, 0, 0]) == pytest.approx(0.05)
    assert quantile(0.99, bounds, [0, 0, 0, 5]) == 0.4  # +Inf: the highest bound known
    assert quantile(0.5, bounds, [0, 0, 0, 0]) is None


def test_ring_counts_each_second_from_the_gateway_metrics() -> None:
    metrics = GatewayMetrics()
    clock = iter(range(1000, 2000))
    stats = RequestStats(metrics, clock=lambda: float(next(clock)))
    metrics.requests.labels("m", "r", "e", "200").inc(5)  # before: not counted
    stats = RequestStats(metrics, clock=lambda: float(next(clock)))

    for _ in range(3):
        metrics.requests.labels("m", "r", "e", "200").inc()
    metrics.requests.labels("m", "r", "e", "503").inc()
    metrics.output_tokens.labels("m").inc(40)
    for v in (0.02, 0.02, 0.02, 0.3):
        metrics.ttft.labels("m").observe(v)
        metrics.e2e.labels("m").observe(v * 10)
    first = stats.sample()
    assert (first.requests, first.errors, first.output_tokens) == (4, 1, 40)
    assert 0.01 < first.ttft[0] <= 0.025  # p50 inside the (0.01, 0.025] bucket
    assert 0.25 < first.ttft[2] <= 0.5  # p99 in the slow request's bucket
    assert first.latency[0] is not None and first.latency[0] > first.ttft[0]

    second = stats.sample()  # nothing new this second
    assert (second.requests, second.errors) == (0, 0)
    assert second.ttft == first.ttft  # percentiles still cover the last WINDOW seconds
    series = stats.series(since=first.t)
    assert [p["t"] for p in series] == [second.t]
    assert series[0]["ttft"][0] == pytest.approx(first.ttft[0] * 1000, abs=0.01)


def test_prefix_hit_rate_is_recent_and_survives_nothing_odd() -> None:
    state = EndpointState(Endpoint("127.0.0.1:1"))
    stats = RequestStats(GatewayMetrics(), endpoints=lambda: [state])
    stats.sample()
    assert stats.prefix_hit_rate(state.address) is None  # one sample: no rate yet
    state.prefix_queries, state.prefix_hits = 1000, 250
    stats.sample()
    assert stats.prefix_hit_rate(state.address) == pytest.approx(0.25)
    state.prefix_queries, state.prefix_hits = 10, 0  # the engine restarted: counters reset
    stats.sample()
    assert stats.prefix_hit_rate(state.address) is None
    stats.endpoints = list  # the endpoint went away
    stats.sample()
    assert stats.prefix_hit_rate(state.address) is None


@pytest.mark.parametrize(
    "name",
    ["apiKey", "api_key", "adminKey", "token", "bearerToken", "password", "key", "secret"],
)
def test_secret_looking_fields_are_masked(name: str) -> None:
    assert secret_key(name)
    doc = {"spec": {"tenants": [{"name": "a", name: "sk-123"}], "secretRef": {"name": "s"}}}
    masked = redact(doc)
    assert masked["spec"]["tenants"][0][name] == MASK
    assert masked["spec"]["secretRef"] == {"name": "s"}  # a reference is no credential
    assert doc["spec"]["tenants"][0][name] == "sk-123"  # the original is untouched


@pytest.mark.parametrize("name", ["monkey", "keyName", "secretRef", "tokens", "replicas"])
def test_ordinary_fields_stay(name: str) -> None:
    assert not secret_key(name)


@pytest.mark.parametrize(
    "text",
    [
        "python -m vllm --api-key S3CR3T --port 1",
        "python -m vllm --hf-token=S3CR3T",
        "llama-server --admin-password\tS3CR3T",
        "Namespace(model='m', api_key='S3CR3T', max_tokens=5)",
        "non-default args: {'api_key': 'S3CR3T'}",
        '{"token": "S3CR3T"}',
        "HF_TOKEN=S3CR3T python -m x",
        "Authorization: Bearer S3CR3T",
        "GET https://hub.example/m?revision=main&token=S3CR3T&x=1",
        "s3://bucket/m?X-Amz-Credential=S3CR3T&X-Amz-Signature=S3CR3T",
        "git clone https://S3CR3T@github.com/o/r",
        "postgres://user:S3CR3T@db:5432/x",
        "ad=https://u:S3CR3T@hub.example/ad?token=S3CR3T",
        "made llmp-abcdefghijkl-S3CR3TS3CR3TS3CR3T for ci",
        "a bare hf_" + "S3CR3T" * 5,
    ],
)
def test_credentials_in_text_are_masked(text: str) -> None:
    assert "S3CR3T" not in redact_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "--max-tokens 5 --model m --ssl-keyfile /k --time-scale 0.01",
        "max_tokens=5 keyName=x tokens: 7",
        "https://hub.example/models/m at 12:30",
    ],
)
def test_ordinary_text_stays(text: str) -> None:
    assert redact_text(text) == text


def test_env_lists_argv_tenant_keys_and_secrets_are_masked() -> None:
    doc = {
        "spec": {
            "envs": [
                {"name": "HF_TOKEN", "value": "a1"},
                {"name": "AWS_SECRET_ACCESS_KEY", "value": "a2"},
                {"name": "LOG_LEVEL", "value": "debug"},
            ],
            "args": ["--api-key", "a3", "--hf-token=a4", "--port", "8080"],
            "keys": [{"id": "k1", "salt": "a5", "hash": "a6", "name": "ci"}],
        }
    }
    masked = redact(doc)
    text = str(masked)
    assert not [s for s in ("a1", "a2", "a3", "a4", "a5", "a6") if f"'{s}'" in text], text
    assert masked["spec"]["envs"][2]["value"] == "debug"
    assert masked["spec"]["args"][3:] == ["--port", "8080"]
    assert masked["spec"]["keys"][0]["id"] == "k1"
    secret = {"kind": "Secret", "metadata": {"name": "s"}, "data": {"anything": "YQ=="}}
    assert redact(secret)["data"] == {"anything": MASK}


def _fleet(ready: int, desired: int = 2, loading: bool = False) -> dict[str, Any]:
    replicas = [
        {
            "index": i,
            "phase": "Ready" if i < ready else "Starting",
            "reason": None,
            "message": "",
            "restarts": 0,
        }
        for i in range(desired)
    ]
    model = (
        {"name": "m", "status": "False", "reason": "Loading", "message": "Loading model files: 40%"}
        if loading
        else {"name": "m", "status": "True", "reason": "Loaded", "message": "Model files at /x"}
    )
    return {
        "workloads": [
            {
                "kind": "Playground",
                "namespace": "default",
                "name": "chat",
                "desired": desired,
                "ready": ready,
                "replicas": replicas,
            }
        ],
        "models": [model],
        "otherEndpoints": [],
    }


def _gateway() -> Any:
    return SimpleNamespace(
        view=lambda: GatewayView([], 1.0, {}, {}, {}), metrics=GatewayMetrics(), extensions=[]
    )


def test_terminal_panel_shows_loading_and_starting_then_one_line() -> None:
    gateway = _gateway()
    starting = _fleet(ready=1, loading=True)
    assert not settled(starting)
    console = Console(record=True, width=140, file=io.StringIO())
    console.print(panel(starting, gateway))
    text = console.export_text()
    assert "model m" in text and "40%" in text and "█" in text
    assert "playground default/chat" in text and "1/2 ready" in text and "1 Starting" in text
    assert settled(_fleet(ready=2))
    assert status_line(_fleet(ready=2), gateway).startswith("1 workload · 2/2 replicas ready")


def test_plain_lines_only_on_change() -> None:
    out = io.StringIO()
    platform = SimpleNamespace(gateway=_gateway())
    status = UpStatus(platform, Console(file=out, width=200), interactive=False)
    status.changes(_fleet(ready=1, loading=True))
    status.changes(_fleet(ready=1, loading=True))  # nothing new: nothing printed
    status.changes(_fleet(ready=2))
    lines = out.getvalue().splitlines()
    assert lines == [
        "model m: Loading: Loading model files: 40%",
        "playground default/chat replica 0: Ready",
        "playground default/chat replica 1: Starting",
        "playground default/chat: 1/2 replicas ready",
        "model m: Loaded: Model files at /x",
        "playground default/chat replica 1: Ready",
        "playground default/chat: 2/2 replicas ready",
    ]
    assert "\x1b" not in out.getvalue()  # plain text for pipes and logs


async def test_live_panel_on_a_terminal(tmp_path: Any) -> None:
    """On a terminal the status redraws in place (rich Live) from the real store."""
    import asyncio

    from llmplane.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "db.sqlite")
    store.apply(
        {
            "apiVersion": "inference.llmaz.io/v1alpha1",
            "kind": "Playground",
            "metadata": {"name": "chat", "namespace": "default"},
            "spec": {"replicas": 2, "modelClaim": {"modelName": "m"}},
        }
    )
    gateway = _gateway()
    gateway.config = SimpleNamespace(metrics_staleness=1.0)
    platform = SimpleNamespace(store=store, runtime=None, gateway=gateway)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    task = asyncio.create_task(UpStatus(platform, console).run())
    try:
        async with asyncio.timeout(10):
            while "0/2 ready" not in out.getvalue():
                await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        store.close()
    text = out.getvalue()
    assert "playground default/chat" in text and "no replicas yet" in text
    assert "\x1b[" in text  # drawn with terminal control sequences, not plain lines
