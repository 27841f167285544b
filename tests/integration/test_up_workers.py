"""``llmplane up --workers 2`` as a user runs it, with sim replicas: the platform process is
gateway worker 0, a supervisor it forked runs worker 1. Requests on either worker (told apart
by the access log's ``worker``) see each other's in-flight counts; the console answers on
both and charts both workers' requests; each sim is scraped once per interval, not once per worker; a request held at worker
1's activator wakes the autoscaler in worker 0 and is served from zero; a killed worker 1 is
replaced while requests keep succeeding; SIGTERM drains both and leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import aiohttp

from llmplane.testing import Processes, Up, eventually, wait_for
from llmplane.testing.pinned import on_worker
from tests.integration.elastic_fleets import SCALE_TO_ZERO, elastic_fleet, spec_replicas
from tests.integration.multiworker import access_lines, chat, inflight_gauge
from tests.integration.multiworker import session as new_session
from tests.integration.upcli import alive, sim_fleet, status

MODEL = "tiny"
INTERVAL = 0.1  # scrapeInterval = scrapeIdleInterval: every replica, busy or idle


def children(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(c) for c in text.split()}


def followers(up: Up, workers: int = 2) -> tuple[int, set[int]]:
    """(the workers' supervisor, workers 1 .. N-1): ``up``'s one child that is no engine,
    and its children."""

    def found() -> tuple[int, set[int]] | None:
        supervisors = children(up.pid) - up.engine_pids()
        if len(supervisors) != 1:
            return None
        (supervisor,) = supervisors
        return (supervisor, kids) if len(kids := children(supervisor)) == workers - 1 else None

    return wait_for(found, 10, what=f"up's worker supervisor and its {workers - 1} worker(s)")


def start_up(processes: Processes, tmp_path: Path, fleet: str, *args: str) -> Up:
    return processes.up(tmp_path / "state", fleet, args=["--workers", "2", "--access-log", *args])


async def scrape_count(s: aiohttp.ClientSession, address: str) -> int:
    async with s.get(f"http://{address}/admin/faults") as resp:
        return int((await resp.json())["metrics_requests"])


def test_workers_share_inflight_console_and_scrapes(tmp_path: Path, processes: Processes) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet(MODEL, 1, time_scale="1", args=["--step-time", "0.2"]))
    config = tmp_path / "gateway.yaml"
    config.write_text(f"gateway: {{scrapeInterval: {INTERVAL}, scrapeIdleInterval: {INTERVAL}}}\n")
    up = start_up(processes, tmp_path, str(fleet), "--gateway-config", str(config))
    wait_for(lambda: status(tmp_path / "state", "Playground", MODEL).get("readyReplicas") == 1, 60)
    _, (worker1,) = followers(up)
    workers = {up.pid, worker1}

    async def run() -> None:
        # Per worker: new connections it accepts (``fresh``), one keep-alive one (``pinned``).
        fresh = {pid: on_worker(pid, workers, force_close=True) for pid in workers}
        pinned = {pid: on_worker(pid, workers, limit=1) for pid in workers}
        async with new_session() as s:
            await eventually(lambda: chat(s, up.url, MODEL, 1), timeout=20, what="routable")
            async with s.get(f"{up.url}/console/api/fleet") as resp:
                replicas = (await resp.json())["workloads"][0]["replicas"]
            address = replicas[0]["address"]
            held = []
            for n, pid in enumerate((up.pid, worker1), 1):
                one = fresh[pid]
                held += [asyncio.ensure_future(chat(one, up.url, MODEL, 200)) for _ in range(3)]

                async def counted(n: int = 3 * n, one: aiohttp.ClientSession = one) -> bool:
                    async with one.get(f"{up.url}/metrics") as resp:
                        return inflight_gauge(await resp.text(), address) == n

                await eventually(counted, timeout=20, what=f"{3 * n} in flight")
            try:
                for pid, one in pinned.items():  # each worker counts both workers' requests
                    for _ in range(3):
                        async with one.get(f"{up.url}/metrics") as resp:
                            assert inflight_gauge(await resp.text(), address) == 6, pid
                    # The console (answered by the platform process) on either worker.
                    async with one.get(f"{up.url}/console/api/fleet") as resp:
                        assert resp.status == 200, pid
                        fleet_doc = await resp.json()
                    assert fleet_doc["workloads"][0]["name"] == MODEL
                    async with one.get(f"{up.url}/console/") as resp:
                        assert resp.status == 200 and "text/html" in resp.headers["Content-Type"]
            finally:
                for one in pinned.values():
                    await one.close()
            for request in held:
                request.cancel()
            await asyncio.gather(*held, return_exceptions=True)

            # The console's request charts (and so `up`'s status line, read from them) count
            # worker 1's requests too: 5 served by worker 1 alone (at most the 3 cancelled
            # ones are left for worker 0's own count to add).
            async def charted() -> float:
                async with s.get(f"{up.url}/console/api/stats") as resp:
                    return sum(p["requests"] for p in (await resp.json())["points"])

            before = await charted()
            for _ in range(5):
                assert await chat(fresh[worker1], up.url, MODEL, 1) == 200
            for one in fresh.values():
                await one.close()

            async def counted_in_charts() -> bool:
                return await charted() - before >= 5

            await eventually(counted_in_charts, timeout=20, what="worker 1's requests charted")

            # The sim's /metrics is read about once per INTERVAL: one scraper, not two.
            first, start = await scrape_count(s, address), time.monotonic()
            await asyncio.sleep(3.0)  # a measuring window: the rate is what is asserted
            rate = (await scrape_count(s, address) - first) / (time.monotonic() - start)
            assert 0.2 / INTERVAL <= rate <= 1.35 / INTERVAL, rate

    asyncio.run(run())
    lines = wait_for(
        lambda: len(x := [a for a in access_lines(up.output()) if a["status"] == 499]) == 6 and x,
        timeout=20,
        what="6 access-log lines",
    )
    assert sorted(a["worker"] for a in lines) == [0, 0, 0, 1, 1, 1]  # the held ones, cancelled


def test_killed_worker_is_replaced_and_sigterm_drains_everything(
    tmp_path: Path, processes: Processes
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet(MODEL, 1, time_scale="1", args=["--step-time", "0.05"]))
    up = start_up(processes, tmp_path, str(fleet))
    wait_for(lambda: status(tmp_path / "state", "Playground", MODEL).get("readyReplicas") == 1, 60)
    supervisor, (victim,) = followers(up)
    engines = up.engine_pids()

    async def run() -> None:
        async with new_session() as s:
            await eventually(lambda: chat(s, up.url, MODEL, 1), timeout=20, what="routable")
            async with s.get(f"{up.url}/console/api/fleet") as resp:
                address = (await resp.json())["workloads"][0]["replicas"][0]["address"]
            os.kill(victim, signal.SIGKILL)
            await eventually(lambda: victim not in children(supervisor), 10, what="reaped")
            statuses: list[int] = []

            async def replaced() -> int | None:
                statuses.extend(await asyncio.gather(*(chat(s, up.url, MODEL) for _ in range(4))))
                new = children(supervisor) - {victim}
                return new.pop() if new else None

            replacement = await eventually(replaced, timeout=30, what="a replacement worker")
            # ... which serves, on the socket the victim served.
            workers = {up.pid, replacement}
            fresh = {pid: on_worker(pid, workers, force_close=True) for pid in workers}
            try:
                statuses.extend(
                    await asyncio.gather(
                        *(chat(fresh[replacement], up.url, MODEL) for _ in range(4))
                    )
                )
                assert set(statuses) == {200}, statuses

                # SIGTERM while requests are in flight on both workers: they finish (200).
                held = []
                for n, pid in enumerate(sorted(workers), 1):
                    one = fresh[pid]
                    held += [asyncio.ensure_future(chat(one, up.url, MODEL, 100)) for _ in range(2)]

                    async def counted(n: int = 2 * n) -> bool:  # the engine runs them
                        async with s.get(f"http://{address}/metrics") as resp:
                            text = await resp.text()
                        return sum(map(float, RUNNING.findall(text))) == n

                    await eventually(counted, timeout=20, what=f"{2 * n} in flight")
                os.kill(up.pid, signal.SIGTERM)
                assert await asyncio.gather(*held) == [200] * 4
            finally:
                for one in fresh.values():
                    await one.close()

    asyncio.run(run())
    assert up.exited(60) == 0  # by itself, on the one SIGTERM
    assert "exited (signal 9)" in up.output()
    left = {supervisor, *children(supervisor), *engines}
    wait_for(lambda: not any(alive(pid) for pid in left), 30, what="every process of up to be gone")


RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.M)


def test_a_request_held_by_worker_1_scales_from_zero(tmp_path: Path, processes: Processes) -> None:
    """With autoscaling passes a minute apart, only the wake-up worker 1 sends (and the held
    count the autoscaler reads from it) can start a replica before the 20 s hold timeout."""
    fleet = elastic_fleet(tmp_path, SCALE_TO_ZERO, replicas=0, time_scale="0.01")
    config = tmp_path / "gateway.yaml"
    config.write_text("gateway: {activatorHoldTimeout: 20}\n")
    up = start_up(
        processes, tmp_path, fleet, "--autoscale-interval", "60", "--gateway-config", str(config)
    )
    state = tmp_path / "state"
    wait_for(lambda: status(state, "Playground", MODEL).get("conditions"), 30)
    assert spec_replicas(state) == 0
    _, (worker1,) = followers(up)

    async def run() -> int:
        async with on_worker(worker1, {up.pid, worker1}, limit=1) as one:
            body = {"model": MODEL, "prompt": "hello", "max_tokens": 5}
            async with one.post(f"{up.url}/v1/completions", json=body) as resp:
                await resp.read()
                return resp.status

    assert asyncio.run(run()) == 200
    assert spec_replicas(state) == 1
    (line,) = wait_for(
        lambda: [a for a in access_lines(up.output()) if a.get("model") == MODEL],
        10,
        what="the request's access-log line",
    )
    assert line["worker"] == 1 and line["status"] == 200
