"""Routing quality: a fleet of simulated vLLM servers behind each router and policy.

    python -m bench.routing [--sims 8] [--time-scale 2] [--cell-seconds 8] [--no-write]
                            [--workloads shared_prefix multi_round mixed lora]

Fleet: ``--sims`` ``python -m llmplane.sim`` processes (the sim's default latency model: an
8B model on one H100, see docs/sim.md) with ``--num-blocks`` KV blocks of 16 tokens each
(default 1536 = 24,576 tokens: smaller than the workloads' working sets, so where a request
lands decides whether its prefix is cached), ``--max-loras 4`` and 16 LoRA adapters per
policy. Every modelled delay is multiplied by ``--time-scale`` (the sims run that much slower
than an H100 so 8 of them, a router and the load generator fit on 2 cores): all rates and
latencies below are converted back to simulated seconds (real / scale); the router's and the
client's own real-time overhead is divided by the scale too, so it is understated.

Routers, all started once and used in turns:
- llmplane (one gateway process; one Kthena ModelServer + ModelRoute per policy, each
  ModelServer annotated with its scheduling profile): ``rr`` (round-robin scorer: the
  Kubernetes Service baseline), ``random``, ``least-request``, ``prefix-spread`` (the shipped
  default, DEFAULT_CONFIG: a queue-margin filter at 64, then prefix-cache x6, least-request x2,
  kv-cache x1, prefix-spread x3), ``prefix-margin`` (the default before: the same without
  prefix-spread), ``prefix-guard`` (the default before that: a low-queue filter at 5, then
  prefix-cache x3, least-request x2, kv-cache x1), ``ie-blend`` (the Inference Extension's v1.5 blend: queue x2, kv-cache x2,
  prefix-cache x3, plus least-request x1; the default before), ``ie-blend+lora`` (plus
  lora-affinity x2), and the candidates ``prefix-lr`` (prefix-guard without the filter) and
  ``prefix-lrq`` (prefix-lr plus queue x1), not in the default set;
- vllm-router (Rust, PyPI), one process per policy: ``cache_aware``, ``power_of_two``,
  ``consistent_hash``.

Workloads (bench/workloads.py): shared-prefix groups, multi-round chat, mixed lengths with
bursty arrivals, a LoRA mix over 16 adapters. Open-loop Poisson arrivals, bounded in count
and time (``--cell-seconds`` of real time per cell, then in-flight requests finish or time
out). Every cell uses fresh text (a salt), so no cell profits from another's cache.

Metrics per cell: TTFT p50/p90/p99, end-to-end p50/p99, completed req/s and output tok/s
(simulated seconds), prefix-cache hit rate (sums of the sims' ``vllm:prefix_cache_hits`` /
``queries`` deltas), load imbalance (max / mean of the sims' completed-request deltas), errors,
and the load generator's lateness (p99 of send time minus scheduled time, real ms: large
values mean the generator, not the fleet, was the bottleneck).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from bench import workloads as wl
from bench.common import (
    IMG,
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
from llmplane.gateway.scheduler.config import DEFAULT_CONFIG
from llmplane.testing import Process

LLMPLANE_POLICIES = [
    "rr",
    "random",
    "least-request",
    "ie-blend",
    "ie-blend+lora",
    "prefix-lr",
    "prefix-guard",
    "prefix-margin",
    "prefix-lrq",
    "prefix-spread",
]
VLLM_ROUTER_POLICIES = ["cache_aware", "power_of_two", "consistent_hash"]
ADAPTERS = 16
BASE_MODEL = "sim-model"

PROFILES: dict[str, list[dict[str, Any]]] = {
    "rr": [{"pluginRef": "round-robin-scorer"}, {"pluginRef": "max-score-picker"}],
    "random": [{"pluginRef": "random-picker"}],
    "least-request": [{"pluginRef": "least-request-scorer"}, {"pluginRef": "max-score-picker"}],
    # The Inference Extension's v1.5 blend (plus least-request x1): llmplane's default until
    # the routing benchmark picked prefix-guard.
    "ie-blend": [
        {"pluginRef": "model-served-filter"},
        {"pluginRef": "queue-scorer", "weight": 2},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
        {"pluginRef": "prefix-cache-scorer", "weight": 3},
        {"pluginRef": "least-request-scorer", "weight": 1},
        {"pluginRef": "max-score-picker"},
    ],
    "ie-blend+lora": [
        {"pluginRef": "model-served-filter"},
        {"pluginRef": "queue-scorer", "weight": 2},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
        {"pluginRef": "prefix-cache-scorer", "weight": 3},
        {"pluginRef": "least-request-scorer", "weight": 1},
        {"pluginRef": "lora-affinity-scorer", "weight": 2},
        {"pluginRef": "max-score-picker"},
    ],
    "prefix-lr": [
        {"pluginRef": "model-served-filter"},
        {"pluginRef": "prefix-cache-scorer", "weight": 3},
        {"pluginRef": "least-request-scorer", "weight": 2},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
        {"pluginRef": "max-score-picker"},
    ],
    # The shipped default (DEFAULT_CONFIG in llmplane/gateway/scheduler/config.py).
    "prefix-spread": DEFAULT_CONFIG["schedulingProfiles"][0]["plugins"],
    # The default until bench/precise_routing.py showed its placement of new groups by load
    # (9 to 13 groups of 64 on the busiest of 8 sims) setting the TTFT p90.
    "prefix-margin": [
        {"pluginRef": "model-served-filter"},
        {"pluginRef": "queue-margin-filter"},
        {"pluginRef": "prefix-cache-scorer", "weight": 6},
        {"pluginRef": "least-request-scorer", "weight": 2},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
        {"pluginRef": "max-score-picker"},
    ],
    # The default until bench/precise_routing.py showed its filter breaking affinity under load.
    "prefix-guard": [
        {"pluginRef": "model-served-filter"},
        {"pluginRef": "low-queue-filter"},
        {"pluginRef": "prefix-cache-scorer", "weight": 3},
        {"pluginRef": "least-request-scorer", "weight": 2},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
        {"pluginRef": "max-score-picker"},
    ],
    "prefix-lrq": [
        {"pluginRef": "model-served-filter"},
        {"pluginRef": "prefix-cache-scorer", "weight": 3},
        {"pluginRef": "least-request-scorer", "weight": 2},
        {"pluginRef": "queue-scorer", "weight": 1},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
        {"pluginRef": "max-score-picker"},
    ],
}


# The parameters of the filters (the shipped default's from DEFAULT_CONFIG).
PARAMETERS = {"low-queue-filter": {"threshold": 5}} | {
    p["type"]: p["parameters"] for p in DEFAULT_CONFIG["plugins"] if "parameters" in p
}


def scheduler_config() -> dict[str, Any]:
    types = sorted({p["pluginRef"] for plist in PROFILES.values() for p in plist})
    return {
        "plugins": [
            {"type": t, "parameters": PARAMETERS[t]} if t in PARAMETERS else {"type": t}
            for t in types
        ],
        "schedulingProfiles": [{"name": n, "plugins": p} for n, p in PROFILES.items()],
    }


def adapter_names(policy: str) -> list[str]:
    tag = re.sub(r"[^a-z0-9]+", "-", policy.lower())
    return [f"{tag}-lora-{k}" for k in range(ADAPTERS)]


def route_objects(policy: str) -> list[dict[str, Any]]:
    kthena = "networking.serving.volcano.sh/v1alpha1"
    tag = re.sub(r"[^a-z0-9]+", "-", policy.lower())
    return [
        {
            "apiVersion": kthena,
            "kind": "ModelServer",
            "metadata": {
                "name": f"ms-{tag}",
                "namespace": "default",
                "annotations": {"llmplane.io/scheduling-profile": policy},
            },
            "spec": {
                "model": BASE_MODEL,
                "inferenceEngine": "vLLM",
                "workloadSelector": {"matchLabels": {"app": "sim"}},
            },
        },
        *(
            {
                "apiVersion": kthena,
                "kind": "ModelRoute",
                "metadata": {"name": f"r-{tag}-{i}", "namespace": "default"},
                "spec": {
                    "modelName": f"m-{tag}" if i == 0 else f"m-{tag}-{i}",
                    # at most 10 adapters a route
                    "loraAdapters": adapter_names(policy)[i * 10 : i * 10 + 10],
                    "rules": [{"targetModels": [{"modelServerName": f"ms-{tag}"}]}],
                },
            }
            for i in range(2)
        ),
    ]


# --- the fleet -----------------------------------------------------------------------------------


class Fleet:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sims: list[Process] = []
        self.sim_addrs: list[str] = []
        self.routers: dict[str, Process] = {}
        self.urls: dict[str, str] = {}  # policy -> chat completions URL
        self.models: dict[str, str] = {}  # policy -> model name to send
        self.state_dir = tempfile.mkdtemp(prefix="bench-routing-")

    def start(self) -> None:
        a = self.args
        policies = a.policies
        loras = [f"{n}=/tmp/adapters/{n}" for p in policies for n in adapter_names(p)]
        for i in range(a.sims):
            argv = [
                "python",
                "-m",
                "llmplane.sim",
                "--model",
                BASE_MODEL,
                "--port",
                "0",
                "--seed",
                str(i),
                "--time-scale",
                str(a.time_scale),
                "--num-blocks",
                str(a.num_blocks),
                "--enable-lora",
                "--max-loras",
                "4",
                "--lora-modules",
                *loras,
            ]
            self.sims.append(launch(f"sim{i}", argv))
        self.sim_addrs = [s.ready() for s in self.sims]
        ours = [p for p in policies if p in LLMPLANE_POLICIES]
        if ours:
            from llmplane.gateway.discovery.store_endpoints import endpoint_object

            store_objects(
                self.state_dir,
                *(
                    endpoint_object(f"sim{i}", addr, BASE_MODEL, labels={"app": "sim"})
                    for i, addr in enumerate(self.sim_addrs)
                ),
                *(obj for p in ours for obj in route_objects(p)),
            )
            cfg = os.path.join(self.state_dir, "scheduler.yaml")
            with open(cfg, "w") as f:
                yaml.safe_dump(scheduler_config(), f)
            gw = gateway_proc(self.state_dir, "--config", cfg)
            self.routers["llmplane"] = gw
            addr = gw.ready()
            for p in ours:
                self.urls[p] = f"http://{addr}/v1/chat/completions"
                self.models[p] = "m-" + re.sub(r"[^a-z0-9]+", "-", p.lower())
        for p in policies:
            if p not in VLLM_ROUTER_POLICIES:
                continue
            if not shutil.which("vllm-router"):
                print(f"skipping vllm-router {p}: not installed (pip install vllm-router)")
                continue
            port = free_port()
            argv = [
                "vllm-router",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--policy",
                p,
                "--prometheus-port",
                str(free_port()),
                "--log-level",
                "warning",
                "--worker-urls",
                *[f"http://{s}" for s in self.sim_addrs],
            ]
            self.routers[p] = launch(f"vllm-router-{p}", argv)
            self.urls[p] = f"http://127.0.0.1:{port}/v1/chat/completions"
            self.models[p] = BASE_MODEL
        probe = orjson.dumps(
            {"model": "", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        )
        for p, url in self.urls.items():
            proc = self.routers["llmplane" if p in LLMPLANE_POLICIES else p]
            proc.wait_http(
                url, probe.replace(b'"model":""', f'"model":"{self.models[p]}"'.encode())
            )

    def stop(self) -> None:
        for p in [*self.routers.values(), *self.sims]:
            p.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)


_METRIC = re.compile(r"^(vllm:[a-z_]+?)(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M)


async def sim_counters(session: aiohttp.ClientSession, addrs: list[str]) -> list[dict[str, float]]:
    async def one(addr: str) -> dict[str, float]:
        async with session.get(f"http://{addr}/metrics") as r:
            text = await r.text()
        out: dict[str, float] = {}
        for name, value in _METRIC.findall(text):
            if name in (
                "vllm:prefix_cache_hits",
                "vllm:prefix_cache_queries",
                "vllm:prompt_tokens_cached",
                "vllm:request_success",
            ):
                out[name] = out.get(name, 0.0) + float(value)
        return out

    return list(await asyncio.gather(*(one(a) for a in addrs)))


# --- load generation -----------------------------------------------------------------------------


async def one_request(
    session: aiohttp.ClientSession, url: str, body: bytes, timeout: float
) -> dict[str, Any]:
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    status = 0
    try:
        async with session.post(
            url,
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as r:
            status = r.status
            if status != 200:
                await r.read()
                return {"ok": False, "status": status, "e2e": time.perf_counter() - t0}
            buf = b""
            async for chunk in r.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if not event.startswith(b"data: ") or event == b"data: [DONE]":
                        continue
                    doc = orjson.loads(event[6:])
                    if ttft is None and any(
                        (c.get("delta") or {}).get("content") for c in doc.get("choices") or ()
                    ):
                        ttft = time.perf_counter() - t0
                    if doc.get("usage"):
                        tokens = doc["usage"].get("completion_tokens") or tokens
    except (aiohttp.ClientError, TimeoutError, OSError) as err:
        return {
            "ok": False,
            "status": status,
            "error": type(err).__name__,
            "e2e": time.perf_counter() - t0,
        }
    return {
        "ok": ttft is not None,
        "status": status,
        "ttft": ttft,
        "tokens": tokens,
        "e2e": time.perf_counter() - t0,
    }


async def run_cell(
    fleet: Fleet,
    policy: str,
    requests: list[wl.Request],
    arrivals: list[float],
    args: argparse.Namespace,
) -> dict[str, Any]:
    scale = args.time_scale
    url, model = fleet.urls[policy], fleet.models[policy]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        before = await sim_counters(session, fleet.sim_addrs)
        bodies = [orjson.dumps(r.body(model if not r.model else r.model)) for r in requests]
        start = time.perf_counter() + 0.05
        deadline = start + args.cell_seconds
        results: list[dict[str, Any]] = []
        lateness: list[float] = []
        tasks = []
        cpu0 = time.process_time()
        for t_sim, body in zip(arrivals, bodies, strict=True):
            t_real = start + t_sim * scale
            if t_real > deadline:
                break
            delay = t_real - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lateness.append(max(0.0, time.perf_counter() - t_real))
            tasks.append(
                asyncio.ensure_future(one_request(session, url, body, args.request_timeout))
            )
        sent_span = time.perf_counter() - start
        results = list(await asyncio.gather(*tasks))
        span = time.perf_counter() - start
        gen_cpu = time.process_time() - cpu0
        after = await sim_counters(session, fleet.sim_addrs)
    ok = [r for r in results if r["ok"]]
    hits = sum(
        a.get("vllm:prefix_cache_hits", 0) - b.get("vllm:prefix_cache_hits", 0)
        for a, b in zip(after, before, strict=True)
    )
    queries = sum(
        a.get("vllm:prefix_cache_queries", 0) - b.get("vllm:prefix_cache_queries", 0)
        for a, b in zip(after, before, strict=True)
    )
    per_sim = [
        a.get("vllm:request_success", 0) - b.get("vllm:request_success", 0)
        for a, b in zip(after, before, strict=True)
    ]
    mean = sum(per_sim) / len(per_sim) if per_sim else 0
    ttft = [r["ttft"] / scale for r in ok]
    e2e = [r["e2e"] / scale for r in ok]
    sim_span = span / scale
    return {
        "policy": policy,
        "sent": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "offered_rps": len(results) / (sent_span / scale) if sent_span else 0.0,
        "rps": len(ok) / sim_span if sim_span else 0.0,
        "tok_s": sum(r["tokens"] for r in ok) / sim_span if sim_span else 0.0,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "ttft_p99": percentile(ttft, 99),
        "e2e_p50": percentile(e2e, 50),
        "e2e_p99": percentile(e2e, 99),
        "hit_rate": hits / queries if queries else float("nan"),
        "imbalance": max(per_sim) / mean if mean else float("nan"),
        "per_sim": per_sim,
        "late_p99_ms": percentile(lateness, 99) * 1000,
        "gen_cpu_util": gen_cpu / span if span else 0.0,
    }


def make_workload(
    name: str, rng: random.Random, salt: str, policy: str, n: int
) -> list[wl.Request]:
    if name == "shared_prefix":
        return wl.shared_prefix(
            rng,
            groups=16,
            per_group=max(1, n // 16) + 1,
            system_tokens=3000,
            question_tokens=64,
            output_tokens=32,
            salt=salt,
        )[:n]
    if name == "multi_round":
        return wl.multi_round(
            rng, users=24, rounds=8, system_tokens=500, user_tokens=150, output_tokens=32, salt=salt
        )[:n]
    if name == "mixed":
        return wl.mixed(rng, n=n, prompt_range=(32, 3000), output_range=(8, 128), salt=salt)
    if name == "lora":
        return wl.lora_mix(
            rng, adapter_names(policy), n=n, prompt_tokens=400, output_tokens=32, salt=salt
        )
    raise ValueError(name)


WORKLOAD_TITLES = {
    "shared_prefix": "shared prefix: 16 groups x 3,000-token system prompt + 64-token question, 32 output tokens",
    "multi_round": "multi-round chat: 24 users x 8 rounds, 500-token system + 150 tokens a turn, 32 output tokens",
    "mixed": "mixed lengths: prompts 32-3,000 and outputs 8-128 tokens (log-uniform), 4x bursts every other 0.5 s",
    "lora": "LoRA mix: 16 adapters, Zipf-like (1/k), 400-token prompts, 32 output tokens, --max-loras 4",
}


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    info = machine()
    fleet = Fleet(args)
    cells: list[dict[str, Any]] = []
    try:
        fleet.start()
        policies = [p for p in args.policies if p in fleet.urls]
        print(f"policies: {', '.join(policies)}; sims {fleet.sim_addrs}; {info}", flush=True)
        turn = 0
        for workload in args.workloads:
            rates = (
                args.rates if workload == "shared_prefix" else [args.rates[len(args.rates) // 2]]
            )
            for rate in rates:
                order = policies[turn % len(policies) :] + policies[: turn % len(policies)]
                turn += 1
                for policy in order:
                    n = int(rate * args.cell_seconds / args.time_scale) + 1
                    rng = random.Random(hash((workload, rate)) & 0xFFFF)
                    salt = f"{workload}-{rate}-{policy}-{time.monotonic_ns()}"
                    reqs = make_workload(workload, rng, salt, policy, n)
                    arr_rng = random.Random(1234)
                    if workload == "mixed":
                        arrivals = wl.poisson_arrivals(
                            arr_rng, len(reqs), rate / 2.5, burst=4, period=0.5
                        )
                    else:
                        arrivals = wl.poisson_arrivals(arr_rng, len(reqs), rate)
                    cell = await run_cell(fleet, policy, reqs, arrivals, args)
                    cell.update(workload=workload, rate=rate)
                    cells.append(cell)
                    print(
                        f"{workload:13s} rate {rate:6.1f} {policy:15s} ok {cell['ok']:4d}/{cell['sent']:<4d}"
                        f" {cell['rps']:6.1f} req/s {cell['tok_s']:8.0f} tok/s"
                        f" TTFT p50 {cell['ttft_p50'] * 1000:7.1f} p90 {cell['ttft_p90'] * 1000:7.1f}"
                        f" p99 {cell['ttft_p99'] * 1000:7.1f} ms  hit {cell['hit_rate']:.2f}"
                        f" imb {cell['imbalance']:.2f} late99 {cell['late_p99_ms']:.1f} ms",
                        flush=True,
                    )
    finally:
        fleet.stop()
    return {"machine": info, "load_after": os.getloadavg(), "args": vars(args), "cells": cells}


def report(res: dict[str, Any]) -> str:
    a = res["args"]
    cells = res["cells"]
    out = [
        f"Command: `python -m bench.routing --sims {a['sims']} --time-scale {a['time_scale']:g} "
        f"--cell-seconds {a['cell_seconds']:g} --rates {' '.join(f'{r:g}' for r in a['rates'])}"
        + (f" --workloads {' '.join(a['workloads'])}" if len(a["workloads"]) < 4 else "")
        + (f" --policies {' '.join(a['policies'])}" if len(a["policies"]) < 9 else "")
        + (f" --section {a['section']}" if a.get("section", "routing") != "routing" else "")
        + f"` ({machine_line(res['machine'], res['load_after'])}). "
        f"{a['sims']} sims, {a['num_blocks']} KV blocks (x16 tokens) each. All figures in "
        f"simulated seconds (real / {a['time_scale']:g}). `hit` = prefix-cache hits / queries "
        "summed over the sims; `imbalance` = max / mean completed requests per sim; `late p99` = "
        "the load generator's p99 send lateness in real ms (small = the generator kept up).",
        "",
    ]
    headers = [
        "rate req/s",
        "policy",
        "ok / sent",
        "req/s",
        "out tok/s",
        "TTFT p50 ms",
        "TTFT p90 ms",
        "TTFT p99 ms",
        "e2e p50 ms",
        "e2e p99 ms",
        "hit",
        "imbalance",
        "late p99",
    ]
    for workload in a["workloads"]:
        rows = []
        for c in cells:
            if c["workload"] != workload:
                continue
            name = c["policy"] if c["policy"] in LLMPLANE_POLICIES else f"vllm-router {c['policy']}"
            if c["policy"] in LLMPLANE_POLICIES:
                name = f"llmplane {c['policy']}"
            rows.append(
                [
                    f"{c['rate']:g}",
                    name,
                    f"{c['ok']}/{c['sent']}",
                    f"{c['rps']:.1f}",
                    f"{c['tok_s']:,.0f}",
                    f"{c['ttft_p50'] * 1000:.0f}",
                    f"{c['ttft_p90'] * 1000:.0f}",
                    f"{c['ttft_p99'] * 1000:.0f}",
                    f"{c['e2e_p50'] * 1000:.0f}",
                    f"{c['e2e_p99'] * 1000:.0f}",
                    f"{c['hit_rate']:.2f}",
                    f"{c['imbalance']:.2f}",
                    f"{c['late_p99_ms']:.1f}",
                ]
            )
        out += [f"**{WORKLOAD_TITLES[workload]}**", "", table(headers, rows, "rl" + "r" * 11), ""]
    prefix = a.get("section", "routing").replace("-", "_")
    out.append(f"![TTFT vs rate](img/{prefix}_ttft.png) ![throughput](img/{prefix}_throughput.png)")
    return "\n".join(out)


def plot(res: dict[str, Any]) -> list[Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = res["cells"]
    prefix = res["args"].get("section", "routing").replace("-", "_")
    IMG.mkdir(parents=True, exist_ok=True)
    paths = []
    sp = [c for c in cells if c["workload"] == "shared_prefix"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))

    def label(policy: str) -> str:
        return f"llmplane {policy}" if policy in LLMPLANE_POLICIES else f"vllm-router {policy}"

    for policy in dict.fromkeys(c["policy"] for c in sp):
        pts = sorted(
            (c["rate"], c["ttft_p90"] * 1000, c["ttft_p50"] * 1000)
            for c in sp
            if c["policy"] == policy
        )
        xs = [p[0] for p in pts]
        axes[0].plot(xs, [p[2] for p in pts], marker="o", label=label(policy))
        axes[1].plot(xs, [p[1] for p in pts], marker="o", label=label(policy))
    for ax, q in zip(axes, ("p50", "p90"), strict=True):
        ax.set_xlabel("offered rate, req/s (simulated)")
        ax.set_ylabel(f"TTFT {q}, ms (simulated)")
        ax.set_yscale("log")
        ax.set_title(f"shared prefix: TTFT {q} vs rate")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(IMG / f"{prefix}_ttft.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    workloads = list(dict.fromkeys(c["workload"] for c in cells))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 4), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        top = max(c["rate"] for c in cells if c["workload"] == w)
        sel = [c for c in cells if c["workload"] == w and c["rate"] == top]
        ax.bar(range(len(sel)), [c["tok_s"] for c in sel])
        ax.set_xticks(
            range(len(sel)), [label(c["policy"]) for c in sel], rotation=60, ha="right", fontsize=7
        )
        ax.set_title(f"{w} @ {top:g} req/s", fontsize=9)
        ax.set_ylabel("output tok/s (simulated)")
    fig.tight_layout()
    paths.append(IMG / f"{prefix}_throughput.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sims", type=int, default=8)
    p.add_argument("--time-scale", type=float, default=2.0)
    p.add_argument("--num-blocks", type=int, default=1536)
    p.add_argument(
        "--cell-seconds", type=float, default=8.0, help="real seconds of arrivals per cell"
    )
    p.add_argument("--request-timeout", type=float, default=60.0)
    p.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=[10.0, 25.0, 50.0],
        help="offered req/s (simulated); the middle one for workloads other than shared_prefix",
    )
    p.add_argument(
        "--workloads",
        nargs="+",
        default=["shared_prefix", "multi_round", "mixed", "lora"],
        choices=list(WORKLOAD_TITLES),
    )
    p.add_argument(
        "--policies",
        nargs="+",
        default=[p for p in LLMPLANE_POLICIES if p not in ("prefix-lr", "prefix-lrq")]
        + VLLM_ROUTER_POLICIES,
        choices=LLMPLANE_POLICIES + VLLM_ROUTER_POLICIES,
    )
    p.add_argument(
        "--section", default="routing", help="report section and image/result file prefix"
    )
    p.add_argument("--no-write", action="store_true")
    p.add_argument(
        "--report-only", metavar="JSON", help="re-render report and plots from saved results"
    )
    args = p.parse_args(argv)
    if args.report_only:
        res = json.loads(Path(args.report_only).read_text())
        res["args"].setdefault("section", args.section)
        for path in plot(res):
            print(f"wrote {path}")
        print(f"wrote {write_section(res['args']['section'], report(res))}")
        return
    res = asyncio.run(run_all(args))
    if args.no_write:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.section}.json").write_text(json.dumps(res, indent=1, default=str))
    for path in plot(res):
        print(f"wrote {path}")
    print(f"wrote {write_section(args.section, report(res))}")


if __name__ == "__main__":
    main()
