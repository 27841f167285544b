"""What an idle real vLLM replica costs behind ``llmplane up``, and how soon it is Ready.

    python -m bench.vllm_idle [--idle 60] [--write]

Runs ``llmplane up`` twice with one vLLM (CPU) replica of the tiny random Llama
(``llmplane.testing.tiny_model``), side by side in one run:

- ``scrape every 50 ms``: the gateway scrapes the idle replica at its busy pace
  (``scrapeIdleInterval: 0.05``, what every replica got before adaptive scraping);
- ``adaptive``: the defaults (50 ms while busy, backing off to 2 s while idle).

For each it reports the CPU the replica's process tree (API server + engine core) uses per
second of wall time over ``--idle`` seconds with no traffic, the bytes its log grew by, and the
time from the engine's first healthy ``/health`` (polled here every 20 ms) to the Playground's
Available condition. ``--write`` puts the table in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.common import cpu_seconds, machine, machine_line, table, write_section
from llmplane.store.paths import open_store
from llmplane.testing.fleets import vllm_fleet
from llmplane.testing.tiny_model import build_tiny_llama

NAME = "tiny-llama"


def available_at(state: Path) -> bool:
    with open_store(state) as store:
        obj = store.get("Playground", NAME, "default") or {}
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Available" and c["status"] == "True" for c in conds)


def engine(state: Path) -> tuple[int, int] | None:
    """(pid, port) of the replica from the runtime's process record."""
    try:
        data = json.loads((state / "runtime" / "processes.json").read_text())
    except (OSError, ValueError):
        return None
    for rec in data.get("processes", []):
        argv = rec["argv"]
        if "--port" in argv:
            return rec["pid"], int(argv[argv.index("--port") + 1])
    return None


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def run(label: str, workdir: Path, model: Path, gateway: dict, idle: float) -> dict:
    state = workdir / label.replace(" ", "-")
    files = workdir / f"{state.name}.yaml"
    files.write_text(vllm_fleet(model, NAME))
    config = workdir / f"{state.name}-gateway.yaml"
    config.write_text(json.dumps({"gateway": gateway}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmplane.cli", "up", "--port", "0", "--state-dir", str(state),
         "-f", str(files), "--gateway-config", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        found = None
        while found is None and time.monotonic() < deadline:
            found = engine(state)
            time.sleep(0.05)
        assert found, "no engine process"
        pid, port = found
        while not healthy(port):
            assert time.monotonic() < deadline, "engine never healthy"
            time.sleep(0.02)
        health_at = time.monotonic()
        while not available_at(state):
            assert time.monotonic() < deadline, "never Available"
            time.sleep(0.02)
        lag = time.monotonic() - health_at
        time.sleep(5)  # let start-up work (compilation, warm-up) settle
        log = state / "logs" / "default" / NAME / "replica-0.log"
        size0, cpu0, t0 = log.stat().st_size, cpu_seconds(pid), time.monotonic()
        time.sleep(idle)
        cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
        grew = log.stat().st_size - size0
        scrapes = len(re.findall(rb'"GET /metrics HTTP', log.read_bytes()[size0:]))
        return {"label": label, "cpu": cpu, "log_per_hour": grew * 3600 / idle,
                "scrapes_per_s": scrapes / idle, "ready_lag": lag}  # fmt: skip
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--idle", type=float, default=60)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = build_tiny_llama(work / "model")
        rows = [
            run("scrape every 50 ms", work, model, {"scrapeIdleInterval": 0.05}, args.idle),
            run("adaptive", work, model, {}, args.idle),
        ]
    text = "\n".join(
        [
            "## An idle vLLM replica: scraping cost and time to Ready",
            "",
            f"`python -m bench.vllm_idle --idle {args.idle:g}`: one vLLM 0.32 (CPU) replica of the "
            "tiny random Llama behind `llmplane up`, no traffic; CPU of the replica's process "
            "tree per second of wall time, its log growth, and the time from its first healthy "
            "`/health` to the Playground's Available condition. "
            + machine_line(info, os.getloadavg()),
            "",
            table(
                ["gateway scraping", "idle CPU (cores)", "scrapes/s", "log growth", "Ready lag"],
                [
                    [
                        r["label"],
                        f"{r['cpu']:.3f}",
                        f"{r['scrapes_per_s']:.1f}",
                        f"{r['log_per_hour'] / 1e6:.2f} MB/h",
                        f"{r['ready_lag']:.2f} s",
                    ]
                    for r in rows
                ],
            ),
        ]
    )
    print(text)
    if args.write:
        write_section("vllm-idle", text)


if __name__ == "__main__":
    main()
