"""Precise prefix routing in llm-d's benchmark shape, scaled to this machine.

    python -m bench.precise_routing [--sims 8] [--time-scale 4] [--rates 10 20 30 40 50]
                                    [--cell-seconds 40] [--rounds 1] [--no-write] [--logs DIR]
                                    [--precise-config FILE] [--approximate-config FILE]
                                    [--gateways 1]

``--logs`` keeps each router's output (the gateways' access logs: ``queued_ms``, the chosen
endpoint, ``cached_tokens_predicted``); ``--precise-config`` / ``--approximate-config`` give a
system a gateway config of its own (another profile, or ``gateway:`` settings) to compare.
``--gateways N`` runs each router N times (N gateway processes a system, N vllm-routers), each
request sent to the next in turn, as a Service spreads clients over a gateway Deployment's
replicas (the chart runs 2): each router knows only its own picks, where the engines' events
tell every gateway what all of them sent.

Fleet: ``--sims`` sims publishing their KV-cache events (``--kv-events-config``, ipc sockets,
as ``llmplane up`` starts them), each with a KV cache of about a third of all the groups'
prefixes (``--num-blocks``, default groups x prefix tokens / 3 / 16-token blocks). Every
modelled delay is multiplied by ``--time-scale``; rates and latencies are reported in simulated
seconds (real / scale), as in bench/routing.py.

Workload (llm-d's "precise prefix-cache routing" benchmark, scaled): ``--groups`` groups (64)
with a ``--prefix-tokens`` (3,000) shared system prompt, ``--users`` (5) users a group with
``--user-tokens`` (600) of their own context, each request that user's context plus a fresh
``--question-tokens`` question, ``--output-tokens`` streamed; Poisson arrivals at each rate;
fresh text every cell (no cell profits from another's cache).

Systems, used in turns on the same sims:
- ``precise``: ``llmplane gateway`` with its built-in default profile, which scores prefixes
  with the precise scorer while the replicas publish events (docs/gateway.md "Precise prefix
  routing");
- ``approximate``: a second ``llmplane gateway`` configured with the approximate-index default
  (the built-in profile without events: queue-margin filter, prefix-cache x6, least-request
  x2, kv-cache x1, prefix-spread x3);
- ``cache_aware``: vllm-router's ``cache_aware`` policy (skipped when not installed).

``--same-groups``: each system sends the same groups and users in all its cells (llm-d's
shape: rising rates over one dataset), so its earlier cells warm the caches and the other
systems' traffic, three datasets in a fleet that holds about one and a third, evicts them: an
index that misses evictions sends requests where their prefix no longer is.

``--rounds N`` runs every rate N times (the systems' order turning each time, fresh text each
cell) and reports each figure's median over the rounds, with the TTFT p90's range: from one run
to the next the three systems' p90 move by 10-40 % at the same rate, more than they differ.

Per cell: TTFT p50/p90/p99, the TTFT p90 of the requests sent in the cell's second half (its
first half is mostly the drain of the cold start: every group's and user's first prefill
arrives at once and the fleet is bound by prefill until they are done; after it the routers
hold a warm fleet), goodput (requests a simulated second whose TTFT met
``--slo-ttft``), output tokens a second, the sims' prefix-cache hit rate. Over the whole run, for
each llmplane system: the prompt tokens its gateway predicted cached on the replicas it chose
(the access log's ``cached_tokens_predicted``: what the router believes the replica will hold
when the request arrives, blocks on their way there included) against the prompt tokens the
sims served from their cache for its requests (``vllm:prompt_tokens_cached``, counted once a
request when it is first scheduled, as the prediction is made once): the ratio is the precise
index's accuracy under evictions, and the approximate index's error on the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from typing import Any

import aiohttp
import orjson
import yaml

from bench import workloads as wl
from bench.common import (
    RESULTS,
    free_port,
    gateway_proc,
    launch,
    machine,
    machine_line,
    percentile,
    store_objects,
    table,
    write_section,
)
from bench.routing import one_request, sim_counters
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.gateway.scheduler.config import DEFAULT_CONFIG
from llmplane.testing import Process

MODEL = "sim-model"
BLOCK = 16  # the sim's default block size
SYSTEMS = ["precise", "approximate", "cache_aware"]


def chat_requests(
    rng: random.Random, n: int, a: argparse.Namespace, salt: str, texts: random.Random
) -> list[dict]:
    """``n`` requests: a random user of a random group each, streamed; the groups' prefixes
    and the users' own texts drawn from ``texts``."""
    prefixes = [f"[{salt}:{g}] " + wl.text(texts, a.prefix_tokens) for g in range(a.groups)]
    own = [[wl.text(texts, a.user_tokens) for _ in range(a.users)] for _ in range(a.groups)]
    out = []
    for _ in range(n):
        g, u = rng.randrange(a.groups), rng.randrange(a.users)
        question = wl.text(rng, a.question_tokens)
        messages = [
            {"role": "system", "content": prefixes[g]},
            {"role": "user", "content": f"{own[g][u]}\n{question}"},
        ]
        out.append(wl.Request(messages, a.output_tokens, group=g).body(MODEL))
    return out


class Fleet:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.sims: list[Process] = []
        self.addrs: list[str] = []
        self.routers: dict[str, list[Process]] = {}  # a system's routers (``--gateways``)
        self.urls: dict[str, list[str]] = {}
        self.dirs: list[str] = []
        self.sockets = tempfile.mkdtemp(prefix="kv", dir="/tmp")  # short: a socket path's limit

    def start(self) -> None:
        a = self.a
        events = []
        for i in range(a.sims):
            pub, replay = f"ipc://{self.sockets}/{i}.sock", f"ipc://{self.sockets}/{i}-r.sock"
            config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": pub,
                      "replay_endpoint": replay, "topic": "kv"}  # fmt: skip
            argv = ["python", "-m", "llmplane.sim", "--model", MODEL, "--port", "0",
                    "--seed", str(i), "--time-scale", str(a.time_scale),
                    "--num-blocks", str(a.num_blocks), "--kv-events-config", json.dumps(config)]  # fmt: skip
            self.sims.append(launch(f"sim{i}", argv))
            events.append((pub, replay))
        self.addrs = [s.ready() for s in self.sims]
        endpoints = [
            endpoint_object(
                f"sim{i}", addr, MODEL, engine="sim", kv_events=pub, kv_events_replay=replay
            )
            for i, (addr, (pub, replay)) in enumerate(zip(self.addrs, events, strict=True))
        ]
        approximate = a.approximate_config or os.path.join(self.sockets, "approximate.yaml")
        if not a.approximate_config:  # the default as a file: a configured one stays approximate
            with open(approximate, "w") as f:
                yaml.safe_dump(DEFAULT_CONFIG, f)
        for system, config in (("precise", a.precise_config), ("approximate", approximate)):
            if system not in a.systems:
                continue
            extra = ("--config", config) if config else ()
            for k in range(a.gateways):
                state = tempfile.mkdtemp(prefix="bench-precise-")
                self.dirs.append(state)
                store_objects(state, *endpoints)
                self.routers.setdefault(system, []).append(
                    gateway_proc(state, *extra, name=f"{system}{k}", access_log=True)
                )
        if "cache_aware" in a.systems:
            if shutil.which("vllm-router"):
                for k in range(a.gateways):
                    port = free_port()
                    argv = ["vllm-router", "--host", "127.0.0.1", "--port", str(port),
                            "--policy", "cache_aware", "--prometheus-port", str(free_port()),
                            "--log-level", "warning",
                            "--worker-urls", *[f"http://{s}" for s in self.addrs]]  # fmt: skip
                    self.routers.setdefault("cache_aware", []).append(
                        launch(f"vllm-router{k}", argv)
                    )
                    self.urls.setdefault("cache_aware", []).append(
                        f"http://127.0.0.1:{port}/v1/chat/completions"
                    )
            else:
                print("skipping vllm-router cache_aware: not installed (pip install vllm-router)")
        for name in ("precise", "approximate"):
            for proc in self.routers.get(name, []):
                url = f"http://{proc.ready()}/v1/chat/completions"
                self.urls.setdefault(name, []).append(url)
        probe = orjson.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        )
        for name, urls in self.urls.items():
            for proc, url in zip(self.routers[name], urls, strict=True):
                proc.wait_http(url, probe)

    def predicted(self, system: str) -> tuple[int, int]:
        """(access-log lines with a ``cached_tokens_predicted``, their sum) over a system's
        gateways so far."""
        lines = tokens = 0
        for proc in self.routers[system]:
            for line in proc.output().splitlines():
                if line.startswith("{") and '"cached_tokens_predicted"' in line:
                    with_prediction = orjson.loads(line)
                    if with_prediction.get("path") == "/v1/chat/completions":
                        lines += 1
                        tokens += int(with_prediction["cached_tokens_predicted"])
        return lines, tokens

    def stop(self) -> None:
        if self.a.logs:  # each router's output (the gateways' access logs) for a closer look
            os.makedirs(self.a.logs, exist_ok=True)
            for name, procs in self.routers.items():
                for k, proc in enumerate(procs):
                    with open(os.path.join(self.a.logs, f"{name}{k}.log"), "w") as f:
                        f.write(proc.output())
        for p in [*(p for procs in self.routers.values() for p in procs), *self.sims]:
            p.stop()
        for d in [*self.dirs, self.sockets]:
            shutil.rmtree(d, ignore_errors=True)


async def run_cell(fleet: Fleet, system: str, bodies: list[dict], arrivals: list[float]) -> dict:
    a = fleet.a
    scale = a.time_scale
    urls = fleet.urls[system]
    seen, seen_tokens = fleet.predicted(system) if system in ("precise", "approximate") else (0, 0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        before = await sim_counters(session, fleet.addrs)
        start = time.perf_counter() + 0.05
        deadline = start + a.cell_seconds
        tasks, sent_at = [], []
        for i, (t_sim, body) in enumerate(zip(arrivals, bodies, strict=True)):
            t_real = start + t_sim * scale
            if t_real > deadline:
                break
            delay = t_real - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent_at.append(t_sim)
            tasks.append(
                asyncio.ensure_future(
                    one_request(session, urls[i % len(urls)], orjson.dumps(body), a.request_timeout)
                )
            )
        results = list(await asyncio.gather(*tasks))
        span = (time.perf_counter() - start) / scale
        if system in ("precise", "approximate"):  # every request's access-log line is out
            settled = time.monotonic() + 5.0
            while fleet.predicted(system)[0] < seen + len(results):
                if time.monotonic() > settled:
                    break
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the sims' counters settle
        after = await sim_counters(session, fleet.addrs)

    def delta(name: str) -> float:
        return sum(x.get(name, 0) - y.get(name, 0) for x, y in zip(after, before, strict=True))

    ok = [r for r in results if r["ok"]]
    ttft = [r["ttft"] / scale for r in ok]
    # The cell's second half: its first is mostly the drain of the cold start (every group's
    # and user's first prefill at once), which hides how the routers hold a warm fleet.
    half = a.cell_seconds / scale / 2
    late = [
        r["ttft"] / scale for r, t in zip(results, sent_at, strict=True) if r["ok"] and t >= half
    ]
    hits, queries = delta("vllm:prefix_cache_hits"), delta("vllm:prefix_cache_queries")
    predicted = None
    if system in ("precise", "approximate"):
        predicted = fleet.predicted(system)[1] - seen_tokens
    return {
        "system": system,
        "sent": len(results),
        "ok": len(ok),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "ttft_p99": percentile(ttft, 99),
        "late_p90": percentile(late, 90),
        "goodput": sum(1 for t in ttft if t <= a.slo_ttft) / span if span else 0.0,
        "tok_s": sum(r["tokens"] for r in ok) / span if span else 0.0,
        "hit_rate": hits / queries if queries else float("nan"),
        "hits": hits,
        "cached": delta("vllm:prompt_tokens_cached"),
        "predicted": predicted,
    }


async def run_all(a: argparse.Namespace) -> dict[str, Any]:
    info = machine()
    fleet = Fleet(a)
    cells: list[dict[str, Any]] = []
    try:
        fleet.start()
        systems = [s for s in a.systems if s in fleet.urls]
        print(f"systems: {', '.join(systems)}; sims {fleet.addrs}; {info}", flush=True)
        turns = [(r, rate) for r in range(a.rounds) for rate in a.rates]
        for turn, (rnd, rate) in enumerate(turns):
            for system in systems[turn % len(systems) :] + systems[: turn % len(systems)]:
                n = int(rate * a.cell_seconds / a.time_scale) + 1
                rng = random.Random(hash(rate) & 0xFFFF)
                if a.same_groups:  # one dataset a system, at every rate
                    bodies = chat_requests(rng, n, a, system, random.Random(0))
                else:
                    salt = f"{rate}-{system}-{time.monotonic_ns()}"
                    bodies = chat_requests(rng, n, a, salt, rng)
                arrivals = wl.poisson_arrivals(random.Random(1234), n, rate)
                cell = await run_cell(fleet, system, bodies, arrivals)
                cell["rate"], cell["round"] = rate, rnd
                cells.append(cell)
                print(
                    f"round {rnd + 1} rate {rate:5.1f} {system:12s} ok {cell['ok']:4d}/{cell['sent']:<4d}"
                    f" TTFT p50 {cell['ttft_p50'] * 1000:7.1f} p90 {cell['ttft_p90'] * 1000:7.1f}"
                    f" p99 {cell['ttft_p99'] * 1000:7.1f} late p90 {cell['late_p90'] * 1000:6.1f}"
                    f" ms goodput {cell['goodput']:5.1f}/s"
                    f" hit {cell['hit_rate']:.2f}"
                    + (
                        f" predicted/actual cached {cell['predicted'] / cell['cached']:.3f}"
                        if cell["predicted"] is not None and cell["cached"]
                        else ""
                    ),
                    flush=True,
                )
    finally:
        fleet.stop()
    return {"machine": info, "load_after": os.getloadavg(), "args": vars(a), "cells": cells}


def accuracy(cells: list[dict[str, Any]], system: str) -> float | None:
    """Predicted / actual prompt tokens served from cache over the run (None: nothing served
    from cache, or no predictions)."""
    mine = [c for c in cells if c["system"] == system and c["predicted"] is not None]
    cached = sum(c["cached"] for c in mine)
    return sum(c["predicted"] for c in mine) / cached if mine and cached else None


def merged(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One cell per (rate, system), in the order of their first round: each figure the median
    over the rounds, requests summed, and the TTFT p90's (min, max) as ``p90_range``."""
    groups: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["rate"], c["system"]), []).append(c)
    out = []
    for (rate, system), cs in groups.items():
        cell: dict[str, Any] = {"rate": rate, "system": system}
        for key in ("ttft_p50", "ttft_p90", "ttft_p99", "late_p90", "goodput", "tok_s", "hit_rate"):
            cell[key] = statistics.median(c[key] for c in cs)
        for key in ("ok", "sent", "cached"):
            cell[key] = sum(c[key] for c in cs)
        predicted = [c["predicted"] for c in cs if c["predicted"] is not None]
        cell["predicted"] = sum(predicted) if predicted else None
        cell["p90_range"] = (min(c["ttft_p90"] for c in cs), max(c["ttft_p90"] for c in cs))
        out.append(cell)
    return out


def report(res: dict[str, Any]) -> str:
    a = res["args"]
    cells = res["cells"]
    out = [
        f"Command: `python -m bench.precise_routing --sims {a['sims']} --time-scale "
        f"{a['time_scale']:g} --cell-seconds {a['cell_seconds']:g} --rates "
        f"{' '.join(f'{r:g}' for r in a['rates'])}"
        + (f" --rounds {a['rounds']}" if a.get("rounds", 1) > 1 else "")
        + (" --same-groups" if a.get("same_groups") else "")
        + (f" --gateways {a['gateways']}" if a.get("gateways", 1) > 1 else "")
        + (f" --systems {' '.join(a['systems'])}" if a["systems"] != SYSTEMS else "")
        + f"` ({machine_line(res['machine'], res['load_after'])}). "
        f"{a['groups']} groups x {a['prefix_tokens']:,}-token prefix, {a['users']} users a group "
        f"with {a['user_tokens']} tokens of their own, {a['output_tokens']} output tokens streamed; "
        f"{a['num_blocks']} KV blocks (x16 tokens) a sim. Simulated seconds (real / "
        f"{a['time_scale']:g}); goodput: requests a second with TTFT <= {a['slo_ttft']:g} s.",
        "",
    ]
    headers = ["rate req/s", "system", "ok / sent", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms",
               "2nd half p90 ms", "goodput req/s", "out tok/s", "hit", "predicted / served"]  # fmt: skip
    rounds = a.get("rounds", 1)
    if rounds > 1:
        headers.insert(5, "p90 range ms")
    rows = []
    for c in merged(cells):
        row = [
            f"{c['rate']:g}",
            c["system"],
            f"{c['ok']}/{c['sent']}",
            f"{c['ttft_p50'] * 1000:.0f}",
            f"{c['ttft_p90'] * 1000:.0f}",
            f"{c['ttft_p99'] * 1000:.0f}",
            f"{c['late_p90'] * 1000:.0f}",
            f"{c['goodput']:.1f}",
            f"{c['tok_s']:,.0f}",
            f"{c['hit_rate']:.2f}",
            f"{c['predicted'] / c['cached']:.3f}"
            if c["predicted"] is not None and c["cached"]
            else "-",
        ]
        if rounds > 1:
            row.insert(5, "-".join(f"{x * 1000:.0f}" for x in c["p90_range"]))
        rows.append(row)
    out += [table(headers, rows, "ll" + "r" * (len(headers) - 2)), ""]
    for system, index in (("precise", "precise index"), ("approximate", "approximate index")):
        ratio = accuracy(cells, system)
        if ratio is not None:
            out.append(
                f"- {index}: prompt tokens predicted cached / served from cache over the run "
                f"{ratio:.3f} (error {abs(ratio - 1):.1%})"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sims", type=int, default=8)
    p.add_argument("--time-scale", type=float, default=4.0)
    p.add_argument("--groups", type=int, default=64)
    p.add_argument("--users", type=int, default=5)
    p.add_argument("--prefix-tokens", type=int, default=3000)
    p.add_argument("--user-tokens", type=int, default=600)
    p.add_argument("--question-tokens", type=int, default=16)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--num-blocks", type=int, default=0, help="0: a third of all prefixes")
    p.add_argument("--rates", type=float, nargs="+", default=[10.0, 20.0, 30.0, 40.0, 50.0])
    p.add_argument("--cell-seconds", type=float, default=40.0, help="real seconds a cell")
    p.add_argument("--rounds", type=int, default=1, help="cells a (rate, system): medians")
    p.add_argument("--same-groups", action="store_true", help="one dataset a system, all cells")
    p.add_argument("--gateways", type=int, default=1, help="routers a system, used in turn")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--slo-ttft", type=float, default=1.0, help="goodput's TTFT bound, sim s")
    p.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    p.add_argument(
        "--section", default="", help="default: precise-routing[-same-groups][-N-gateways]"
    )
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--precise-config", default="", help="an EndpointPickerConfig for precise")
    p.add_argument("--approximate-config", default="", help="... and for approximate")
    p.add_argument("--logs", default="", help="write each router's output (access logs) here")
    a = p.parse_args(argv)
    if not a.num_blocks:
        a.num_blocks = a.groups * a.prefix_tokens // 3 // BLOCK
    a.section = a.section or (
        "precise-routing"
        + ("-same-groups" if a.same_groups else "")
        + (f"-{a.gateways}-gateways" if a.gateways > 1 else "")
    )
    res = asyncio.run(run_all(a))
    text = report(res)
    print(text)
    if a.no_write:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{a.section}.json").write_text(json.dumps(res, indent=1, default=str))
    print(f"wrote {write_section(a.section, text)}")


if __name__ == "__main__":
    main()
