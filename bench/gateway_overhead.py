"""Gateway overhead: a minimal upstream direct vs through the gateway, same load generator.

    python -m bench.gateway_overhead [--duration 5] [--concurrency 1 8 32 128] [--write]

The upstream (``llmplane/testing/upstream.py --fixed``) returns one fixed small completion JSON.
The gateway runs as its own process (``python -m llmplane.gateway.cli``) with the upstream
registered as an external ``Endpoint``; the load generator is ``wrk`` (a separate process;
``apt-get install -y wrk``), or an aiohttp client pool in another process when wrk is missing.
Reported: req/s, p50/p99 latency, and the latency the gateway adds (gateway minus direct).

Then the scheduler alone: the default profile picking among 64 endpoints for a 16k-character
prompt (prefix hashing included), timed around the pick function.

``--write`` puts the tables into docs/benchmarks.md (section gateway-overhead); the fuller
comparison with other proxies is ``python -m bench.overhead``.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

from bench.common import gateway_proc, store_objects, upstream_proc

BODY = orjson.dumps({"model": "bench", "prompt": "Say hello.", "max_tokens": 1})


def _wrk(url: str, concurrency: int, duration: float) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(
            'wrk.method = "POST"\n'
            f"wrk.body = '{BODY.decode()}'\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
    try:
        out = subprocess.run(
            [
                "wrk",
                f"-t{min(concurrency, 2)}",
                f"-c{concurrency}",
                f"-d{max(1, round(duration))}s",
                "--latency",
                "-s",
                script.name,
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(script.name)

    def ms(text: str) -> float:
        value, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = ms(re.search(r"\s50%\s+(\S+)", out).group(1))
    p99 = ms(re.search(r"\s99%\s+(\S+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50": p50, "p99": p99, "errors": float(errors.group(1)) if errors else 0.0}


_CLIENT = r"""
import asyncio, sys, time, aiohttp
url, conc, dur, body = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4].encode()
async def main():
    lat, errors = [], 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as s:
        end = time.perf_counter() + dur
        async def worker():
            nonlocal errors
            while time.perf_counter() < end:
                t = time.perf_counter()
                async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    errors += r.status != 200
                lat.append(time.perf_counter() - t)
        await asyncio.gather(*(worker() for _ in range(conc)))
    lat.sort()
    print(len(lat) / dur, lat[len(lat) // 2] * 1000, lat[int(len(lat) * 0.99)] * 1000, errors)
asyncio.run(main())
"""


def _pool(url: str, concurrency: int, duration: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CLIENT, url, str(concurrency), str(duration), BODY.decode()],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    rps, p50, p99, errors = map(float, out)
    return {"rps": rps, "p50": p50, "p99": p99, "errors": errors}


def load(url: str, concurrency: int, duration: float) -> dict[str, float]:
    if shutil.which("wrk"):
        return _wrk(url, concurrency, duration)
    return _pool(url, concurrency, duration)


def proxy_benchmark(concurrencies: list[int], duration: float) -> list[dict[str, float]]:
    from llmplane.gateway.discovery.store_endpoints import endpoint_object

    state_dir = tempfile.mkdtemp(prefix="llmplane-bench-")
    upstream = upstream_proc("--fixed")
    gateway = None
    try:
        address = upstream.ready()
        store_objects(state_dir, endpoint_object("bench", address, "bench", engine="vllm"))
        gateway = gateway_proc(state_dir)
        direct_url = f"http://{address}/v1/completions"
        gateway_url = f"http://{gateway.ready()}/v1/completions"
        load(gateway_url, 8, 1.0)  # warm up both (connections, caches)
        rows = []
        for c in concurrencies:
            direct = load(direct_url, c, duration)
            through = load(gateway_url, c, duration)
            rows.append(
                {
                    "c": c,
                    **{f"d_{k}": v for k, v in direct.items()},
                    **{f"g_{k}": v for k, v in through.items()},
                }
            )
            print(
                f"c={c:4d}  direct {direct['rps']:8.0f} req/s p50 {direct['p50']:.2f} ms p99 {direct['p99']:.2f} ms"
                f" | gateway {through['rps']:8.0f} req/s p50 {through['p50']:.2f} ms p99 {through['p99']:.2f} ms"
                f" | added p50 {through['p50'] - direct['p50']:+.2f} ms p99 {through['p99'] - direct['p99']:+.2f} ms"
                f" errors {int(through['errors'])}",
                flush=True,
            )
        return rows
    finally:
        if gateway is not None:
            gateway.stop()
        upstream.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


def scheduling_benchmark() -> dict[str, float]:
    """The default profile over 64 endpoints with a 16k prompt (bench/scheduling.py's cell)."""
    from bench.scheduling import cell

    c = cell(64, 16_000, 3000, None)
    return {"p50": c["pick_p50"], "p99": c["pick_p99"], "p99.9": c["pick_p99.9"]}


def write_doc(rows: list[dict[str, float]], sched: dict[str, float], duration: float) -> Path:
    tool = "wrk" if shutil.which("wrk") else "an aiohttp client pool (wrk not installed)"
    lines = [
        f"`python -m bench.gateway_overhead --duration {duration:g} --write` on {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()}), Python {platform.python_version()}. Upstream: "
        "`llmplane/testing/upstream.py --fixed` (aiohttp, one fixed small completion JSON). Gateway: "
        "`python -m llmplane.gateway.cli` in its own process (uvloop, default scheduling profile, "
        f"metrics scraping on, access log off). Load generator: {tool}, in its own process. "
        "Upstream, gateway and load generator share the same cores, so the figures include their "
        "contention.",
        "",
        "| concurrency | direct req/s | direct p50 ms | direct p99 ms | gateway req/s | gateway p50 ms | gateway p99 ms | added p50 ms | added p99 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['c']} | {r['d_rps']:.0f} | {r['d_p50']:.2f} | {r['d_p99']:.2f} | {r['g_rps']:.0f} | "
            f"{r['g_p50']:.2f} | {r['g_p99']:.2f} | {r['g_p50'] - r['d_p50']:+.2f} | {r['g_p99'] - r['d_p99']:+.2f} |"
        )
    lines += [
        "",
        "**Scheduling** (`python -m bench.gateway_overhead --skip-proxy --write`): the default profile (model-served filter; queue x2, kv-cache x2, prefix-cache x3, "
        "least-request x1; max-score picker) over 64 endpoints with fresh metrics, a "
        "16,000-character chat prompt whose first 12,000 characters are one of 32 cached system "
        "prompts; prompt extraction, prefix hashing (250 blocks) and the index update are "
        "included. Timed around the pick function.",
        "",
        "| p50 ms | p99 ms | p99.9 ms |",
        "|---:|---:|---:|",
        f"| {sched['p50']:.3f} | {sched['p99']:.3f} | {sched['p99.9']:.3f} |",
        "",
    ]
    from bench.common import write_section

    return write_section("gateway-overhead", "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per load run")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32, 128])
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    parser.add_argument("--skip-proxy", action="store_true")
    args = parser.parse_args()
    sched = scheduling_benchmark()
    print(
        f"scheduling (64 endpoints, 16k prompt): p50 {sched['p50']:.3f} ms p99 {sched['p99']:.3f} ms",
        flush=True,
    )
    rows = [] if args.skip_proxy else proxy_benchmark(args.concurrency, args.duration)
    if args.write:
        print(f"wrote {write_doc(rows, sched, args.duration)}")


if __name__ == "__main__":
    main()
