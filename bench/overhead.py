"""Proxy overhead: one upstream, the same load generator, each proxy in front of it.

    python -m bench.overhead [--duration 5] [--concurrency 1 8 32 128] [--systems ...]
                             [--no-write]

Upstream: ``llmplane/testing/upstream.py --delay 0`` (aiohttp + uvloop: a small completion JSON,
or an SSE stream of ``--stream-tokens`` chunks, nothing modelled). Systems, each its own
process on 127.0.0.1:

- ``direct``: the upstream itself (the floor);
- ``llmplane``: ``python -m llmplane.gateway.cli`` (uvloop, default scheduling profile,
  metrics scraping on, access log off), the upstream registered as an external Endpoint;
- ``vllm-router-rr`` / ``vllm-router-cache``: ``vllm-router`` (Rust, PyPI) with policy
  round_robin / cache_aware;
- ``litellm``: ``litellm --config`` 1.100.5 from ``/tmp/litellm-venv`` (a model_list entry
  pointing at the upstream as an OpenAI-compatible api_base).

Load: wrk (2 threads, a Lua script for the POST body), ``--duration`` seconds per cell, one
cell per (mode, concurrency, system); the systems take turns inside each (mode, concurrency)
so slow drifts in the machine's load hit them alike. Reported per cell: req/s, p50/p99
latency, the latency added over direct, the proxy's CPU seconds per 1,000 requests (utime +
stime of its process tree from /proc/<pid>/stat, before/after the cell) and, for streaming,
tokens relayed per second (completed streams/s x tokens per stream). Writes the report
section ``overhead`` of docs/benchmarks.md, docs/img/overhead_*.png and
bench/results/overhead.json (unless ``--no-write``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import orjson

from bench.common import (
    IMG,
    RESULTS,
    free_port,
    gateway_proc,
    launch,
    machine,
    machine_line,
    rotate_and_measure,
    store_objects,
    table,
    upstream_proc,
    write_section,
)
from llmplane.testing import Process

LITELLM = Path(os.environ.get("LITELLM_VENV", "/tmp/litellm-venv")) / "bin" / "litellm"
SYSTEMS = ["direct", "llmplane", "vllm-router-rr", "vllm-router-cache", "litellm"]


def bodies(stream_tokens: int) -> dict[str, bytes]:
    return {
        "unary": orjson.dumps({"model": "bench", "prompt": "Say hello.", "max_tokens": 16}),
        "stream": orjson.dumps(
            {"model": "bench", "prompt": "Say hello.", "max_tokens": stream_tokens, "stream": True}
        ),
    }


class Fleet:
    """The upstream and every proxy in front of it."""

    def __init__(self, systems: list[str]) -> None:
        self.procs: dict[str, Process] = {}
        self.urls: dict[str, str] = {}
        self.state_dir = tempfile.mkdtemp(prefix="bench-overhead-")
        self.systems = systems

    def start(self) -> None:
        up = upstream_proc()
        self.procs["direct"] = up
        address = up.ready()
        self.urls["direct"] = f"http://{address}/v1/completions"
        probe = bodies(4)["unary"]
        if "llmplane" in self.systems:
            from llmplane.gateway.discovery.store_endpoints import endpoint_object

            store_objects(self.state_dir, endpoint_object("bench", address, "bench", engine="vllm"))
            gw = gateway_proc(self.state_dir)
            self.procs["llmplane"] = gw
            self.urls["llmplane"] = f"http://{gw.ready()}/v1/completions"
        for name, policy in (
            ("vllm-router-rr", "round_robin"),
            ("vllm-router-cache", "cache_aware"),
        ):
            if name not in self.systems:
                continue
            if not shutil.which("vllm-router"):
                print(f"skipping {name}: vllm-router not installed (pip install vllm-router)")
                continue
            port = free_port()
            p = launch(
                name,
                [
                    "vllm-router",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--worker-urls",
                    f"http://{address}",
                    "--policy",
                    policy,
                    "--prometheus-port",
                    str(free_port()),
                    "--log-level",
                    "warning",
                ],
            )
            self.procs[name] = p
            self.urls[name] = f"http://127.0.0.1:{port}/v1/completions"
        if "litellm" in self.systems:
            if not LITELLM.exists():
                print(f"skipping litellm: {LITELLM} missing (see the module docstring)")
            else:
                port = free_port()
                cfg = Path(self.state_dir) / "litellm.yaml"
                cfg.write_text(
                    "model_list:\n  - model_name: bench\n    litellm_params:\n"
                    f"      model: openai/bench\n      api_base: http://{address}/v1\n"
                    "      api_key: none\nlitellm_settings:\n  telemetry: false\n"
                )
                p = launch(
                    "litellm",
                    [
                        str(LITELLM),
                        "--config",
                        str(cfg),
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                    ],
                    env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"},
                    cwd=self.state_dir,
                )
                self.procs["litellm"] = p
                self.urls["litellm"] = f"http://127.0.0.1:{port}/v1/completions"
        for name, url in self.urls.items():
            self.procs[name].wait_http(url, probe, timeout=120)

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    info = machine()
    fleet = Fleet(args.systems)
    cells = rotate_and_measure(
        fleet,
        args.systems,
        bodies(args.stream_tokens),
        args.modes,
        args.concurrency,
        args.duration,
        lambda name: [fleet.procs[name].pid],
    )
    for r in cells:
        if r["mode"] == "stream":
            r["tokens_per_s"] = r["rps"] * args.stream_tokens
    return {"machine": info, "load_after": os.getloadavg(), "args": vars(args), "cells": cells}


def _cell(cells: list[dict[str, Any]], mode: str, c: int, system: str) -> dict[str, Any] | None:
    for r in cells:
        if r["mode"] == mode and r["c"] == c and r["system"] == system:
            return r
    return None


def report(res: dict[str, Any]) -> str:
    args = res["args"]
    cells = res["cells"]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in cells)]
    out = [
        f"Command: `python -m bench.overhead --duration {args['duration']:g}` "
        f"({machine_line(res['machine'], res['load_after'])}). "
        f"Non-streaming: a 16-token completion; streaming: {args['stream_tokens']} SSE chunks per "
        "response. `added` = p50/p99 minus direct's in the same (mode, concurrency) round. "
        "CPU = the proxy process tree's CPU seconds per 1,000 requests.",
        "",
    ]
    for mode in args["modes"]:
        rows = []
        for c in args["concurrency"]:
            d = _cell(cells, mode, c, "direct")
            for s in systems:
                r = _cell(cells, mode, c, s)
                if r is None:
                    continue
                added = (
                    f"{r['p50'] - d['p50']:+.2f} / {r['p99'] - d['p99']:+.2f}"
                    if d is not None and s != "direct"
                    else ""
                )
                if not r["requests"]:
                    rows.append(
                        [c, s, "0", "no response completed within the cell", "", "", "", ""]
                        + ([""] if mode == "stream" else [])
                    )
                    continue
                row = [
                    c,
                    s,
                    f"{r['rps']:,.0f}",
                    f"{r['p50']:.2f}",
                    f"{r['p99']:.2f}",
                    added,
                    f"{r['cpu_per_1k']:.3f}",
                    r["errors"],
                ]
                if mode == "stream":
                    row.insert(3, f"{r['tokens_per_s']:,.0f}")
                rows.append(row)
        headers = [
            "c",
            "system",
            "req/s",
            "p50 ms",
            "p99 ms",
            "added p50 / p99 ms",
            "CPU s / 1k req",
            "errors",
        ]
        if mode == "stream":
            headers.insert(3, "tokens/s")
        title = "Non-streaming" if mode == "unary" else "Streaming"
        out += [f"**{title}**", "", table(headers, rows, "rl" + "r" * (len(headers) - 2)), ""]
    out.append(
        "![throughput vs concurrency](img/overhead_throughput.png) "
        "![added latency vs concurrency](img/overhead_latency.png)"
    )
    return "\n".join(out)


def plot(res: dict[str, Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = res["cells"]
    args = res["args"]
    IMG.mkdir(parents=True, exist_ok=True)
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in cells)]
    paths = []
    fig, axes = plt.subplots(1, len(args["modes"]), figsize=(6 * len(args["modes"]), 4))
    axes = axes if len(args["modes"]) > 1 else [axes]
    for ax, mode in zip(axes, args["modes"], strict=True):
        for s in systems:
            pts = [(r["c"], r["rps"]) for r in cells if r["system"] == s and r["mode"] == mode]
            if pts:
                ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=s)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrency (wrk connections)")
        ax.set_ylabel("req/s")
        ax.set_title(f"throughput, {'non-streaming' if mode == 'unary' else 'streaming'}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(IMG / "overhead_throughput.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(args["modes"]), figsize=(6 * len(args["modes"]), 4))
    axes = axes if len(args["modes"]) > 1 else [axes]
    for ax, mode in zip(axes, args["modes"], strict=True):
        for s in systems:
            if s == "direct":
                continue
            pts = []
            for c in args["concurrency"]:
                r, d = _cell(cells, mode, c, s), _cell(cells, mode, c, "direct")
                if r and d:
                    pts.append((c, max(0.01, r["p50"] - d["p50"])))
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=s)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrency (wrk connections)")
        ax.set_ylabel("added p50 latency vs direct, ms")
        ax.set_title(f"added latency, {'non-streaming' if mode == 'unary' else 'streaming'}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(IMG / "overhead_latency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per cell")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    parser.add_argument(
        "--modes", nargs="+", default=["unary", "stream"], choices=["unary", "stream"]
    )
    parser.add_argument("--stream-tokens", type=int, default=64)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    res = run(args)
    if args.no_write:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "overhead.json").write_text(json.dumps(res, indent=1))
    for p in plot(res):
        print(f"wrote {p}")
    print(f"wrote {write_section('overhead', report(res))}")


if __name__ == "__main__":
    main()
