"""``llmplane gateway --workers 2`` as real processes in front of real simulated engines: the
workers share in-flight counts (every worker's /metrics and scheduler see the requests the
other one holds), a local token rate limit admits exactly its tokens across both, /metrics is
one aggregated view, the access log is one stream of whole JSON lines from both workers, a
SIGKILLed worker is replaced while requests keep succeeding, SIGTERM drains, and keep-alive
connections opened at once spread over both workers (one SO_REUSEPORT socket each). A test
reaches a chosen worker through ``llmplane/testing/pinned.py``."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmplane.controlplane.plan import SERVICE_LABEL
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.store.paths import open_store
from llmplane.testing import Processes, eventually, gateway, sim_process, wait_for
from llmplane.testing.kube_emulator import KubeEmulator, pod
from llmplane.testing.pinned import on_worker
from llmplane.testing.sockets import established
from tests.integration.kube_fleet import (
    BACKEND_LABEL,
    MODEL,
    MODEL_LABEL,
    free_loopback_prefix,
    ip,
    model_server,
    openmodel,
    playground,
)
from tests.integration.multiworker import (
    access_lines,
    chat,
    inflight_gauge,
    per_worker,
    session,
    workers_of,
)
from tests.integration.upcli import alive

KTHENA = "networking.serving.volcano.sh/v1alpha1"
SLOW = "wk-slow"  # 0.2 s a step: 200 tokens hold a request for 40 s
FAST = "wk-fast"
LIMITED = "wk-limited"
LIMIT = 2_000  # input tokens a day (refill over the test: under 1 token)
PROMPT_TOKENS = 100


def route(name: str, model: str, rate_limit: dict | None = None) -> dict:
    spec: dict[str, Any] = {
        "modelName": name,
        "rules": [{"targetModels": [{"modelServerName": model}]}],
    }
    if rate_limit is not None:
        spec["rateLimit"] = rate_limit
    return {
        "apiVersion": KTHENA,
        "kind": "ModelRoute",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def engines():
    with Processes() as group:
        slow, fast = group.start(
            sim_process(SLOW, "--step-time", "0.2"), sim_process(FAST, "--time-scale", "0")
        )
        yield slow, fast


@pytest.fixture(scope="module")
def state(tmp_path_factory, engines) -> Path:
    slow, fast = engines
    state = tmp_path_factory.mktemp("state")
    store = open_store(state)
    store.apply(endpoint_object("slow", slow.address, SLOW))
    store.apply(endpoint_object("fast", fast.address, FAST, labels={"app": "fast"}))
    store.apply(model_server("fast-srv", {"app": "fast"}, model=FAST))
    store.apply(route(LIMITED, "fast-srv", {"inputTokensPerUnit": LIMIT, "unit": "day"}))
    store.close()
    return state


@pytest.fixture
def gw(state):
    with Processes() as group:
        (proc,) = group.start(gateway("--workers", "2", "--log-level", "WARNING", state_dir=state))
        yield proc


async def metrics(s: aiohttp.ClientSession, url: str) -> str:
    async with s.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


def test_workers_share_inflight_counts(gw, engines):
    """4 slow requests held by each worker: /metrics answered by either worker counts all 8
    in flight to the engine (each alone would count its own 4)."""
    slow_address = engines[0].address
    a, b = sorted(workers_of(gw.pid))

    async def run() -> None:
        async with per_worker(gw.pid) as pinned:
            requests = []
            for worker in (a, b):
                s = pinned[worker]
                batch = [asyncio.ensure_future(chat(s, gw.url, SLOW, 200)) for _ in range(4)]
                requests += batch

                async def mine_held(n: int = len(requests), s: Any = s) -> bool:
                    return inflight_gauge(await metrics(s, gw.url), slow_address) == n

                # The metrics read comes from the same worker: its own 4 (and the other's).
                await eventually(mine_held, timeout=20, what=f"{len(requests)} in flight")
            for worker in (a, b):
                seen = [
                    inflight_gauge(await metrics(pinned[worker], gw.url), slow_address)
                    for _ in range(3)
                ]
                assert seen == [8, 8, 8], (worker, seen)
            for request in requests:  # no need to wait 40 s: the client goes away (499)
                request.cancel()
            await asyncio.gather(*requests, return_exceptions=True)

    asyncio.run(run())

    def served() -> list[int] | None:
        lines = [a["worker"] for a in access_lines(gw.output()) if a.get("model") == SLOW]
        return sorted(lines) if len(lines) == 8 else None

    assert wait_for(served, timeout=20, what="8 access-log lines") == [0] * 4 + [1] * 4


def test_each_workers_console_charts_every_workers_requests(gw):
    """Right after start, 3 requests served by one worker and 7 by the other: the console's
    request charts, answered by either worker, count all 10 (each worker reports its totals
    in shared memory; a worker's console starts from the others' totals at its own start)."""
    a, b = sorted(workers_of(gw.pid))

    async def run() -> None:
        async with per_worker(gw.pid) as pinned:
            for worker, n in ((a, 3), (b, 7)):
                for _ in range(n):
                    assert await chat(pinned[worker], gw.url, FAST, 1) == 200
            seen: dict[int, float] = {}

            async def both_chart_10() -> bool:
                for worker in (a, b):
                    async with pinned[worker].get(f"{gw.url}/console/api/stats") as resp:
                        points = (await resp.json())["points"]
                    seen[worker] = sum(p["requests"] for p in points)
                return set(seen.values()) == {10}

            try:
                await eventually(both_chart_10, timeout=20, every=0.5, what="10 charted")
            except AssertionError as err:
                raise AssertionError(f"{err}; charted by worker pid: {seen}") from None

    asyncio.run(run())


ROUNDS = 5
CONNECTIONS = 32
AT_LEAST = 4  # of the 32, on each worker


async def open_keepalive(url: str, n: int) -> list[tuple[asyncio.StreamReader, Any]]:
    """``n`` keep-alive connections opened at once (as wrk does), each answered once."""
    host, port = url.removeprefix("http://").rsplit(":", 1)

    async def one() -> tuple[asyncio.StreamReader, Any]:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.1 200"), "GET /health"
        return reader, writer

    return list(await asyncio.gather(*(one() for _ in range(n))))


def test_keepalive_connections_spread_over_both_workers(gw):
    """32 keep-alive connections opened at once, 5 rounds: every round, each worker holds at
    least 4 of them (counted per worker process from /proc). Each worker accepts on its own
    SO_REUSEPORT socket and the kernel hashes each connection's addresses onto one, so a
    worker's share is Binomial(32, 1/2): one round fails by chance with probability
    2 * P(X <= 3) = 2 * (1 + 32 + 496 + 4960) / 2^32 = 2.6e-6, the test 1.3e-5. On one shared
    socket, the worker that wakes first took all 32 in 1 of 3 runs of wrk."""
    workers = workers_of(gw.pid)
    assert len(workers) == 2

    async def run() -> list[list[int]]:
        spreads = []
        for _ in range(ROUNDS):
            conns = await open_keepalive(gw.url, CONNECTIONS)
            try:
                held = established(workers)
                spreads.append(
                    sorted(
                        sum(1 for local, _ in held[pid].values() if local == gw.port)
                        for pid in workers
                    )
                )
            finally:
                for _, writer in conns:
                    writer.close()
                await asyncio.gather(*(w.wait_closed() for _, w in conns), return_exceptions=True)
        return spreads

    spreads = asyncio.run(run())
    assert all(sum(s) == CONNECTIONS for s in spreads), spreads
    assert all(s[0] >= AT_LEAST for s in spreads), spreads


def requests_counted(text: str, model: str) -> float:
    """``llmplane_gateway_requests_total`` for ``model``, summed over its statuses."""
    return sum(
        float(v)
        for v in re.findall(
            rf'^llmplane_gateway_requests_total{{[^}}]*model="{model}"[^}}]*}} (\S+)$', text, re.M
        )
    )


def test_rate_limit_exact_across_workers_and_metrics_aggregated(gw):
    """60 requests of 100 input tokens on a route limited to 2,000 a day, 30 to each worker:
    exactly 20 admitted. /metrics sums both workers' request counters."""
    prompt = "x" * (4 * PROMPT_TOKENS)  # the sim counts ceil(chars / 4), as the gateway does

    async def run() -> list[int]:
        async with per_worker(gw.pid) as pinned, session() as s:

            async def one(s: aiohttp.ClientSession) -> int:
                body = {"model": LIMITED, "prompt": prompt, "max_tokens": 1}
                async with s.post(f"{gw.url}/v1/completions", json=body) as resp:
                    await resp.read()
                    return resp.status

            statuses: list[int] = []
            for worker in sorted(pinned):
                statuses += await asyncio.gather(*(one(pinned[worker]) for _ in range(30)))

            # Every request is counted before its answer is sent; the answering worker adds
            # its peer's counters, read from the peer's socket within MetricsPeer.timeout
            # (2 s): on a loaded machine the peer can answer later, and that one /metrics
            # counts the answering worker's requests alone. Each alone counts 30, so only the
            # sum of both reaches 60.
            counts: list[float] = []

            async def both_counted() -> bool:
                counts.append(requests_counted(await metrics(s, gw.url), LIMITED))
                return counts[-1] == 60

            try:
                await eventually(both_counted, timeout=20, what="/metrics to count 60")
            except AssertionError as err:
                raise AssertionError(f"{err}; the last counts {counts[-5:]}") from None
            return statuses

    statuses = asyncio.run(run())
    assert statuses.count(200) == LIMIT // PROMPT_TOKENS, statuses
    assert statuses.count(429) == 60 - LIMIT // PROMPT_TOKENS, statuses

    def logged() -> list[int] | None:  # the access log is written a few ms after the answer
        lines = [a["worker"] for a in access_lines(gw.output()) if a.get("model") == LIMITED]
        return sorted(lines) if len(lines) >= 60 else None

    assert wait_for(logged, timeout=20, what="60 access-log lines") == [0] * 30 + [1] * 30


def test_killed_worker_is_replaced_while_requests_succeed(gw):
    first = workers_of(gw.pid)
    assert len(first) == 2
    victim = min(first)
    os.kill(victim, signal.SIGKILL)

    async def run() -> int:
        async with session() as s:
            # The victim is dead (reaped by the supervisor) before the first request below.
            await eventually(lambda: victim not in workers_of(gw.pid), timeout=10, what="reaped")
            statuses: list[int] = []

            async def replaced() -> int | None:
                statuses.extend(await asyncio.gather(*(chat(s, gw.url, FAST) for _ in range(4))))
                new = workers_of(gw.pid) - first
                return new.pop() if new else None

            replacement = await eventually(replaced, timeout=20, what="a replacement worker")
            # ... which serves, on the socket the victim served.
            async with per_worker(gw.pid) as pinned:
                statuses.extend(
                    await asyncio.gather(
                        *(chat(pinned[replacement], gw.url, FAST) for _ in range(8))
                    )
                )
            assert set(statuses) == {200}, statuses
            return replacement

    replacement = asyncio.run(run())
    assert workers_of(gw.pid) == (first - {victim}) | {replacement}
    assert "exited (signal 9); starting a new one" in gw.output()


def test_a_killed_workers_inflight_requests_stop_counting(gw, engines):
    """4 slow requests held by a worker that is SIGKILLed: they will never finish, and the
    supervisor releases its in-flight counts when it reaps it (the survivor's /metrics, and
    its saturation rule, stop counting them); the survivor's own 2 stay counted."""
    slow_address = engines[0].address
    victim, survivor = sorted(workers_of(gw.pid))

    async def run() -> None:
        async with per_worker(gw.pid) as pinned:
            held = [
                asyncio.ensure_future(chat(pinned[survivor], gw.url, SLOW, 200)) for _ in range(2)
            ]
            held += [
                asyncio.ensure_future(chat(pinned[victim], gw.url, SLOW, 200)) for _ in range(4)
            ]

            async def counted(n: int) -> bool:
                return inflight_gauge(await metrics(pinned[survivor], gw.url), slow_address) == n

            await eventually(lambda: counted(6), timeout=20, what="6 in flight")
            os.kill(victim, signal.SIGKILL)
            await eventually(lambda: counted(2), timeout=20, what="the victim's 4 released")
            for request in held:
                request.cancel()
            await asyncio.gather(*held, return_exceptions=True)

    asyncio.run(run())


def test_sigterm_drains_both_workers(gw, engines):
    """SIGTERM to the supervisor while slow requests are in flight: they finish with 200,
    and the whole gateway exits 0."""
    slow_address = engines[0].address

    async def run() -> list[int]:
        async with session() as s:
            requests = [asyncio.ensure_future(chat(s, gw.url, SLOW, 10)) for _ in range(4)]

            async def all_held() -> bool:
                return inflight_gauge(await metrics(s, gw.url), slow_address) == 4

            await eventually(all_held, timeout=20, what="4 requests in flight")
            os.kill(gw.pid, signal.SIGTERM)
            return list(await asyncio.gather(*requests))

    assert asyncio.run(run()) == [200] * 4
    assert gw.exited(30) == 0  # by itself, on the one SIGTERM


WARM = "wk-warm"


def test_a_worker_reuses_its_warm_connections_among_alike_replicas(tmp_path):
    """6 idle replicas of one model, scored alike: 12 requests one after another through the
    worker that does not scrape open one upstream connection, not one per replica they meet
    (about 5 with a plain random tie-break): among equally scored endpoints a worker prefers
    those it holds an idle connection to. The scraping worker's scrapes keep its own pool
    warm to every replica; the other's pool holds what its requests opened."""
    with Processes() as group:
        sims = group.start(*(sim_process(WARM, "--time-scale", "0") for _ in range(6)))
        store = open_store(tmp_path)
        for i, sim in enumerate(sims):
            store.apply(endpoint_object(f"warm-{i}", sim.address, WARM))
        store.close()
        (gw,) = group.start(gateway("--workers", "2", "--log-level", "WARNING", state_dir=tmp_path))
        ports = {sim.port for sim in sims}
        workers = workers_of(gw.pid)

        def to_sims(pid: int) -> dict[int, int]:
            """pid's connections to the sims: socket inode -> the sim's port."""
            held = established([pid])[pid]
            return {i: remote for i, (_, remote) in held.items() if remote in ports}

        scraper = wait_for(
            lambda: next((p for p in workers if set(to_sims(p).values()) == ports), None),
            timeout=20,
            what="the scraping worker's connections to all 6 sims",
        )
        (follower,) = workers - {scraper}
        before = to_sims(follower)
        assert len(set(before.values())) < 6, before  # the follower scrapes nothing itself

        async def run() -> None:
            # One keep-alive connection, accepted by the follower: every request on it reaches
            # the follower.
            pinned = on_worker(follower, workers, limit=1)
            try:
                for _ in range(12):
                    assert await chat(pinned, gw.url, WARM, 1) == 200
            finally:
                await pinned.close()

        asyncio.run(run())
        opened = {i: port for i, port in to_sims(follower).items() if i not in before}
        served = [a["endpoint"] for a in access_lines(gw.output()) if a.get("model") == WARM]
        assert len(opened) == 1, (opened, served)


def test_workers_die_with_a_killed_supervisor(gw):
    """SIGKILL to the supervisor (nothing of it runs): its workers stop too, none is left
    holding the port."""
    workers = workers_of(gw.pid)
    os.kill(gw.pid, signal.SIGKILL)
    wait_for(
        lambda: not any(alive(pid) for pid in workers),
        timeout=20,
        what="the workers of a killed supervisor to exit",
    )


def test_busy_port_is_one_line_and_exit_2(tmp_path):
    """The supervisor binds before it forks: a busy port is refused once, without workers."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [sys.executable, "-m", "llmplane.cli", "gateway", "--workers", "2"]
        argv += ["--port", str(port), "--state-dir", str(tmp_path)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"llmplane gateway: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(pass --port N, or --port 0 for any free port)"
    ]


async def test_autoscaling_signals_add_up_over_workers(tmp_path, monkeypatch):
    """``/autoscaling/signals`` (what the in-cluster autoscaler reads) from either worker counts
    the requests both served: 5 sent to one worker, 7 to the other, requestsSeen 12 from each.
    In-cluster discovery against the Kubernetes API EMULATOR (no API server runs here; see
    tests/integration/test_gateway_kube.py), the pod a real sim on a loopback address."""
    prefix = free_loopback_prefix()
    with Processes() as group:
        (engine,) = group.start(
            sim_process(MODEL, "--host", f"{prefix}.2", "--port", "8080", "--time-scale", "0")
        )
        async with KubeEmulator() as kube:
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(
                "apiVersion: v1\nkind: Config\n"
                f'clusters: [{{name: e, cluster: {{server: "{kube.url}"}}}}]\n'
                "users: [{name: t, user: {token: not-checked}}]\n"
                "contexts: [{name: e, context: {cluster: e, user: t}}]\ncurrent-context: e\n"
            )
            monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
            monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
            await kube.create(openmodel(MODEL))
            await kube.create(playground(MODEL))
            labels = {MODEL_LABEL: MODEL, BACKEND_LABEL: "sim", SERVICE_LABEL: "llama"}
            await kube.create(pod("llama-0", labels, ip(engine)))
            gw = gateway("--kubernetes", "--namespace", "default", "--workers", "2")
            await asyncio.to_thread(gw.start)
            try:
                a, b = sorted(workers_of(gw.pid))

                async def routable(s: aiohttp.ClientSession) -> bool:
                    return await chat(s, gw.url, MODEL) == 200

                # One keep-alive connection accepted by each worker.
                pinned = {}
                for worker in (a, b):
                    one = on_worker(worker, {a, b}, limit=1)
                    pinned[worker] = one
                    await eventually(lambda s=one: routable(s), timeout=20, what="routable")
                try:
                    for worker, n in ((a, 4), (b, 6)):  # plus the first one each above
                        sent = [chat(pinned[worker], gw.url, MODEL) for _ in range(n)]
                        assert [await c for c in sent] == [200] * n
                    for worker in (a, b):
                        async with pinned[worker].get(f"{gw.url}/autoscaling/signals") as resp:
                            assert resp.status == 200
                            signals = await resp.json()
                        seen = signals["workloads"]["default/llama"]["requestsSeen"]
                        assert seen == 12, (worker, signals)
                finally:
                    for one in pinned.values():
                        await one.close()

                def served() -> list[int] | None:  # written a few ms after the answers
                    lines = access_lines(gw.output())
                    ok = [x["worker"] for x in lines if x.get("model") and x["status"] == 200]
                    return sorted(ok) if len(ok) >= 12 else None

                logged = await asyncio.to_thread(
                    wait_for, served, timeout=10, what="12 access-log lines"
                )
                assert logged in ([0] * 5 + [1] * 7, [0] * 7 + [1] * 5), logged
            finally:
                await asyncio.to_thread(gw.stop)
