"""Autoscaling on a bursty trace: fixed maxReplicas vs fixed minReplicas vs the autoscaler.

    python -m bench.autoscale [--bursts 3] [--burst 15] [--idle 45] [--rate 5] [--seed 1]

One Poisson trace (seeded): ``bursts`` bursts of ``rate`` requests/s for ``burst`` seconds,
separated by ``idle`` seconds without a request. It is replayed against ``llmplane up`` serving
sim replicas (``--time-scale 5 --max-num-seqs 4``: about 2 s per 60-token completion, four at
a time per replica, the rest wait in the engine's queue) three times:

- ``fixed max``: ``replicas: MAX``, no elasticConfig;
- ``fixed min``: ``replicas: MIN``, no elasticConfig;
- ``autoscaler``: ``elasticConfig`` MIN..MAX, trigger the gateway's in-flight requests per
  replica (``--target``, default 2: half the engine's batch of 4, so it scales before requests
  queue in the engine; the built-in default of 8 would let each replica queue 4), scale-down
  stabilization ``--down-window`` seconds (the HPA default, 300 s, is longer than the idle
  periods), a decision every ``--interval`` s over a ``--window`` s average.

Each request streams; TTFT is the time to the first streamed token at the client. Replica-
seconds integrate the engine processes running (starting ones included: they hold the
accelerator) over the trace. Written: bench/results/autoscale.json (a summary: the figures and
the times the replica count changed), the plot bench/results/autoscale.png (replicas and load
over time) and the ``autoscale`` section of docs/benchmarks.md. ``--raw`` also writes the
0.25 s samples the plot is drawn from (~11k lines a run) to bench/results/autoscale.raw.json,
which is not committed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.common import ROOT, machine, machine_line, percentile, table, write_section
from llmplane.testing import Processes, Up, wait_for
from llmplane.testing.fleets import sim_fleet

RESULTS = ROOT / "bench" / "results"
MODEL = "tiny"
ELASTIC = """  elasticConfig:
    minReplicas: {low}
    maxReplicas: {high}
    scaleTrigger:
      hpa:
        metrics:
        - type: Pods
          pods:
            metric: {{name: llmplane_gateway_endpoint_inflight}}
            target: {{type: AverageValue, averageValue: {target}}}
        behavior:
          scaleDown: {{stabilizationWindowSeconds: {down}}}
"""


def trace(args: argparse.Namespace) -> tuple[list[float], list[tuple[float, float]]]:
    """(arrival times, burst intervals): Poisson arrivals at ``rate`` inside each burst."""
    rng = random.Random(args.seed)
    arrivals: list[float] = []
    bursts = []
    start = args.lead
    for _ in range(args.bursts):
        end = start + args.burst
        bursts.append((start, end))
        t = start + rng.expovariate(args.rate)
        while t < end:
            arrivals.append(t)
            t += rng.expovariate(args.rate)
        start = end + args.idle
    return arrivals, bursts


@dataclass
class Run:
    name: str
    ttft: list[float] = field(default_factory=list)
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # t, replicas, in flight
    inflight: int = 0

    def replica_seconds(self) -> float:
        total = 0.0
        for (t0, r0, _), (t1, _, _) in zip(self.timeline, self.timeline[1:], strict=False):
            total += r0 * (t1 - t0)
        return total

    def replica_changes(self) -> list[tuple[float, int]]:
        """(t, replicas) at the first sample and wherever the replica count changed."""
        return [
            (round(t, 2), r)
            for i, (t, r, _) in enumerate(self.timeline)
            if i == 0 or r != self.timeline[i - 1][1]
        ]


WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
]


def prompt(i: int) -> str:
    """A distinct prompt per request (seeded): identical prompts would all go to the replica
    holding their prefix (the prefix-cache scorer), which is not the load this measures."""
    rng = random.Random(i)
    return f"request {i}: " + " ".join(rng.choice(WORDS) for _ in range(12))


async def one(session: aiohttp.ClientSession, url: str, run: Run, i: int) -> None:
    body = {"model": MODEL, "prompt": prompt(i), "max_tokens": 60, "stream": True}
    start = time.monotonic()
    run.inflight += 1
    first = None
    try:
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            if resp.status != 200:
                run.failed += 1
                run.errors.append(f"{resp.status} {(await resp.text())[:200]}")
                return
            async for line in resp.content:
                if first is None and line.startswith(b"data: {"):
                    first = time.monotonic() - start
            if first is None:
                run.failed += 1
                run.errors.append("no token streamed")
            else:
                run.ttft.append(first)
    except (aiohttp.ClientError, TimeoutError) as err:
        run.failed += 1
        run.errors.append(repr(err))
    finally:
        run.inflight -= 1


async def replay(up: Up, run: Run, arrivals: list[float], end: float) -> None:
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        t0 = time.monotonic()
        stop = False

        async def sample() -> None:
            while not stop:
                run.timeline.append((time.monotonic() - t0, len(up.engine_pids()), run.inflight))
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        tasks = []
        for i, at in enumerate(arrivals):
            delay = t0 + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, up.url, run, i)))
        await asyncio.gather(*tasks)
        rest = t0 + end - time.monotonic()
        if rest > 0:
            await asyncio.sleep(rest)
        stop = True
        await sampler
        run.timeline.append((time.monotonic() - t0, len(up.engine_pids()), run.inflight))


def fleet(replicas: int, elastic: str = "") -> str:
    return sim_fleet(MODEL, replicas, time_scale="5", args=["--max-num-seqs", "4"]) + elastic


def measure(
    group: Processes, work: Path, name: str, text: str, ready: int, args: argparse.Namespace
) -> Run:
    arrivals, _ = trace(args)
    end = args.lead + args.bursts * (args.burst + args.idle)
    path = work / f"{name.replace(' ', '-')}.yaml"
    path.write_text(text)
    up = group.up(
        work / name.replace(" ", "-"),
        str(path),
        args=["--autoscale-interval", str(args.interval), "--autoscale-window", str(args.window)],
    )
    try:
        wait_for(lambda: len(up.engine_pids()) == ready, 120, what=f"{name}: {ready} replicas")
        ready_url = f"{up.url}/v1/models"
        wait_for(lambda: _served(ready_url), 120, what=f"{name}: model served")
        time.sleep(args.settle)  # every replica Ready and scraped before the trace starts
        run = Run(name)
        print(f"{name}: replaying {len(arrivals)} requests over {end:.0f} s", flush=True)
        asyncio.run(replay(up, run, arrivals, end))
    finally:
        up.stop()
    return run


def _served(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return MODEL in resp.read().decode()
    except OSError:
        return False


def plot(runs: list[Run], bursts: list[tuple[float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.6 * len(runs)), sharex=True)
    for ax, run in zip(axes, runs, strict=True):
        t = [p[0] for p in run.timeline]
        ax.step(t, [p[1] for p in run.timeline], where="post", color="tab:blue", label="replicas")
        ax.set_ylabel("replicas", color="tab:blue")
        ax.set_ylim(0, max(p[1] for p in run.timeline) + 1)
        for start, end in bursts:
            ax.axvspan(start, end, color="0.9")
        load = ax.twinx()
        load.plot(t, [p[2] for p in run.timeline], color="tab:orange", lw=0.8, label="in flight")
        load.set_ylabel("requests in flight", color="tab:orange")
        ax.set_title(
            f"{run.name}: {run.replica_seconds():.0f} replica-s, TTFT p99 "
            f"{percentile(run.ttft, 99):.2f} s, {run.failed} failed",
            fontsize=9,
        )
    axes[-1].set_xlabel("seconds (grey: bursts)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bursts", type=int, default=3)
    p.add_argument("--burst", type=float, default=15.0, help="seconds per burst")
    p.add_argument("--idle", type=float, default=45.0, help="seconds between bursts")
    p.add_argument("--rate", type=float, default=5.0, help="requests/s during a burst")
    p.add_argument("--lead", type=float, default=3.0, help="idle seconds before the first burst")
    p.add_argument("--min", type=int, default=1, dest="low")
    p.add_argument("--max", type=int, default=4, dest="high")
    p.add_argument("--target", type=float, default=2, help="in-flight requests per replica")
    p.add_argument("--down-window", type=int, default=10, help="scale-down stabilization, s")
    p.add_argument("--interval", type=float, default=0.25, help="autoscaler interval, s")
    p.add_argument("--window", type=float, default=1.0, help="autoscaler averaging window, s")
    p.add_argument("--settle", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tag", default="", help="suffix of the result files and report section")
    p.add_argument(
        "--raw", action="store_true", help="also write the timeline samples to NAME.raw.json"
    )
    args = p.parse_args(argv)
    report_name = f"autoscale-{args.tag}" if args.tag else "autoscale"
    info = machine()
    work = Path(tempfile.mkdtemp(prefix="llmplane-autoscale-"))
    arrivals, bursts = trace(args)
    elastic = ELASTIC.format(
        low=args.low, high=args.high, target=args.target, down=args.down_window
    )
    configs = [
        (f"fixed max ({args.high})", fleet(args.high), args.high),
        (f"fixed min ({args.low})", fleet(args.low), args.low),
        (f"autoscaler ({args.low}..{args.high})", fleet(args.low, elastic), args.low),
    ]
    runs = []
    with Processes() as group:
        for name, text, ready in configs:
            runs.append(measure(group, work, name, text, ready, args))
    load_after = os.getloadavg()

    RESULTS.mkdir(parents=True, exist_ok=True)
    png = RESULTS / f"{report_name}.png"
    plot(runs, bursts, png)
    data: dict[str, Any] = {
        "args": vars(args),
        "requests": len(arrivals),
        "bursts": bursts,
        "runs": [
            {
                "name": r.name,
                "replica_seconds": r.replica_seconds(),
                "ttft_p50": percentile(r.ttft, 50),
                "ttft_p99": percentile(r.ttft, 99),
                "failed": r.failed,
                "errors": r.errors[:5],
                "replica_changes": r.replica_changes(),
            }
            for r in runs
        ],
    }
    (RESULTS / f"{report_name}.json").write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    if args.raw:
        raw = {r.name: r.timeline for r in runs}  # t, replicas, in flight every 0.25 s
        (RESULTS / f"{report_name}.raw.json").write_bytes(orjson.dumps(raw))
    base = runs[0]
    rows = [
        [
            r.name,
            f"{r.replica_seconds():.0f}",
            f"{r.replica_seconds() / base.replica_seconds():.2f}",
            f"{percentile(r.ttft, 50):.2f}",
            f"{percentile(r.ttft, 99):.2f}",
            f"{percentile(r.ttft, 99) / percentile(base.ttft, 99):.2f}",
            str(r.failed),
        ]
        for r in runs
    ]
    auto = runs[-1]
    goal_rs = auto.replica_seconds() <= 0.5 * base.replica_seconds()
    goal_ttft = percentile(auto.ttft, 99) <= 1.5 * percentile(base.ttft, 99)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    report = (
        (
            f"### Autoscaling on a bursty trace ({args.tag})\n\n"
            if args.tag
            else "## Autoscaling on a bursty trace (sim replicas)\n\n"
        )
        + f"`{' '.join(['python -m bench.autoscale', argv_text]).strip()}`"
        + f" ({machine_line(info, load_after)}). {len(arrivals)} streamed 60-token completions: "
        f"{args.bursts} Poisson bursts of {args.rate:g} req/s for {args.burst:g} s, "
        f"{args.idle:g} s idle between them; sim replicas (time scale 5, 4 sequences at a time: "
        "about 2 s per request). Autoscaler: in-flight target "
        f"{args.target:g} per replica, scale-down stabilization {args.down_window} s, decision "
        f"every {args.interval:g} s over a {args.window:g} s window.\n\n"
        + table(
            [
                "configuration",
                "replica-s",
                "vs fixed max",
                "TTFT p50 s",
                "TTFT p99 s",
                "p99 vs fixed max",
                "failed",
            ],
            rows,
        )
        + "\n\nGoal (issue 14): autoscaler <= 0.5x the replica-seconds of fixed max: "
        f"{'met' if goal_rs else 'missed'}; TTFT p99 <= 1.5x fixed max: "
        f"{'met' if goal_ttft else 'missed'}; no failed request: "
        f"{'met' if auto.failed == 0 else 'missed'}.\n\n"
        f"![replicas and load over time](../bench/results/{report_name}.png)\n"
    )
    print(report)
    write_section(report_name, report)


if __name__ == "__main__":
    main()
