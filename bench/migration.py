"""Chaos benchmark of stream migration (gateway/migration.py): streams that survive their
replica.

    python -m bench.migration [--mode kill|stop|both] [--duration 30] [--streams 50]
                              [--tokens 400] [--every 5] [--stall 1] [--no-write]

Three ``llmplane.sim`` replicas (``--time-scale 1``) behind an in-process gateway; ``--streams``
clients each stream one completion of ``--tokens`` tokens after another (temperature 0, a
seed, ``ignore_eos``) for ``--duration`` seconds. Every ``--every`` seconds one replica in turn
is SIGKILLed and restarted on its port (``kill``), or SIGSTOPped, and SIGKILLed and restarted
at the next turn (``stop``: the gateway's stall timeout, ``--stall``, finds it). Reported per
mode: streams, streams that ended with an error (or without [DONE]), streams whose usage is not
exactly ``--tokens`` completion tokens, migrations, and the time to resume (gateway side: from
the lost stream to the continuation's first chunk, the access log's ``migrations``; client
side: the longest gap between two events of a migrated stream) at p50 / p99. Writes section
``migration`` of docs/benchmarks.md and bench/results/migration.json (not with --no-write).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import time
from typing import Any

import aiohttp
import orjson

from bench.common import RESULTS, machine, machine_line, percentile, table, write_section
from llmplane.controlplane.plan import MODEL_NAME_LABEL
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import Endpoint, StaticDiscovery
from llmplane.gateway.observability import access_log
from llmplane.gateway.server import start_gateway
from llmplane.testing.process import Process, sim

MODEL = "m"
SIM_ARGS = ("--time-scale", "1", "--max-num-seqs", "256")


class Records(logging.Handler):
    """The gateway's access-log lines (in process: ``write_access`` logs them)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(orjson.loads(record.getMessage()))


async def client(
    session: aiohttp.ClientSession, url: str, tokens: int, until: float, i: int, out: list
) -> None:
    n = 0
    while time.monotonic() < until:
        body = {"model": MODEL, "prompt": f"client {i} story {n}", "max_tokens": tokens,
                "ignore_eos": True, "temperature": 0, "seed": 3, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        n += 1
        result: dict[str, Any] = {"error": None, "completion": None, "gap": 0.0}
        try:
            async with session.post(url, data=orjson.dumps(body)) as resp:
                if resp.status != 200:
                    result["error"] = f"HTTP {resp.status}"
                else:
                    last = time.monotonic()
                    done = False
                    async for line in resp.content:
                        if not line.startswith(b"data: "):
                            continue
                        now = time.monotonic()
                        result["gap"] = max(result["gap"], now - last)
                        last = now
                        data = line[6:].strip()
                        if data == b"[DONE]":
                            done = True
                        elif b'"error"' in data:
                            result["error"] = orjson.loads(data)["error"].get("code")
                        elif b'"usage"' in data:
                            usage = orjson.loads(data).get("usage")
                            if usage:
                                result["completion"] = usage["completion_tokens"]
                    if not done and result["error"] is None:
                        result["error"] = "no [DONE]"
        except (aiohttp.ClientError, OSError) as err:
            result["error"] = type(err).__name__
        out.append(result)


async def chaos(replicas: list[Process], mode: str, every: float, until: float) -> int:
    """Kill (or freeze) one replica in turn every ``every`` s, restarting the previous one."""
    turn = 0
    frozen: int | None = None
    while time.monotonic() + every < until:
        await asyncio.sleep(every)
        k = turn % len(replicas)
        turn += 1
        if frozen is not None:  # the frozen one is killed and comes back
            replicas[frozen] = await asyncio.to_thread(restart, replicas[frozen])
            frozen = None
        if mode == "kill":
            os.kill(replicas[k].proc.pid, signal.SIGKILL)
            replicas[k] = await asyncio.to_thread(restart, replicas[k])
        else:
            os.kill(replicas[k].proc.pid, signal.SIGSTOP)
            frozen = k
    if frozen is not None:
        replicas[frozen] = await asyncio.to_thread(restart, replicas[frozen])
    return turn


def restart(replica: Process) -> Process:
    os.kill(replica.proc.pid, signal.SIGKILL)
    replica.stop()
    port = replica.address.rsplit(":", 1)[1]
    return sim(MODEL, *SIM_ARGS, "--port", port)


async def run(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    replicas = [sim(MODEL, *SIM_ARGS) for _ in range(3)]
    records = Records()
    access_log.addHandler(records)
    access_log.setLevel(logging.INFO)
    discovery = StaticDiscovery(
        [
            Endpoint(r.address, {MODEL_NAME_LABEL: MODEL}, MODEL, fixed_port=True, engine="sim")
            for r in replicas
        ]
    )
    config = GatewayConfig(stream_stall_timeout=args.stall, default_timeout=30.0)
    gw = await start_gateway(None, discovery, config=config)
    results: list[dict[str, Any]] = []
    try:
        url = f"http://127.0.0.1:{gw.port}/v1/completions"
        until = time.monotonic() + args.duration
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector, headers={"Content-Type": "application/json"}
        ) as session:
            clients = [
                client(session, url, args.tokens, until, i, results) for i in range(args.streams)
            ]
            kills, *_ = await asyncio.gather(chaos(replicas, mode, args.every, until), *clients)
    finally:
        await gw.close()
        access_log.removeHandler(records)
        for r in replicas:
            os.kill(r.proc.pid, signal.SIGCONT)
            r.stop()
    moves = [m for rec in records.records for m in rec.get("migrations") or ()]
    resume = [m["resume_ms"] for m in moves]
    migrated = sum(1 for rec in records.records if rec.get("migrations"))
    gaps = sorted(r["gap"] * 1000 for r in results)[-max(1, migrated) :]
    return {
        "mode": mode,
        "kills": kills,
        "streams": len(results),
        "errors": sum(1 for r in results if r["error"] is not None),
        "error_kinds": sorted({str(r["error"]) for r in results if r["error"] is not None}),
        "wrong_usage": sum(1 for r in results if r["completion"] != args.tokens),
        "migrations": len(moves),
        "migrated_streams": migrated,
        "resume_ms_p50": round(percentile(resume, 50), 1),
        "resume_ms_p99": round(percentile(resume, 99), 1),
        "client_gap_ms_p50": round(percentile(gaps, 50), 1),
        "client_gap_ms_p99": round(percentile(gaps, 99), 1),
    }


def report(runs: list[dict[str, Any]], args: argparse.Namespace, machine_text: str) -> str:
    """The section of docs/benchmarks.md: how it ran, then one row per mode."""
    what = {"kill": "SIGKILL, restarted", "stop": "SIGSTOP (killed and restarted a turn later)"}
    command = (
        f"python -m bench.migration --duration {args.duration:g} --streams {args.streams} "
        f"--tokens {args.tokens} --every {args.every:g} --stall {args.stall:g}"
    )
    rows = [
        [
            what[r["mode"]],
            r["kills"],
            r["streams"],
            r["errors"],
            r["wrong_usage"],
            r["migrations"],
            r["migrated_streams"],
            f"{r['resume_ms_p50']:g} / {r['resume_ms_p99']:g}",
            f"{r['client_gap_ms_p50']:g} / {r['client_gap_ms_p99']:g}",
        ]
        for r in runs
    ]
    head = [
        "replica lost by",
        "replicas lost",
        "streams",
        "ended with an error",
        f"usage != {args.tokens} tokens",
        "migrations",
        "streams migrated",
        "time to resume p50 / p99 ms",
        "client's longest gap p50 / p99 ms",
    ]
    kinds = sorted({k for r in runs for k in r["error_kinds"]})
    errors = f" Errors seen: {', '.join(kinds)}." if kinds else ""
    return (
        f"`{command}` ({machine_text}). Three sim replicas (`--time-scale 1`) behind an "
        f"in-process gateway (stall timeout {args.stall:g} s); {args.streams} clients each "
        f"stream one completion of {args.tokens} tokens after another for {args.duration:g} s "
        f"while one replica in turn is lost every {args.every:g} s. Time to resume: the "
        "gateway's, from the lost stream to the continuation's first chunk (the access log's "
        "`migrations`); the client's longest gap between two events of its stream, over as "
        f"many streams as migrated.{errors}\n\n" + table(head, rows)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("kill", "stop", "both"), default="both")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--stall", type=float, default=1.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    info = machine()
    modes = ("kill", "stop") if args.mode == "both" else (args.mode,)
    runs = []
    for mode in modes:
        runs.append(asyncio.run(run(mode, args)))
        print(orjson.dumps(runs[-1]).decode(), flush=True)
    text = report(runs, args, machine_line(info, os.getloadavg()))
    print(text)
    if args.no_write:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "migration.json").write_bytes(
        orjson.dumps(
            {"machine": info, "args": vars(args), "runs": runs}, option=orjson.OPT_INDENT_2
        )
    )
    print(f"wrote {write_section('migration', text)}")


if __name__ == "__main__":
    main()
