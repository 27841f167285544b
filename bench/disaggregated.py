"""Prefill/decode disaggregation on sim replicas: 2 prefill + 4 decode vs 6 undisaggregated.

    python -m bench.disaggregated [--rounds 2] [--rate 4] [--duration 60]
                                  [--prompt-tokens 3000] [--output-tokens 128] [--seed 1]

Two ``llmplane up`` serve the same model on sim replicas (the sim's default latency model: an
8B model on an H100), side by side in one run:

- ``6 replicas``: one Playground of 6 replicas, each prefilling and decoding (a long prefill
  stalls the decodes batched with it: chunked prefill shares each step);
- ``2P + 4D``: the same Playground with ``spec.llmplane.disaggregation``: 2 prefill and 4
  decode replicas, the gateway serving each request on a pair (the sim's simulated KV
  transfer, ``--kv-transfer-*``).

Each round replays one seeded Poisson trace of long-prompt requests (``--prompt-tokens`` of
distinct text each, ``--output-tokens`` answered, streamed) against each fleet in turn, in
rotating order; round ``r`` uses seed ``--seed + r`` for both, so no fleet sees a prompt twice.
At the client: TTFT (time to the first streamed token) and TPOT (time per output token after
the first, per request). Written: bench/results/disaggregated.json and the ``disaggregated``
section of docs/benchmarks.md. Run it on a quiet machine: timings under load mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from bench.common import ROOT, machine, machine_line, percentile, table, write_section
from bench.workloads import text
from llmplane.testing import Processes, Up, wait_for
from llmplane.testing.fleets import sim_fleet

RESULTS = ROOT / "bench" / "results"
MODEL = "llama3-8b-pd"
ROLES = {"kvConnector": {"type": "nixl"}, "prefill": {"replicas": 2}, "decode": {"replicas": 4}}


@dataclass
class Run:
    name: str
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def configs() -> list[tuple[str, str, int]]:
    """(name, YAML, engines it runs)."""
    plain = sim_fleet(MODEL, 6, time_scale="1")
    split = sim_fleet(MODEL, 6, time_scale="1", disaggregation=ROLES)
    return [("6 replicas", plain, 6), ("2P + 4D", split, 6)]


async def one(session: aiohttp.ClientSession, url: str, run: Run, body: dict) -> None:
    start = time.monotonic()
    stamps: list[float] = []
    try:
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            if resp.status != 200:
                run.failed.append(f"{resp.status} {(await resp.text())[:200]}")
                return
            async for line in resp.content:
                if line.startswith(b"data: {") and b'"text"' in line:
                    stamps.append(time.monotonic())
    except (aiohttp.ClientError, TimeoutError) as err:
        run.failed.append(repr(err))
        return
    if len(stamps) < 2:
        run.failed.append(f"{len(stamps)} tokens streamed")
        return
    run.ttft.append(stamps[0] - start)
    run.tpot.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))


async def replay(up: Up, run: Run, args: argparse.Namespace, seed: int) -> None:
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        t0, at, tasks, i = time.monotonic(), 0.0, [], 0
        while True:
            at += rng.expovariate(args.rate)
            if at > args.duration:
                break
            body = {
                "model": MODEL,
                "prompt": f"request {i}: " + text(rng, args.prompt_tokens),
                "max_tokens": args.output_tokens,
                "ignore_eos": True,
                "stream": True,
            }
            delay = t0 + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, up.url, run, body)))
            i += 1
        await asyncio.gather(*tasks)


def start(group: Processes, work: Path, name: str, yaml: str, engines: int) -> Up:
    """``llmplane up`` serving one fleet, its engines started and a request answered."""
    slug = name.replace(" ", "").replace("+", "-")
    path = work / f"{slug}.yaml"
    path.write_text(yaml)
    up = group.up(work / slug, str(path))
    wait_for(lambda: len(up.engine_pids()) == engines, 120, what=f"{name}: {engines} engines")
    wait_for(lambda: _serves(up), 60, what=f"{name}: serving")
    return up


def measure(args: argparse.Namespace) -> tuple[list[Run], list[float]]:
    """Every fleet up at once, then ``args.rounds`` rounds of the trace, each fleet in turn
    (rotating order); the runs and the load average at the end."""
    fleets = configs()
    runs = [Run(name) for name, _, _ in fleets]
    with tempfile.TemporaryDirectory() as tmp, Processes() as group:
        ups = [start(group, Path(tmp), name, yaml, n) for name, yaml, n in fleets]
        for r in range(args.rounds):
            for i in range(len(fleets)):
                k = (i + r) % len(fleets)
                print(f"round {r + 1}/{args.rounds}: {runs[k].name}", flush=True)
                asyncio.run(replay(ups[k], runs[k], args, args.seed + r))
        load_after = list(os.getloadavg())
    return runs, load_after


def _serves(up: Up) -> bool:
    import urllib.request

    body = orjson.dumps({"model": MODEL, "prompt": "warm up", "max_tokens": 2})
    request = urllib.request.Request(
        f"{up.url}/v1/completions", data=body, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status == 200
    except OSError:
        return False


def report(runs: list[Run], args: argparse.Namespace, info: dict, load_after: list[float]) -> str:
    rows = []
    for run in runs:
        rows.append(
            [
                run.name,
                len(run.ttft),
                len(run.failed),
                f"{percentile(run.ttft, 50) * 1000:.0f}",
                f"{percentile(run.ttft, 99) * 1000:.0f}",
                f"{percentile(run.tpot, 50) * 1000:.1f}",
                f"{percentile(run.tpot, 99) * 1000:.1f}",
            ]
        )
    head = [
        "fleet",
        "requests",
        "failed",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TPOT p50 ms",
        "TPOT p99 ms",
    ]
    return (
        f"Command: `python -m bench.disaggregated --rounds {args.rounds} --rate {args.rate} "
        f"--duration {args.duration:g} --prompt-tokens {args.prompt_tokens} "
        f"--output-tokens {args.output_tokens} --seed {args.seed}` "
        f"({machine_line(info, load_after)}). Per round one Poisson trace of "
        f"{args.prompt_tokens}-token prompts and {args.output_tokens}-token streamed answers, "
        "replayed against 6 undisaggregated sim replicas and against 2 prefill + 4 decode, in "
        "rotating order; the sims model an 8B model on an H100 in real time.\n\n"
        f"{table(head, rows, 'lrrrrrr')}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=4.0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--prompt-tokens", type=int, default=3000)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="print, write nothing")
    args = parser.parse_args()
    info = machine()
    runs, load_after = measure(args)
    text_ = report(runs, args, info, load_after)
    print(text_)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "disaggregated.json").write_bytes(
            orjson.dumps(
                {r.name: {"ttft": r.ttft, "tpot": r.tpot, "failed": r.failed} for r in runs},
                option=orjson.OPT_INDENT_2,
            )
        )
        print(f"wrote {write_section('disaggregated', text_)}")


if __name__ == "__main__":
    main()
