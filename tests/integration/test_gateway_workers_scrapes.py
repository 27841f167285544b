"""``llmplane gateway --workers 2`` scrapes each engine once per interval, not once per worker:
worker 0 scrapes and publishes, worker 1 reads what it published (counted on the sim side,
``GET /admin/faults``'s ``metrics_requests``); both workers see the scraped load; when the
scraping worker is killed its replacement scrapes on."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import aiohttp

from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.store.paths import open_store
from llmplane.testing import Processes, eventually, gateway, sim_process, wait_for
from llmplane.testing.pinned import on_worker
from tests.integration.multiworker import (
    access_lines,
    chat,
    only_among,
    per_worker,
    session,
    workers_of,
)

INTERVAL = 0.1  # scrapeInterval and scrapeIdleInterval: every endpoint, busy or idle
WINDOW = 3.0
MODEL = "sc-slow"


async def scrapes(s: aiohttp.ClientSession, url: str) -> int:
    async with s.get(f"{url}/admin/faults") as resp:
        return int((await resp.json())["metrics_requests"])


async def scrape_rate(s: aiohttp.ClientSession, url: str) -> float:
    """/metrics requests the sim answered per second over ``WINDOW`` (a measuring window, not
    a wait: the rate is what is asserted)."""
    first, start = await scrapes(s, url), time.monotonic()
    await asyncio.sleep(WINDOW)
    return (await scrapes(s, url) - first) / (time.monotonic() - start)


def kv_usage(text: str, address: str) -> float:
    m = re.search(
        rf'^llmplane_gateway_endpoint_kv_usage{{endpoint="{re.escape(address)}"}} (\S+)$',
        text,
        re.M,
    )
    return float(m.group(1)) if m else -1.0


def two_workers(group: Processes, tmp_path: Path, config: str, *sim_args: str) -> tuple:
    """A sim engine (``sim_args``) behind ``llmplane gateway --workers 2`` scraping it every
    INTERVAL, with more ``config`` lines under ``gateway:``: (engine, gateway)."""
    path = tmp_path / "scheduler.yaml"
    path.write_text(
        f"gateway:\n  scrapeInterval: {INTERVAL}\n  scrapeIdleInterval: {INTERVAL}\n{config}"
    )
    (engine,) = group.start(sim_process(MODEL, *sim_args))
    with open_store(tmp_path / "state") as store:
        store.apply(endpoint_object("slow", engine.address, MODEL))
    (gw,) = group.start(
        gateway("--workers", "2", "--config", str(path), state_dir=tmp_path / "state")
    )
    return engine, gw


def test_two_workers_scrape_each_engine_once_per_interval(tmp_path: Path) -> None:
    with Processes() as group:
        engine, gw = two_workers(group, tmp_path, "", "--step-time", "0.2")

        async def run() -> None:
            async with session() as s, per_worker(gw.pid) as pinned:
                await eventually(lambda: scrapes(s, engine.url), timeout=20, what="a first scrape")
                # One scraper: about 1 / INTERVAL a second (pauses jittered by +-20 %); each
                # worker scraping would be twice that.
                rate = await scrape_rate(s, engine.url)
                assert 0.2 / INTERVAL <= rate <= 1.35 / INTERVAL, rate

                # Requests held by each worker: each worker's /metrics shows the engine's KV
                # use, scraped by worker 0 alone.
                index: dict[int, int] = {}
                held = []
                for n, pid in enumerate(sorted(pinned), 1):
                    one = pinned[pid]
                    held += [asyncio.ensure_future(chat(one, gw.url, MODEL, 200)) for _ in range(2)]
                    assert await chat(one, gw.url, MODEL, 1) == 200
                    lines = wait_for(
                        lambda n=n: len(x := access_lines(gw.output())) == n and x,
                        timeout=10,
                        what="the access-log line",
                    )
                    index[pid] = lines[-1]["worker"]
                assert sorted(index.values()) == [0, 1], index
                for pid in index:

                    async def loaded(one: aiohttp.ClientSession = pinned[pid]) -> bool:
                        async with one.get(f"{gw.url}/metrics") as resp:
                            return kv_usage(await resp.text(), engine.address) > 0

                    await eventually(loaded, timeout=10, what=f"KV use seen by {index[pid]}")
                for request in held:
                    request.cancel()
                await asyncio.gather(*held, return_exceptions=True)

                # The scraping worker killed: its replacement scrapes on, still alone.
                scraper = next(pid for pid, i in index.items() if i == 0)
                os.kill(scraper, signal.SIGKILL)
                await eventually(
                    lambda: len(workers_of(gw.pid) - set(index)) == 1,
                    timeout=20,
                    what="a replacement for worker 0",
                )
                before = await scrapes(s, engine.url)

                async def scraped_again() -> bool:
                    return await scrapes(s, engine.url) > before

                await eventually(scraped_again, timeout=20, what="scrapes again")
                rate = await scrape_rate(s, engine.url)
                assert 0.2 / INTERVAL <= rate <= 1.35 / INTERVAL, rate

        asyncio.run(run())
        assert wait_for(lambda: "exited (signal 9)" in gw.output(), timeout=10, what="logged")


MODELS_EVERY = 0.5  # modelsRefreshInterval


async def models_reads(s: aiohttp.ClientSession, url: str) -> int:
    async with s.get(f"{url}/admin/faults") as resp:
        return int((await resp.json())["models_requests"])


def test_two_workers_read_each_engine_model_list_once(tmp_path: Path) -> None:
    """Worker 0 alone reads /v1/models (counted on the sim side); an adapter loaded on the
    engine becomes routable on both workers, on worker 1 from what worker 0 published, also
    while worker 0 is stopped (its names stay)."""
    with Processes() as group:
        engine, gw = two_workers(group, tmp_path, f"  modelsRefreshInterval: {MODELS_EVERY}\n")

        async def run() -> None:
            async with session() as s:
                await eventually(
                    lambda: models_reads(s, engine.url), timeout=20, what="a first read"
                )
                # One reader: about one read per MODELS_EVERY (rounded up to the next scrape);
                # every worker reading would be twice that.
                first, start = await models_reads(s, engine.url), time.monotonic()
                await asyncio.sleep(WINDOW)  # a measuring window: the rate is what is asserted
                rate = (await models_reads(s, engine.url) - first) / (time.monotonic() - start)
                assert 0.3 / MODELS_EVERY <= rate <= 1.3 / MODELS_EVERY, rate

                index: dict[int, int] = {}
                among = workers_of(gw.pid)
                # One keep-alive connection accepted by each worker.
                pinned = {pid: on_worker(pid, among, limit=1) for pid in among}
                for n, pid in enumerate(sorted(among), 1):
                    assert await chat(pinned[pid], gw.url, MODEL, 1) == 200
                    lines = wait_for(
                        lambda n=n: len(x := access_lines(gw.output())) == n and x,
                        timeout=10,
                        what="the access-log line",
                    )
                    index[lines[-1]["worker"]] = pid
                assert sorted(index) == [0, 1], index

                body = {"lora_name": "sc-adapter", "lora_path": "/adapters/a"}
                async with s.post(f"{engine.url}/v1/load_lora_adapter", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                for worker in (0, 1):  # worker 1 alone: worker 0 stopped, nothing read anew
                    one = pinned[index[worker]]
                    with only_among(index[worker], among):

                        async def routable(one: aiohttp.ClientSession = one) -> bool:
                            return await chat(one, gw.url, "sc-adapter", 1) == 200

                        await eventually(
                            routable, timeout=15, what=f"the adapter routed by worker {worker}"
                        )
                for one in pinned.values():
                    await one.close()

        asyncio.run(run())
