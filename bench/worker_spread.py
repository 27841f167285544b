"""How evenly ``llmplane gateway --workers N`` spreads one client's keep-alive connections over
its workers, before/after (a git ref against this tree).

    python -m bench.worker_spread [--baseline REF] [--runs 5] [--concurrency 8 32]
                                  [--workers 2] [--duration 2] [--kills 0]

Each run starts a fresh gateway of each build (the first burst of connections is what a
listening-socket design places) in front of nginx answering a fixed completion
(``bench/nginx_upstream.py``), then one wrk cell of c connections, opened at once as wrk
does. Mid-cell: the established connections each worker process holds on the gateway's port
(``llmplane.testing.sockets.established``); after it: each worker's requests (the access
log's ``worker``). Prints one line per run and a table of the spreads.

``--kills K``: K times per build, a fresh gateway under 8 clients each sending requests on a
new connection, one after another; a worker is SIGKILLed 1 s in. Reported: requests that
failed (refused, reset, non-200), the slowest request started after the kill (with
``SO_REUSEPORT`` a connection hashed to the dead worker's socket waits in its backlog for the
replacement) and the time from the kill to the replacement's first request in the access log.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.common import (
    ROOT,
    checkout,
    gateway_proc,
    remove_checkout,
    store_objects,
    table,
    wrk,
)
from bench.nginx_upstream import nginx_proc
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.testing.sockets import established

BODY = orjson.dumps(
    {"model": "nginx", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}
)


def workers_of(pid: int) -> list[int]:
    return sorted(int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())


def one_run(
    tree: Path, state: str, workers: int, c: int, duration: float, name: str
) -> dict[str, Any]:
    gw = gateway_proc(state, name=name, tree=tree, access_log=True, workers=workers)
    try:
        address = gw.ready(60)
        port = int(address.rsplit(":", 1)[1])
        pids = workers_of(gw.pid)
        url = f"http://{address}/v1/chat/completions"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            cell = pool.submit(wrk, url, BODY, c, duration)
            time.sleep(duration / 2)  # mid-cell: every connection is open (a sample point)
            held = established(pids)
            result = cell.result()
        conns = sorted(
            (sum(1 for local, _ in held[pid].values() if local == port) for pid in pids),
            reverse=True,
        )
        lines = [
            orjson.loads(line)
            for line in gw.output().splitlines()
            if line.startswith('{"method"') and '"nginx"' in line
        ]
        per_worker = collections.Counter(x["worker"] for x in lines)
        requests = sorted((per_worker.get(i, 0) for i in range(workers)), reverse=True)
        return {"conns": conns, "requests": requests, "rps": result["rps"]}
    finally:
        gw.stop()


JSON = {"Content-Type": "application/json"}


async def _kill_cell(gw_pid: int, address: str) -> dict[str, Any]:
    """8 clients, a new connection per request; SIGKILL a worker 1 s in; stop 2 s after its
    replacement first holds a client connection."""
    url = f"http://{address}/v1/chat/completions"
    port = int(address.rsplit(":", 1)[1])
    before = set(workers_of(gw_pid))
    victim = max(before)
    done: list[tuple[float, float, str]] = []  # (start, latency, outcome)
    stop = False
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            while not stop:
                t0 = time.monotonic()
                try:
                    async with session.post(url, data=BODY, headers=JSON) as resp:
                        await resp.read()
                        outcome = str(resp.status)
                except (aiohttp.ClientError, OSError) as e:
                    outcome = type(e).__name__
                done.append((t0, time.monotonic() - t0, outcome))

        clients = [asyncio.ensure_future(client()) for _ in range(8)]
        await asyncio.sleep(1.0)
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        replaced_after = None
        deadline = killed + 30
        while time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            if replaced_after is None:
                new = set(workers_of(gw_pid)) - before
                held = established(new)
                if any(local == port for conns in held.values() for local, _ in conns.values()):
                    replaced_after = time.monotonic() - killed
                    deadline = time.monotonic() + 2.0
        stop = True
        await asyncio.gather(*clients)
    pre = sorted(lat for t0, lat, _ in done if t0 < killed)
    after = [(lat, out) for t0, lat, out in done if t0 >= killed]
    failed = [out for _, out in after if out != "200"]
    return {
        "requests_after_kill": len(after),
        "failed": len(failed),
        "failures": sorted(set(failed)),
        "max_latency": max(lat for lat, _ in after) if after else float("nan"),
        "slow": sum(1 for lat, _ in after if lat > 0.05),
        "replaced_after": replaced_after,
        "before_max": pre[-1] if pre else float("nan"),
    }


def kill_run(tree: Path, state: str, workers: int, name: str) -> dict[str, Any]:
    gw = gateway_proc(state, name=name, tree=tree, access_log=False, workers=workers)
    try:
        return asyncio.run(_kill_cell(gw.pid, gw.ready(60)))
    finally:
        gw.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", help="git ref to compare against (default: this tree only)")
    p.add_argument(
        "--baseline-tree", type=Path, help="instead of --baseline: a checkout already built"
    )
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--kills", type=int, default=0)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-spread-"))
    builds: dict[str, Path] = {}
    if args.baseline_tree:
        builds["baseline"] = args.baseline_tree
    elif args.baseline:
        builds["baseline"] = checkout(args.baseline, work / "baseline")
    builds["candidate"] = ROOT
    nginx, nginx_address, nginx_prefix = nginx_proc()
    state = str(work / "state")
    rows: dict[tuple[str, int], list[dict[str, Any]]] = collections.defaultdict(list)
    try:
        store_objects(state, endpoint_object("nginx", nginx_address, "nginx"))
        for k in range(args.kills):
            for name in list(builds) if k % 2 == 0 else list(reversed(builds)):
                kr = kill_run(builds[name], state, args.workers, name)
                print(
                    f"kill {k + 1} {name:9s} replaced after {kr['replaced_after'] or 0:.3f} s; "
                    f"after the kill {kr['requests_after_kill']} requests, {kr['failed']} failed "
                    f"{kr['failures']}, {kr['slow']} over 50 ms, slowest "
                    f"{kr['max_latency'] * 1000:.0f} ms (before the kill: slowest "
                    f"{kr['before_max'] * 1000:.0f} ms)",
                    flush=True,
                )
        for r in range(args.runs):
            for c in args.concurrency:
                order = list(builds) if (r + c) % 2 == 0 else list(reversed(builds))
                for name in order:
                    run = one_run(builds[name], state, args.workers, c, args.duration, name)
                    rows[(name, c)].append(run)
                    print(
                        f"run {r + 1} c={c:<3d} {name:9s} connections {run['conns']} "
                        f"requests {run['requests']} {run['rps']:.0f} req/s",
                        flush=True,
                    )
        out = []
        for (name, c), runs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            spreads = " ".join("/".join(map(str, run["conns"])) for run in runs)
            shares = [run["requests"][0] / max(1, sum(run["requests"])) for run in runs]
            even = sum(1 for run in runs if max(run["conns"]) - min(run["conns"]) <= c // 4)
            out.append([name, c, spreads, f"{max(shares):.2f}", f"{even}/{len(runs)}"])
        print(
            table(
                [
                    "build",
                    "c",
                    "connections per worker, each run",
                    "busiest worker's request share (max)",
                    "runs within c/4",
                ],
                out,
                "lrlrr",
            )
        )
    finally:
        nginx.stop()
        if "baseline" in builds and not args.baseline_tree:
            remove_checkout(builds["baseline"])
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(nginx_prefix, ignore_errors=True)


if __name__ == "__main__":
    main()
