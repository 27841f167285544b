"""A SIGKILLed worker of ``llmplane gateway --workers 2`` in front of an upstream answering a
fixed completion (the stand-in upstream with ``--fixed``: its gauges always say 0), while 8 clients send
requests, each on a new connection (the kernel hashes each onto one worker's socket): every
request sent after the victim is reaped succeeds, and none is held in flow control to its TTL.

The replacement (a follower of worker 0's scrapes) used to hold its first requests to the TTL
and answer 429: they queued while its copy of the upstream's idle row was a moment past
``metricsStaleness``, the next heartbeat made the copy fresh again without waking the queue,
and with every client queued there nothing else changed (docs/benchmarks.md, "A killed
worker"). The TTL is 3 s here, so a hold shows as a 429, not as a slow test. The scrape
interval is 0.15 s (default 0.05 s, below the 0.2 s staleness either way): a follower copies
the rows every half interval, so its copy of an idle row ages closer to the staleness limit
and the race shows in every run on the old code, not only on a loaded machine."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time
from pathlib import Path

import aiohttp
import orjson

from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.store.paths import open_store
from llmplane.testing import Processes, eventually, gateway, upstream_process

TTL = 3.0
CLIENTS = 8
ROUNDS = 3  # a fresh gateway each: the hold showed in about half of such runs
AFTER = 6000  # requests answered after the kill before a round ends (a few seconds)
WARM = 3000  # requests before the kill (about a second: the upstream's row is kept by then)
BODY = orjson.dumps(
    {"model": "fixed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
)


def workers_of(pid: int) -> set[int]:
    return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def per_worker(output: str) -> collections.Counter[int]:
    """Access-log lines per worker index."""
    return collections.Counter(
        orjson.loads(line)["worker"]
        for line in output.splitlines()
        if line.startswith('{"method"') and '"fixed"' in line
    )


async def round_(url: str, gw_pid: int, output, victim_of) -> list[tuple[float, float, int]]:
    """8 looping clients; a worker SIGKILLed once traffic flows; ends when the replacement
    has served. Returns (latency, status) of every request sent after the victim was reaped."""
    done: list[tuple[float, float, int]] = []
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as s:

        async def client() -> None:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    async with s.post(
                        url, data=BODY, headers={"Content-Type": "application/json"}
                    ) as r:
                        await r.read()
                        status = r.status
                except (aiohttp.ClientError, OSError):
                    status = 0  # a request the victim held when killed
                done.append((t0, time.monotonic() - t0, status))

        clients = [asyncio.create_task(client()) for _ in range(CLIENTS)]
        try:
            await eventually(
                lambda: len(done) >= WARM, what=f"{WARM} requests through both workers"
            )
            before = workers_of(gw_pid)
            victim = victim_of(before)
            os.kill(victim, signal.SIGKILL)
            new = await eventually(
                lambda: victim not in (now := workers_of(gw_pid)) and len(now) == 2 and now,
                what="the victim reaped and replaced",
            )
            reaped = time.monotonic()
            served = per_worker(output())
            # Both workers serve again (the replacement on the victim's socket), and the
            # requests a hold would catch have had their TTL.
            await eventually(
                lambda: (
                    sum(1 for t0, _, _ in done if t0 >= reaped) >= AFTER
                    and min((per_worker(output()) - served).values(), default=0) >= 20
                    and len(per_worker(output()) - served) == 2
                ),
                timeout=4 * TTL,
                what=f"{AFTER} requests after the kill, both workers (new: {new - before})",
            )
        finally:
            stop.set()
            await asyncio.gather(*clients)
    return [(lat, status) for t0, lat, status in done if t0 >= reaped]


async def test_a_killed_worker_is_replaced_and_no_request_waits_to_the_ttl(tmp_path):
    with upstream_process("fixed", "--fixed") as fixed, Processes() as group:
        store = open_store(tmp_path / "state")
        store.apply(endpoint_object("fixed", fixed.address, "fixed"))
        store.close()
        config = tmp_path / "gateway.yaml"
        config.write_text(f"gateway:\n  flowControlTtl: {TTL}\n  scrapeInterval: 0.15\n")
        # The later-forked worker (a scrape follower) twice, worker 0 (the scraper) once.
        for victim_of in (max, min, max)[:ROUNDS]:
            (gw,) = group.start(
                gateway(
                    "--workers",
                    "2",
                    "--config",
                    str(config),
                    "--log-level",
                    "WARNING",
                    state_dir=tmp_path / "state",
                )
            )
            try:
                after = await round_(f"{gw.url}/v1/chat/completions", gw.pid, gw.output, victim_of)
            finally:
                gw.stop()
            statuses = collections.Counter(status for _, status in after)
            slowest = max(lat for lat, _ in after)
            assert set(statuses) == {200}, (victim_of.__name__, statuses)
            assert slowest < TTL / 2, (victim_of.__name__, slowest)
