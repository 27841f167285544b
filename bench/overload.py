"""Overload: about 3x the fleet's capacity from two tenants (one sending 10x the other's rate)
plus Critical and Sheddable traffic, with flow control off (today's behaviour) and on.

    python -m bench.overload [--replicas 2] [--max-num-seqs 8] [--time-scale 10]
                             [--prompt-tokens 400] [--max-tokens 10] [--duration 60]
                             [--shape fixed|mixed] [--load 3.0] [--ttl 10] [--seed 1]
                             [--cap-inflight N]
                             [--max-prefilling N[,N...]] [--reserve N[,N...]]
                             [--variant SETTING=N[,...]]... [--skip PHASE[,...]]
                             [--write [--section NAME]]

The fleet: ``--replicas`` sim engines (``--max-num-seqs`` running sequences each, modelled
time slowed by ``--time-scale`` so the client and the gateway are far from the CPU limit).
Each request is a streamed completion of ``--prompt-tokens`` fresh tokens (no prefix-cache
hits) and exactly ``--max-tokens`` output tokens; with ``--shape mixed`` instead lengths in the
range of ShareGPT chat: prompts and outputs drawn from clipped lognormals (``MIXED``: prompts
50-1000 tokens around a median of 200, outputs 20-300 around 80), the same lengths for the
same arrival in every phase. Four Tenants with keys: ``big`` and
``small`` (Default; big sends 10x small's rate), ``critical`` (Critical) and ``bulk``
(Sheddable). Offered load per class, in units of the measured capacity C: small 0.1 C,
big 1.0 C, critical 0.4 C, bulk 1.5 C (x ``--load`` / 3).

Steps, one ``llmplane gateway`` process each over the same engines (``saturationQueue: 0``:
an engine with any request waiting counts as saturated; ``flowControlTtl: --ttl``; with
``--cap-inflight N`` also ``saturationMaxInflight: N``; with ``--max-prefilling N`` one more
gateway per N, flow control on with ``saturationMaxPrefilling: N``):
1. capacity C: a closed loop keeping every replica's queue full (twice its sequences in
   flight), completions per second over 15 s after 5 s of warm-up;
2. unloaded: the small tenant alone at its rate (its TTFT is the goal's reference);
3. flow control off, then on (then on with the prefill rule): Poisson arrivals per class for
   ``--duration`` seconds, the same arrivals in every phase, every request followed to its end
   (client timeout 300 s).
``--reserve N`` adds a phase with ``flowControlReserve: N`` (and the first --max-prefilling);
``--variant maxPrefilling=1,reserve=1,maxInflight=7`` a phase with those settings;
``enginePriority=1`` in a variant runs the sims with ``--scheduling-policy priority`` and has
that phase's gateway see them as priority engines (Endpoints with ``schedulingPolicy:
priority``: it sends each request's band and share as ``priority``); the other phases' gateways
see them as fcfs engines and send no priority, so those engines serve in arrival order as
before (a priority engine ranks requests of equal priority by arrival).
Reported per class: success rate (200 and the whole stream), 429s, other failures, TTFT p50 /
p95 / p99 of the successful ones; and for the small tenant and Critical, where their TTFT
went (the sims run with ``--report-timing``: before the engine, the engine step in progress
at arrival, the engine's queue, the request's own prefill step, the way back). ``--write`` puts the table into docs/benchmarks.md (the section
``--section``, default ``overload``).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from bench.common import (
    gateway_proc,
    machine,
    machine_line,
    percentile,
    store_objects,
    table,
    write_section,
)
from llmplane import testing
from llmplane.testing import Process

MODEL = "overload"
CLASSES = {  # tenant -> (criticality, share of the offered load in units of 0.1 C at 3x)
    "small": ("Default", 1),
    "big": ("Default", 10),
    "critical": ("Critical", 4),
    "bulk": ("Sheddable", 15),
}
# --shape mixed: (median, sigma of its log, min, max) of the prompt and the output tokens, a
# lognormal clipped to the range of ShareGPT-style chat turns (seeded: the same in every phase).
MIXED = {"prompt": (200, 0.8, 50, 1000), "output": (80, 0.8, 20, 300)}
TIMING = b": llmplane-sim-timing "  # the sims' --report-timing comment
WORDS = [c + v + d for c in "bcdfghjklmnprstvz" for v in "aeiou" for d in "bcdfghjklmnprstvz"]


@dataclass
class Outcome:
    status: int = 0
    ttft: float | None = None  # seconds to the first content chunk
    complete: bool = False  # the stream ended with [DONE]
    error: str = ""
    sent: float = 0.0  # perf_counter when the request was sent
    timing: dict | None = None  # the sim's engine-side timestamps (--report-timing)

    def parts(self) -> tuple[float, ...] | None:
        """The TTFT in parts, seconds: before the engine (the gateway: its flow-control
        queue, routing, the hop), the engine step in progress at arrival, the engine's
        waiting queue, its own prefill step(s), the first chunk's way back; and how many
        sequences shared its prefill step."""
        t = self.timing
        if t is None or self.ttft is None or t.get("first_token") is None:
            return None
        arrival, scheduled, first = t["arrival"], t["scheduled"], t["first_token"]
        step = t["first_step"] if t.get("first_step") is not None else scheduled
        return (
            arrival - self.sent,
            step - arrival,
            scheduled - step,
            first - scheduled,
            self.sent + self.ttft - first,
            t.get("batch_prefills", 0),
        )


@dataclass
class ClassResult:
    outcomes: list[Outcome] = field(default_factory=list)

    def row(self, name: str, reference: float | None = None) -> list[object]:
        n = len(self.outcomes)
        ok = [o for o in self.outcomes if o.status == 200 and o.complete]
        refused = sum(1 for o in self.outcomes if o.status == 429)
        ttfts = [o.ttft for o in ok if o.ttft is not None]
        p50 = percentile(ttfts, 50) * 1000 if ttfts else float("nan")
        p99 = percentile(ttfts, 99) * 1000 if ttfts else float("nan")
        p95 = percentile(ttfts, 95) * 1000 if ttfts else float("nan")
        ratio = f"{p99 / (reference * 1000):.2f}x" if reference and ttfts else ""
        return [
            name,
            n,
            f"{100 * len(ok) / n:.1f} %" if n else "-",
            refused,
            n - len(ok) - refused,
            f"{p50:.0f}",
            f"{p95:.0f}",
            f"{p99:.0f}",
            ratio,
        ]

    def breakdown(self, name: str) -> list[list[object]]:
        """Where the TTFT went: the mean parts (ms) of all successful requests and of the
        slowest 5 % of them (at least one)."""
        timed = sorted(
            (o for o in self.outcomes if o.status == 200 and o.complete and o.parts()),
            key=lambda o: o.ttft or 0.0,
        )
        if not timed:
            return []
        rows = []
        for label, group in (("all", timed), ("slowest 5 %", timed[-max(1, len(timed) // 20) :])):
            parts = [o.parts() for o in group]
            mean = [sum(p[i] for p in parts) / len(parts) for i in range(6)]  # type: ignore[index]
            ttft = sum(o.ttft or 0.0 for o in group) / len(group)
            rows.append(
                [f"{name}, {label} ({len(group)})", f"{ttft * 1000:.0f}"]
                + [f"{v * 1000:.0f}" for v in mean[:5]]
                + [f"{mean[5]:.1f}"]
            )
        return rows


def tenant_object(name: str, criticality: str, made: object) -> dict:
    return {
        "apiVersion": "llmplane.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "criticality": criticality,
            "keys": [{"id": made.id, "salt": made.salt, "hash": made.hash}],  # type: ignore[attr-defined]
        },
    }


def prompt(rng: random.Random, tokens: int) -> str:
    """``tokens`` sim tokens (4 characters each) that no other request shares."""
    return "".join(" " + rng.choice(WORDS) for _ in range(tokens))


async def one(
    session: aiohttp.ClientSession, url: str, key: str, body: bytes, out: list[Outcome]
) -> None:
    o = Outcome()
    out.append(o)
    t0 = o.sent = time.perf_counter()
    try:
        async with session.post(
            url,
            data=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        ) as r:
            o.status = r.status
            if r.status != 200:
                await r.read()
                return
            async for line in r.content:
                if line.startswith(b"data: [DONE]"):
                    o.complete = True
                elif o.ttft is None and line.startswith(b"data: ") and b'"text"' in line:
                    o.ttft = time.perf_counter() - t0
                elif line.startswith(TIMING):
                    o.timing = orjson.loads(line[len(TIMING) :])[0]
    except (aiohttp.ClientError, TimeoutError) as err:
        o.error = f"{type(err).__name__}: {err}"


def lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return min(high, max(low, round(rng.lognormvariate(math.log(median), sigma))))


def lengths(rng: random.Random, args: argparse.Namespace) -> tuple[int, int]:
    """A request's prompt and output tokens: the fixed ones, or drawn (``--shape mixed``)."""
    if args.shape == "fixed":
        return args.prompt_tokens, args.max_tokens
    return lognormal(rng, *MIXED["prompt"]), lognormal(rng, *MIXED["output"])


def request_body(
    rng: random.Random, args: argparse.Namespace, size: tuple[int, int] | None = None
) -> bytes:
    """A fresh prompt from ``rng``; of ``size`` (prompt, output tokens), else drawn from
    ``rng`` too."""
    prompt_tokens, max_tokens = size or lengths(rng, args)
    return orjson.dumps(
        {
            "model": MODEL,
            "prompt": prompt(rng, prompt_tokens),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
    )


async def open_loop(
    url: str,
    keys: dict[str, str],
    rates: dict[str, float],
    seconds: float,
    seed: int,
    args,
    phase: str,
) -> dict[str, ClassResult]:
    """Poisson arrivals per class at ``rates`` (req/s) for ``seconds``; every request to its end.
    The arrival times are the same in every phase, the prompts are the ``phase``'s own: the
    sims keep a prefix cache, and a phase that sent an earlier phase's prompts again would
    find most of its prefills done already."""
    results = {name: ClassResult() for name in rates}
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as session:
        tasks: list[asyncio.Task] = []

        async def arrivals(name: str, rate: float) -> None:
            rng = random.Random(f"{seed}-{name}")
            prompts = random.Random(f"{seed}-{name}-{phase}")
            end = time.monotonic() + seconds
            next_at = time.monotonic()
            while True:
                next_at += rng.expovariate(rate)
                if next_at >= end:
                    return
                size = lengths(rng, args)  # the arrival's, the same in every phase
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                body = request_body(prompts, args, size)
                out = results[name].outcomes
                tasks.append(asyncio.create_task(one(session, url, keys[name], body, out)))

        await asyncio.gather(*(arrivals(n, r) for n, r in rates.items() if r > 0))
        await asyncio.gather(*tasks)
    return results


async def capacity(
    url: str, key: str, concurrency: int, seconds: float, args, warmup: float = 5.0
) -> float:
    """Completions per second with ``concurrency`` requests always outstanding, counted over
    ``seconds`` after ``warmup`` seconds of the same load."""
    done = 0
    start = time.monotonic() + warmup
    stop = start + seconds
    rng = random.Random("capacity")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            nonlocal done
            out: list[Outcome] = []
            while time.monotonic() < stop:
                await one(session, url, key, request_body(rng, args), out)
                if out[-1].complete and start <= time.monotonic() < stop:
                    done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / seconds


async def serving(url: str, keys: dict[str, str], args, timeout: float = 120.0) -> None:
    """Wait until ``url`` serves a request with every key (a gateway starting on a loaded
    machine may not have read the Tenants yet: 401)."""
    deadline = time.monotonic() + timeout
    rng = random.Random("ready")
    async with aiohttp.ClientSession() as session:
        for key in keys.values():
            while True:
                out: list[Outcome] = []
                await one(session, url, key, request_body(rng, args), out)
                if out[0].complete:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{url} does not serve: {out[0]}")
                await asyncio.sleep(0.2)


def shape_text(args: argparse.Namespace) -> str:
    if args.shape == "fixed":
        return f"{args.prompt_tokens} prompt + {args.max_tokens} output tokens"
    (pm, ps, plo, phi), (om, os_, olo, ohi) = MIXED["prompt"], MIXED["output"]
    rng = random.Random("shape")
    drawn = [lengths(rng, args) for _ in range(10000)]
    means = [sum(d[i] for d in drawn) / len(drawn) for i in (0, 1)]
    return (
        f"mixed lengths (lognormal, clipped): prompts median {pm} sigma {ps} in {plo}-{phi} "
        f"tokens (mean {means[0]:.0f}), outputs median {om} sigma {os_} in {olo}-{ohi} "
        f"(mean {means[1]:.0f})"
    )


def gateway(
    state: str,
    work: Path,
    name: str,
    flow_control: bool,
    ttl: float,
    cap: int,
    prefilling: int = 0,
    reserve: int = 0,
) -> Process:
    config = work / f"{name}.yaml"
    config.write_text(
        f"gateway:\n  saturationQueue: 0\n  saturationMaxInflight: {cap}\n"
        f"  saturationMaxPrefilling: {prefilling}\n  flowControlTtl: {ttl}\n"
        f"  flowControlReserve: {reserve}\n"
    )
    flag = "--flow-control" if flow_control else "--no-flow-control"
    return gateway_proc(state, "--config", str(config), flag, name=name)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--prompt-tokens", type=int, default=400)
    p.add_argument("--max-tokens", type=int, default=10)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument(
        "--shape",
        choices=("fixed", "mixed"),
        default="fixed",
        help="request lengths: --prompt-tokens / --max-tokens, or mixed (ShareGPT-like)",
    )
    p.add_argument("--load", type=float, default=3.0, help="offered load / capacity")
    p.add_argument("--ttl", type=float, default=10.0, help="flowControlTtl, seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--write", action="store_true", help="write docs/benchmarks.md's section")
    p.add_argument("--section", default="overload", help="the section --write replaces")
    p.add_argument(
        "--cap-inflight",
        type=int,
        default=0,
        metavar="N",
        help="saturationMaxInflight: never more than N in flight to a replica (0: no cap)",
    )
    p.add_argument(
        "--max-prefilling",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[],
        metavar="N[,N...]",
        help="also run flow control on with saturationMaxPrefilling: N, a phase per N",
    )
    p.add_argument(
        "--reserve",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[],
        metavar="N[,N...]",
        help="also run flow control on with flowControlReserve: N (and the first "
        "--max-prefilling), a phase per N",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="SETTING=N[,...]",
        help="also run flow control on with these gateway settings (maxPrefilling, reserve, "
        "maxInflight, enginePriority), a phase per --variant, e.g. maxPrefilling=1,reserve=1",
    )
    p.add_argument(
        "--skip",
        type=lambda text: text.split(","),
        default=[],
        metavar="PHASE[,...]",
        help="phases not to run: off, on (a quicker look at the others)",
    )
    args = p.parse_args(argv)
    inflight_cap = args.cap_inflight
    modes = {"off": "flow control off", "on": "flow control on"}
    for n in args.max_prefilling:
        modes[f"prefill{n}"] = f"on + maxPrefilling {n}"
    reserve_prefilling = args.max_prefilling[0] if args.max_prefilling else 0
    for n in args.reserve:
        extra = f" + maxPrefilling {reserve_prefilling}" if reserve_prefilling else ""
        modes[f"reserve{n}"] = f"on{extra} + reserve {n}"
    variants = {}
    for i, spec in enumerate(args.variant):
        settings = dict(item.split("=") for item in spec.split(","))
        unknown = set(settings) - {"maxPrefilling", "reserve", "maxInflight", "enginePriority"}
        if unknown:
            p.error(f"--variant {spec}: unknown setting(s) {sorted(unknown)}")
        variants[f"variant{i}"] = {k: int(v) for k, v in settings.items()}
        modes[f"variant{i}"] = "on + " + " + ".join(f"{k} {v}" for k, v in settings.items())
    for name in args.skip:
        modes.pop(name, None)
    engine_priority = any(v.get("enginePriority") for v in variants.values())

    from llmplane.gateway import apikeys
    from llmplane.gateway.discovery.store_endpoints import endpoint_object

    info = machine()
    work = Path(tempfile.mkdtemp(prefix="llmplane-overload-"))
    state = str(work / "state")
    procs: list[Process] = []
    try:
        sim_args = (
            "--max-num-seqs",
            str(args.max_num_seqs),
            "--time-scale",
            str(args.time_scale),
            "--report-timing",
            *(("--scheduling-policy", "priority") if engine_priority else ()),
        )
        sims = [testing.sim_process(MODEL, *sim_args).launch() for _ in range(args.replicas)]
        procs += sims
        addresses = [s.ready() for s in sims]
        keys = {}
        tenants = []
        for name, (criticality, _) in CLASSES.items():
            made = apikeys.new_key()
            keys[name] = made.key
            tenants.append(tenant_object(name, criticality, made))
        store_objects(
            state,
            *(endpoint_object(f"sim{i}", a, MODEL) for i, a in enumerate(addresses)),
            *tenants,
        )
        # The same engines, as priority engines, for the enginePriority phases' gateways.
        prio_state = str(work / "state-priority")
        if engine_priority:
            store_objects(
                prio_state,
                *(
                    endpoint_object(f"sim{i}", a, MODEL, scheduling_policy="priority")
                    for i, a in enumerate(addresses)
                ),
                *copy.deepcopy(tenants),
            )
        gws = {"off": gateway(state, work, "off", False, args.ttl, inflight_cap)}
        if "on" in modes:
            gws["on"] = gateway(state, work, "on", True, args.ttl, inflight_cap)
        for n in args.max_prefilling:
            gws[f"prefill{n}"] = gateway(
                state, work, f"prefill{n}", True, args.ttl, inflight_cap, n
            )
        for name, v in variants.items():
            gws[name] = gateway(
                prio_state if v.get("enginePriority") else state,
                work,
                name,
                True,
                args.ttl,
                v.get("maxInflight", inflight_cap),
                v.get("maxPrefilling", 0),
                v.get("reserve", 0),
            )
        for n in args.reserve:
            gws[f"reserve{n}"] = gateway(
                state, work, f"reserve{n}", True, args.ttl, inflight_cap, reserve_prefilling, n
            )
        procs += gws.values()
        urls = {n: f"http://{g.ready()}/v1/completions" for n, g in gws.items()}
        for url in urls.values():  # the Tenants read, the engines scraped
            asyncio.run(serving(url, keys, args))

        slots = args.replicas * args.max_num_seqs
        cap = asyncio.run(capacity(urls["off"], keys["big"], 2 * slots, 15.0, args))
        if cap <= 0:
            raise SystemExit("no request completed while measuring the capacity")
        print(f"capacity: {cap:.1f} req/s ({slots} slots)", flush=True)
        unit = cap * args.load / 30
        rates = {name: share * unit for name, (_, share) in CLASSES.items()}
        base = asyncio.run(
            open_loop(
                urls["on" if "on" in urls else next(iter(urls))],
                keys,
                {"small": rates["small"]},
                args.duration,
                args.seed,
                args,
                "unloaded",
            )
        )["small"]
        ok = [o.ttft for o in base.outcomes if o.status == 200 and o.complete and o.ttft]
        reference = percentile(ok, 99)
        print(f"unloaded small tenant: TTFT p50 {percentile(ok, 50) * 1000:.0f} ms, "
              f"p99 {reference * 1000:.0f} ms", flush=True)  # fmt: skip
        runs = {}
        for mode, label in modes.items():
            t0 = time.monotonic()
            runs[mode] = asyncio.run(
                open_loop(urls[mode], keys, rates, args.duration, args.seed, args, mode)
            )
            print(f"{label}: {time.monotonic() - t0:.0f} s", flush=True)
        load_after = os.getloadavg()
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(work, ignore_errors=True)

    headers = ["class", "requests", "success", "429", "other", "TTFT p50 ms", "TTFT p95 ms",
               "TTFT p99 ms", "p99 / unloaded p99"]  # fmt: skip
    rows = [["unloaded: small alone", *base.row("")[1:]]]
    parts = base.breakdown("unloaded: small")
    for mode, phase in modes.items():
        for name, (criticality, _) in CLASSES.items():
            label = f"{phase}: {name} ({criticality})"
            rows.append(runs[mode][name].row(label, reference))
        if mode != "off":
            for name in ("small", "critical"):
                parts += runs[mode][name].breakdown(f"{phase}: {name}")
    parts_headers = ["requests", "TTFT ms", "gateway ms", "step in progress ms",
                     "engine queue ms", "own prefill ms", "back ms", "prefills in its step"]  # fmt: skip
    rate_text = ", ".join(f"{n} {r:.1f}" for n, r in rates.items())
    text = "\n".join(
        [
            f"`python -m bench.overload {' '.join(sys.argv[1:] if argv is None else argv)}`".replace(
                " `", "`"
            ),
            "",
            f"Fleet: {args.replicas} sim replicas x {args.max_num_seqs} sequences, time scale "
            f"{args.time_scale:g}, {shape_text(args)} per streamed request; measured capacity {cap:.1f} req/s. Offered for "
            f"{args.duration:g} s at {args.load:g}x: {rate_text} req/s. Flow control TTL "
            f"{args.ttl:g} s, saturationQueue 0, saturationMaxInflight {inflight_cap} (0: none)"
            + (
                "; maxPrefilling N: also saturationMaxPrefilling N." if args.max_prefilling else "."
            ),
            "",
            table(headers, rows),
            "",
            "Where the TTFT went (means; the sims' clocks): before the engine (the gateway's "
            "queue and hop), the engine step in progress when it arrived, the engine's waiting "
            "queue, its own prefill step, the first chunk's way back to the client:",
            "",
            table(parts_headers, parts),
            "",
            machine_line(info, load_after),
        ]
    )
    print(text)
    if args.write:
        write_section(args.section, text)


if __name__ == "__main__":
    main()
