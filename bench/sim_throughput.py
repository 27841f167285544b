"""Throughput of one simulated model server with ``--time-scale 0``.

    python -m bench.sim_throughput [--duration 5] [--concurrency 64] [--streams 256]

Starts one sim process (127.0.0.1, port 0) and, in a separate process, an aiohttp load
generator with a bounded number of requests and a time limit:

1. short non-streaming completions (8-token prompt, 8 output tokens) at a fixed concurrency;
2. 256 concurrent streaming chat completions (128 output tokens each), counting streams
   that really were open at once (client side) and running sequences (server side).

Prints the figures and writes them to docs/benchmarks.md (section sim-throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(p / 100 * len(v)))]


# -- load generator (runs in its own process) ---------------------------------------------
async def run_short(url: str, concurrency: int, duration: float, limit: int) -> dict:
    import aiohttp

    body = json.dumps(
        {"model": "sim", "prompt": "Say hello to the benchmark now!!", "max_tokens": 8,
         "ignore_eos": True}
    ).encode()  # fmt: skip
    headers = {"Content-Type": "application/json"}
    lat: list[float] = []
    errors = 0
    sent = 0
    stop_at = time.perf_counter() + duration
    conn = aiohttp.TCPConnector(limit=concurrency)

    async with aiohttp.ClientSession(connector=conn) as s:

        async def worker() -> None:
            nonlocal errors, sent
            while sent < limit and time.perf_counter() < stop_at:
                sent += 1
                t0 = time.perf_counter()
                try:
                    async with s.post(f"{url}/v1/completions", data=body, headers=headers) as r:
                        await r.read()
                        if r.status != 200:
                            errors += 1
                            continue
                except aiohttp.ClientError:
                    errors += 1
                    continue
                lat.append(time.perf_counter() - t0)

        # warm-up: open the connections
        t_start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t_start
    return {
        "requests": len(lat),
        "errors": errors,
        "seconds": elapsed,
        "rps": len(lat) / elapsed,
        "p50_ms": pct(lat, 50) * 1000,
        "p99_ms": pct(lat, 99) * 1000,
    }


async def run_streams(url: str, streams: int, duration: float, tokens: int) -> dict:
    import aiohttp

    body = json.dumps(
        {"model": "sim", "messages": [{"role": "user", "content": "stream please"}],
         "max_tokens": tokens, "ignore_eos": True, "stream": True,
         "stream_options": {"include_usage": True}}
    ).encode()  # fmt: skip
    headers = {"Content-Type": "application/json"}
    ttft: list[float] = []
    done = 0
    errors = 0
    chunks = 0
    open_now = 0
    peak_open = 0
    peak_running = 0.0
    stop_at = time.perf_counter() + duration
    conn = aiohttp.TCPConnector(limit=streams + 4)

    async with aiohttp.ClientSession(connector=conn) as s:

        async def one() -> None:
            nonlocal done, errors, chunks, open_now, peak_open
            t0 = time.perf_counter()
            first = True
            try:
                async with s.post(f"{url}/v1/chat/completions", data=body, headers=headers) as r:
                    if r.status != 200:
                        errors += 1
                        return
                    open_now += 1
                    peak_open = max(peak_open, open_now)
                    try:
                        async for line in r.content:
                            if line.startswith(b"data: {"):
                                chunks += 1
                                if first:
                                    ttft.append(time.perf_counter() - t0)
                                    first = False
                    finally:
                        open_now -= 1
                done += 1
            except aiohttp.ClientError:
                errors += 1

        async def stream_worker() -> None:
            # `streams` workers, each opening a new stream when its previous one ends.
            while time.perf_counter() < stop_at:
                await one()

        async def watch() -> None:
            nonlocal peak_running
            while True:
                try:
                    async with s.get(f"{url}/metrics") as r:
                        for line in (await r.text()).splitlines():
                            if line.startswith("vllm:num_requests_running{"):
                                peak_running = max(peak_running, float(line.rsplit(" ", 1)[1]))
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)

        t_start = time.perf_counter()
        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(stream_worker() for _ in range(streams)))
        elapsed = time.perf_counter() - t_start
        watcher.cancel()
    return {
        "streams_completed": done,
        "errors": errors,
        "seconds": elapsed,
        "peak_open_streams": peak_open,
        "peak_running_server": peak_running,
        "chunks_per_s": chunks / elapsed,
        "ttft_p50_ms": pct(ttft, 50) * 1000,
        "ttft_p99_ms": pct(ttft, 99) * 1000,
    }


def client_main(args: argparse.Namespace) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if args.client == "short":
        out = asyncio.run(run_short(args.url, args.concurrency, args.duration, args.limit))
    else:
        out = asyncio.run(run_streams(args.url, args.streams, args.duration, args.tokens))
    print(json.dumps(out))


# -- driver -------------------------------------------------------------------------------
def run_client(url: str, mode: str, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable, "-m", "bench.sim_throughput", "--client", mode, "--url", url,
        "--duration", str(args.duration), "--concurrency", str(args.concurrency),
        "--streams", str(args.streams), "--limit", str(args.limit), "--tokens", str(args.tokens),
    ]  # fmt: skip
    out = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.duration + 120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_report(short: dict, streams: dict, args: argparse.Namespace) -> str:
    cpu = platform.processor() or platform.machine()
    lines = [
        "`python -m bench.sim_throughput` : one `llmplane sim` process with `--time-scale 0`",
        "(no modelled latency; the engine loop still steps the batch, keeps the KV cache and",
        "the metrics), loaded by an aiohttp client in a separate process, both on 127.0.0.1.",
        f"Machine: {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}; "
        f"load average {args.loadavg:.2f} before the run (other work shares the machine).",
        "",
        "| scenario | figure |",
        "| --- | --- |",
        f"| short non-streaming completions (8 in / 8 out tokens), concurrency "
        f"{args.concurrency} | **{short['rps']:,.0f} req/s** "
        f"(p50 {short['p50_ms']:.1f} ms, p99 {short['p99_ms']:.1f} ms, "
        f"{short['requests']:,} requests, {short['errors']} errors) |",
        f"| streaming chat, {args.streams} concurrent streams x {args.tokens} tokens | "
        f"**{streams['peak_open_streams']} streams open at once** "
        f"(server peak running {streams['peak_running_server']:.0f}), "
        f"{streams['streams_completed']:,} streams completed, {streams['errors']} errors, "
        f"{streams['chunks_per_s']:,.0f} chunks/s, TTFT p50 {streams['ttft_p50_ms']:.0f} ms "
        f"p99 {streams['ttft_p99_ms']:.0f} ms |",
        "",
        "The load generator shares the machine's CPUs with the server, so these figures are",
        "a floor for the server alone.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=5.0, help="seconds per scenario")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--tokens", type=int, default=128, help="output tokens per stream")
    p.add_argument("--limit", type=int, default=200_000, help="max requests (short scenario)")
    p.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    p.add_argument("--client", choices=["short", "streams"], help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--sim-arg", action="append", default=[], help="extra sim argument")
    args = p.parse_args(argv)
    if args.client:
        client_main(args)
        return 0

    args.loadavg = os.getloadavg()[0]
    sys.path.insert(0, str(ROOT))
    from llmplane.testing import sim_process

    with sim_process("sim", "--time-scale", "0", *args.sim_arg) as sim:
        short = run_client(sim.url, "short", args)
        print(
            f"short non-streaming: {short['rps']:,.0f} req/s  p50 {short['p50_ms']:.1f} ms  "
            f"p99 {short['p99_ms']:.1f} ms  ({short['requests']:,} ok, {short['errors']} errors)"
        )
        streams = run_client(sim.url, "streams", args)
        print(
            f"streams: peak {streams['peak_open_streams']} open (server running peak "
            f"{streams['peak_running_server']:.0f}), {streams['streams_completed']:,} completed, "
            f"{streams['errors']} errors, {streams['chunks_per_s']:,.0f} chunks/s, "
            f"TTFT p50 {streams['ttft_p50_ms']:.0f} ms p99 {streams['ttft_p99_ms']:.0f} ms"
        )
    if not args.no_write:
        from bench.common import write_section

        out = write_section("sim-throughput", write_report(short, streams, args))
        print(f"wrote {out.relative_to(ROOT)} (section sim-throughput)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
