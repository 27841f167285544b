"""What one scrape of the sim's ``/metrics`` costs the sim, before and after a change.

    python -m bench.sim_scrape --baseline REF [--scrapes 2000]

The baseline is a git ref checked out into a temporary worktree; the candidate is this working
tree. For each, in a child process running that tree's code:

- ``render, idle``: CPU per ``/metrics`` page rendered in-process with nothing changed since
  the previous one (an idle replica);
- ``render, busy``: the same with one engine step's worth of change before each render (the
  iteration, inter-token-latency and time-to-first-token histograms and the token counters
  move; a replica scraped every 50 ms while it serves);
- ``HTTP scrape, idle``: CPU of a real sim process per ``GET /metrics`` (``--scrapes`` of
  them, one at a time, keep-alive), from /proc: what the gateway's scrapes cost a replica.

Nothing is written: the figures go into docs/benchmarks.md with the change they measure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import ROOT, checkout, machine, machine_line, remove_checkout, table

CHILD = r"""
import asyncio, http.client, json, sys, time
from bench.common import cpu_seconds
from llmplane.sim.config import SimConfig
from llmplane.sim.server import SimServer
from llmplane.testing import sim_process

scrapes = int(sys.argv[1])

async def render() -> tuple[float, float]:
    m = SimServer(SimConfig(model="m")).engine.metrics
    n = 2000
    t = time.process_time()
    for _ in range(n):
        m.render()
    idle = (time.process_time() - t) / n
    stats = m.engine.sched.stats
    t = time.process_time()
    for _ in range(n):
        stats.generation_tokens += 8
        m.iteration_tokens.observe(8)
        m.itl.observe_all([0.02] * 8)
        m.ttft.observe(0.05)
        m.render()
    return idle, (time.process_time() - t) / n

idle, busy = asyncio.run(render())
with sim_process("m") as sim:  # started by the with, stopped at its end
    conn = http.client.HTTPConnection(sim.host, sim.port)
    for _ in range(50):  # warm up
        conn.request("GET", "/metrics")
        conn.getresponse().read()
    cpu0 = cpu_seconds(sim.pid)
    for _ in range(scrapes):
        conn.request("GET", "/metrics")
        page = conn.getresponse().read()
    http_idle = (cpu_seconds(sim.pid) - cpu0) / scrapes
print(json.dumps({"render_idle": idle, "render_busy": busy, "http_idle": http_idle,
                  "page_bytes": len(page)}))
"""


def measure(tree: Path, scrapes: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(scrapes)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="git ref of the build to compare against")
    p.add_argument("--scrapes", type=int, default=2000)
    args = p.parse_args(argv)
    info = machine()
    work = Path(tempfile.mkdtemp(prefix="llmplane-simscrape-"))
    base_tree = checkout(args.baseline, work / "baseline")
    try:
        rows = []
        for label, tree in ((f"baseline ({args.baseline})", base_tree), ("this tree", ROOT)):
            r = measure(tree, args.scrapes)
            print(label, json.dumps(r), flush=True)
            rows.append(
                [
                    label,
                    f"{r['render_idle'] * 1e6:,.1f}",
                    f"{r['render_busy'] * 1e6:,.1f}",
                    f"{r['http_idle'] * 1e6:,.0f}",
                    f"{r['page_bytes']:,}",
                ]
            )
    finally:
        remove_checkout(base_tree)
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"`python -m bench.sim_scrape --baseline {args.baseline} --scrapes {args.scrapes}` "
        f"({machine_line(info, os.getloadavg())})\n"
    )
    print(
        table(
            [
                "sim build",
                "render, idle (us)",
                "render, busy (us)",
                "HTTP scrape, idle (us of sim CPU)",
                "page bytes",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
