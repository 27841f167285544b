"""The multi-worker gateway: throughput and CPU against vllm-router, and prefix routing quality
with 1 vs N workers.

    python -m bench.workers [--rounds 5] [--duration 4] [--concurrency 8 32] [--workers 1 2]
                            [--modes unary stream stream-nginx] [--stream-max-running 8]
                            [--skip-prefix] [--no-write]

Throughput: ``llmplane gateway --workers N`` for each ``--workers`` value with default
settings otherwise (access log on, to a file; default scheduling profile, scraping on) and
``vllm-router`` 0.1.17 (Rust, round_robin). Non-streaming (``unary``): a chat completion
through each to nginx answering a fixed completion (``bench/nginx_upstream.py``, about 100k
req/s direct: never the bottleneck). Streaming (``stream``): a 64-chunk SSE completion from
``llmplane/testing/upstream.py`` (one Python process: the bottleneck of its cells), which reports
its KV use as running / ``--stream-max-running`` (8: full at 8 streams, so llmplane's
saturation rule holds the rest in flow control, by design; vllm-router reads no metrics).
``stream-nginx``: nginx answering the same request with a fixed 64-event stream in one body
(never the bottleneck). wrk, 2 threads; every round gives each system one cell per (mode,
concurrency), systems in a rotating order; medians over rounds. CPU per request: utime + stime
of each proxy's process tree (supervisor and workers) over the cell / requests; the same for
the upstream and for wrk; "held": the share of llmplane's requests that waited in flow
control.

Prefix routing: 4 sims (``--time-scale 0``, 768 KV blocks of 16 tokens each: a sim holds
about 4 of the 16 shared 3,000-token system prompts, so placement decides hits) behind
``llmplane gateway --workers N``; 16 groups x 12 requests, 4 concurrent, a new connection per
request (the kernel spreads them over the workers); hit rate = the sims' prefix-cache hits /
queries over the cell. Writes section ``workers`` of docs/benchmarks.md and
bench/results/workers.json unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import statistics
import tempfile
import urllib.request
from typing import Any

import aiohttp
import orjson

from bench import workloads as wl
from bench.common import (
    RESULTS,
    free_port,
    launch,
    machine,
    machine_line,
    measured_wrk,
    store_objects,
    table,
    write_section,
    wrk,
)
from bench.nginx_upstream import nginx_proc
from bench.routing import sim_counters
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.gateway.workers.cores import auto_workers
from llmplane.testing import Process, gateway, sim_process, upstream_process

STREAM_TOKENS = 64
UNARY = orjson.dumps(
    {"model": "nginx", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}
)
STREAM = orjson.dumps(
    {"model": "stream", "prompt": "Say hello.", "max_tokens": STREAM_TOKENS, "stream": True}
)
# The same request to nginx, which answers it with a fixed 64-event stream in one body.
STREAM_NGINX = orjson.dumps(
    {"model": "nginx", "prompt": "Say hello.", "max_tokens": STREAM_TOKENS, "stream": True}
)
MODE_NAMES = {
    "unary": "non-streaming (nginx)",
    "stream": "streaming (64 chunks)",
    "stream-nginx": "streaming (nginx, one body)",
}


def flow_waits(url: str) -> float:
    """Requests an llmplane gateway has held in flow control so far (its /metrics)."""
    base = url.split("/v1/", 1)[0]
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llmplane_gateway_flow_wait_seconds_count")
    )


def children_cpu() -> float:
    """CPU seconds of this process's reaped children (wrk, once a cell's run returned)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def vllm_router(upstream: str) -> tuple[Process, str]:
    port = free_port()
    argv = [
        *("vllm-router", "--host", "127.0.0.1", "--port", str(port)),
        *("--worker-urls", f"http://{upstream}", "--policy", "round_robin"),
        *("--prometheus-port", str(free_port()), "--log-level", "warning"),
    ]
    return launch("vllm-router", argv), f"127.0.0.1:{port}"


def throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    procs: list[Process] = []
    state = tempfile.mkdtemp(prefix="bench-workers-")
    nginx, nginx_address, nginx_prefix = nginx_proc()
    procs.append(nginx)
    try:
        stream_up = upstream_process(
            "stream", "--delay", "0", "--max-running", str(args.stream_max_running)
        ).launch()
        procs.append(stream_up)
        stream_address = stream_up.ready()
        store_objects(
            state,
            endpoint_object("nginx", nginx_address, "nginx"),
            endpoint_object("stream", stream_address, "stream"),
        )
        # system -> (pid, {mode: url})
        systems: dict[str, tuple[int, dict[str, str]]] = {}
        for n in args.workers:
            gw = gateway("--workers", str(n), "--log-level", "WARNING", state_dir=state).launch()
            procs.append(gw)
            address = gw.ready(60)
            systems[f"llmplane --workers {n}"] = (
                gw.pid,
                {
                    "unary": f"http://{address}/v1/chat/completions",
                    "stream": f"http://{address}/v1/completions",
                    "stream-nginx": f"http://{address}/v1/completions",
                },
            )
        if shutil.which("vllm-router"):
            router_unary, a_unary = vllm_router(nginx_address)
            router_stream, a_stream = vllm_router(stream_address)
            procs += [router_unary, router_stream]
            systems["vllm-router"] = (
                router_unary.pid,
                {
                    "unary": f"http://{a_unary}/v1/chat/completions",
                    "stream": f"http://{a_stream}/v1/completions",
                    "stream-nginx": f"http://{a_unary}/v1/completions",
                },
            )
            router_stream_pid = router_stream.pid
            router_stream.wait_http(systems["vllm-router"][1]["stream"], STREAM, timeout=60)
            router_unary.wait_http(systems["vllm-router"][1]["unary"], UNARY, timeout=60)
        else:
            print("vllm-router not installed: llmplane only")
        payloads = {"unary": UNARY, "stream": STREAM, "stream-nginx": STREAM_NGINX}
        upstream_pids = {"unary": nginx.pid, "stream": stream_up.pid, "stream-nginx": nginx.pid}
        names = list(systems)
        for name in names:  # warm up: connections, caches
            for mode in args.modes:
                wrk(systems[name][1][mode], payloads[mode], 8, 1)
        cells: list[dict[str, Any]] = []
        for r in range(args.rounds):
            for mode in args.modes:
                for c in args.concurrency:
                    turn = (r + c) % len(names)
                    for name in names[turn:] + names[:turn]:
                        pid, urls = systems[name]
                        if name == "vllm-router" and mode == "stream":
                            pid = router_stream_pid
                        ours = name != "vllm-router"
                        held = flow_waits(urls[mode]) if ours else 0.0
                        client = children_cpu()
                        cell = measured_wrk(
                            urls[mode], payloads[mode], c, args.duration, [pid, upstream_pids[mode]]
                        )
                        n = cell["requests"] or float("nan")
                        # Per request: the proxy's CPU, the upstream's and wrk's (the client).
                        cell["cpu_per_1k"], cell["upstream_cpu_per_1k"] = cell["cpu_split_per_1k"]
                        cell["client_cpu_per_1k"] = (children_cpu() - client) * 1000 / n
                        cell["held"] = (flow_waits(urls[mode]) - held) if ours else 0.0
                        cell.update(system=name, mode=mode, c=c, round=r)
                        cells.append(cell)
                        print(
                            f"round {r + 1} {mode:6s} c={c:<3d} {name:22s} {cell['rps']:8.0f} "
                            f"req/s cpu {cell['cpu_per_1k'] * 1000:6.0f} us/req "
                            f"upstream {cell['upstream_cpu_per_1k'] * 1000:6.0f} "
                            f"wrk {cell['client_cpu_per_1k'] * 1000:6.0f} "
                            f"held {cell['held']:.0f} errors {cell['errors']}",
                            flush=True,
                        )
        return cells
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(nginx_prefix, ignore_errors=True)


# --- prefix routing -------------------------------------------------------------------------------


async def _prefix_cell(url: str, sims: list[str], workers: int, salt: str) -> dict[str, Any]:
    rng = random.Random(7)
    requests = wl.shared_prefix(
        rng,
        groups=16,
        per_group=12,
        system_tokens=3000,
        question_tokens=64,
        output_tokens=4,
        salt=salt,
    )
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        before = await sim_counters(session, sims)
        queue = list(requests)
        errors = 0

        async def client() -> None:
            nonlocal errors
            while queue:
                req = queue.pop()
                body = req.body("prefix", stream=False)
                async with session.post(url, json=body) as resp:
                    await resp.read()
                    errors += resp.status != 200

        await asyncio.gather(*(client() for _ in range(4)))
        after = await sim_counters(session, sims)
    hits = sum(
        a["vllm:prefix_cache_hits"] - b["vllm:prefix_cache_hits"]
        for a, b in zip(after, before, strict=True)
    )
    queries = sum(
        a["vllm:prefix_cache_queries"] - b["vllm:prefix_cache_queries"]
        for a, b in zip(after, before, strict=True)
    )
    return {
        "workers": workers,
        "requests": len(requests),
        "errors": errors,
        "hit_rate": hits / queries if queries else float("nan"),
    }


def prefix(args: argparse.Namespace) -> list[dict[str, Any]]:
    procs: list[Process] = []
    state = tempfile.mkdtemp(prefix="bench-workers-prefix-")
    try:
        sims = [
            sim_process("prefix", "--time-scale", "0", "--num-blocks", "768").launch()
            for _ in range(4)
        ]
        procs += sims
        addresses = [s.ready(60) for s in sims]
        store_objects(
            state, *(endpoint_object(f"s{i}", a, "prefix") for i, a in enumerate(addresses))
        )
        out = []
        for r in range(args.prefix_rounds):
            for n in args.workers:
                gw = gateway(
                    "--workers",
                    str(n),
                    "--log-level",
                    "WARNING",
                    "--no-access-log",
                    state_dir=state,
                ).launch()
                procs.append(gw)
                url = f"http://{gw.ready(60)}/v1/chat/completions"
                cell = asyncio.run(_prefix_cell(url, addresses, n, f"r{r}w{n}"))
                gw.stop()
                cell["round"] = r
                out.append(cell)
                print(
                    f"prefix round {r + 1} workers {n}: hit rate {cell['hit_rate']:.3f} "
                    f"errors {cell['errors']}",
                    flush=True,
                )
        return out
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(state, ignore_errors=True)


# --- report ----------------------------------------------------------------------------------------


def report(res: dict[str, Any]) -> str:
    a = res["args"]
    lines = [
        f"Command: `python -m bench.workers --rounds {a['rounds']} --duration {a['duration']:g} "
        f"--concurrency {' '.join(map(str, a['concurrency']))} "
        f"--workers {' '.join(map(str, a['workers']))} --modes {' '.join(a['modes'])} "
        f"--stream-max-running {a.get('stream_max_running', 8)}`; "
        + machine_line(res["machine"], res["load_after"])
        + f". `llmplane gateway`'s default, `--workers auto`, is {res.get('auto_workers', 1)} here.",
        "",
    ]
    cells = res["cells"]
    if cells:
        names = list(dict.fromkeys(c["system"] for c in cells))
        rows = []
        for mode in a["modes"]:
            for conc in a["concurrency"]:
                base = None
                for name in names:
                    mine = [
                        x
                        for x in cells
                        if x["system"] == name and x["mode"] == mode and x["c"] == conc
                    ]
                    if not mine:
                        continue
                    rps = statistics.median(x["rps"] for x in mine)
                    if name == "vllm-router":
                        base = rps

                    def med(key: str, cells: list[dict[str, Any]] = mine) -> float:
                        return statistics.median(x.get(key, float("nan")) for x in cells)

                    rows.append(
                        [
                            MODE_NAMES[mode],
                            conc,
                            name,
                            f"{rps:,.0f}",
                            f"{med('cpu_per_1k') * 1000:,.0f}",
                            f"{med('upstream_cpu_per_1k') * 1000:,.0f}",
                            f"{med('client_cpu_per_1k') * 1000:,.0f}",
                            f"{med('p50'):.2f}",
                            f"{med('p99'):.2f}",
                            "-"  # no flow control
                            if name == "vllm-router"
                            else f"{sum(x.get('held', 0) for x in mine) / sum(x['requests'] for x in mine):.1%}",
                            sum(x["errors"] for x in mine),
                            rps,
                        ]
                    )
                for row in rows:
                    if row[0] == MODE_NAMES[mode] and row[1] == conc and isinstance(row[-1], float):
                        row[-1] = f"{row[-1] / base:.2f}x" if base else ""
        lines.append(
            table(
                [
                    "mode",
                    "c",
                    "system",
                    "req/s",
                    "CPU us / req",
                    "upstream CPU us / req",
                    "wrk CPU us / req",
                    "p50 ms",
                    "p99 ms",
                    "held in flow control",
                    "errors",
                    "vs vllm-router",
                ],
                rows,
                "llrrrrrrrrrr",
            )
        )
        lines.append("")
    if res["prefix"]:
        rows = []
        for n in a["workers"]:
            mine = [x for x in res["prefix"] if x["workers"] == n]
            rates = [x["hit_rate"] for x in mine]
            rows.append(
                [
                    n,
                    len(mine),
                    f"{statistics.median(rates):.3f}",
                    " / ".join(f"{x:.3f}" for x in rates),
                    sum(x["errors"] for x in mine),
                ]
            )
        lines.append(
            table(
                [
                    "gateway workers",
                    "cells",
                    "prefix-cache hit rate (median)",
                    "per cell",
                    "errors",
                ],
                rows,
                "rrrll",
            )
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    p.add_argument("--modes", nargs="+", default=["unary", "stream"], choices=list(MODE_NAMES))
    p.add_argument(
        "--stream-max-running",
        type=int,
        default=8,
        help="the streaming upstream's reported capacity: its KV use is running / this",
    )
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--prefix-rounds", type=int, default=3)
    p.add_argument("--skip-prefix", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    info = machine()
    cells = [] if args.skip_throughput else throughput(args)
    prefix_cells = [] if args.skip_prefix else prefix(args)
    res = {
        "machine": info,
        "load_after": os.getloadavg(),
        "args": vars(args),
        "cells": cells,
        "prefix": prefix_cells,
        "auto_workers": auto_workers(),
    }
    text = report(res)
    print(text)
    if args.no_write:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "workers.json").write_text(json.dumps(res, indent=1))
    print(f"wrote {write_section('workers', text)}")


if __name__ == "__main__":
    main()
