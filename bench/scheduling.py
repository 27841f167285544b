"""The scheduler alone: what one pick costs, by fleet size and prompt length.

    python -m bench.scheduling [--iterations 5000] [--repeats 5] [--profile default] [--no-write]
                               [--cells 1000x16000,...] [--precise]

Each cell builds ``endpoints`` EndpointStates with fresh, varied engine metrics (waiting 0-8,
KV use 0-1, 0-4 in flight) and a prefix index warmed with 256 earlier picks, then times,
request by request:

- ``pick``: prompt extraction from the parsed body (chat messages flattened), prefix hashing,
  the profile's filters, scorers and picker (the fallback list of 4);
- ``pick + update``: the same plus ``on_pick`` (the prefix index learns the chosen endpoint's
  blocks), i.e. everything scheduling costs a request;
- ``pick CPU``: the pick's CPU time (``time.thread_time``), which the other processes of a
  shared machine do not inflate: a wall-clock p99 there is mostly the moments this process
  waited for a core.

The prompts are chat requests whose first three quarters are one of 32 system prompts (so
prefixes match on some endpoints) and the rest a fresh question.

``--precise``: every endpoint publishes KV events, so the default profile scores with the
precise-prefix-cache scorer (docs/gateway.md "Precise prefix routing"): the index of the
engines' blocks holds, for each endpoint, the blocks (16 tokens, the sim's tokenizer) of 2 of
the system prompts as their ``BlockStored`` events would report them; a pick hashes the
request's token ids into block keys and walks the index, and ``on_pick`` records its blocks on
their way. After each pick (off the clock) the chosen endpoint reports the request's blocks
stored, as a live engine's ``BlockStored`` does within milliseconds, so the index grows with
the traffic as a live fleet's does. Token ids are computed before the clock starts (tokenizing
is bench/tokenization.py's figure).

One process, nothing else timed; the garbage collector runs as it would in the gateway. The
cells run ``--repeats`` times in turn and each percentile reported is the median over the
repeats (this shared machine's speed drifts by up to 2x within minutes). Writes the
``scheduling`` section of docs/benchmarks.md and bench/results/scheduling.json
(``scheduling-precise`` and scheduling-precise.json with ``--precise``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from typing import Any

from bench.common import RESULTS, machine, machine_line, percentile, table, write_section
from llmplane.gateway.discovery import Endpoint
from llmplane.gateway.kvcache.events import Batch, Stored
from llmplane.gateway.kvcache.index import BlockIndex
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.request import prompt_text
from llmplane.gateway.scheduler.config import build_scheduler
from llmplane.gateway.scheduler.framework import Scheduler, SchedulingContext
from llmplane.gateway.scheduler.precise_prefix import (
    SIM_VOCAB,
    PrecisePrefixCacheScorer,
    use_in_default,
)
from llmplane.sim.tokenizer import render_chat, tokenize

CELLS = [(8, 1_000), (8, 16_000), (64, 1_000), (64, 16_000), (256, 16_000), (1_000, 16_000)]


def _states(n: int, rng: random.Random, now: float) -> list[EndpointState]:
    states = []
    for i in range(n):
        s = EndpointState(Endpoint(f"10.0.{i // 250}.{i % 250}:8000", {}, "m"))
        s.has_load_metrics, s.has_kv, s.scraped_at = True, True, now
        s.waiting, s.kv_usage, s.inflight = rng.randint(0, 8), rng.random(), rng.randint(0, 4)
        states.append(s)
    return states


BLOCK = 16  # the sim's block size: the most keys a prompt has


class _KnownIds:
    """Token ids computed before the clock starts, by request (``ctx.request``: the doc), and
    the index of the endpoints' blocks, which ``stored`` tells what an endpoint computed."""

    def __init__(self, index: BlockIndex) -> None:
        self.ids: dict[int, list[int]] = {}
        self.index = index
        self.serial = 0  # the engines' block hashes, unique

    def stored(self, replica: str, ids: list[int]) -> None:
        """``replica`` reports the full blocks of ``ids`` (its BlockStored event)."""
        hashes = list(range(self.serial, self.serial + len(ids) // BLOCK))
        self.serial += len(hashes)
        ids = ids[: len(hashes) * BLOCK]
        self.index.apply(replica, Batch(0.0, [Stored(hashes, None, ids, BLOCK)]))

    def of(self, doc: dict[str, Any]) -> list[int]:
        ids = self.ids.get(id(doc))
        if ids is None:
            ids = self.ids[id(doc)] = tokenize(render_chat(doc["messages"], True), SIM_VOCAB)
        return ids

    def token_ids(self, ctx: SchedulingContext, engine: str) -> list[int] | None:
        return self.ids.get(id(ctx.request))


def _precise(
    scheduler: Scheduler, states: list[EndpointState], systems: list[dict[str, Any]], rng: Any
) -> _KnownIds:
    """The precise scorer in the default profile, over an index where each endpoint holds the
    blocks of 2 of the system prompts (``systems``: a request of each)."""
    index = BlockIndex()
    known = _KnownIds(index)
    shared = []
    for doc in systems:  # the blocks of the system prompt: those before the question's text
        text = render_chat(doc["messages"], True)
        head = text.index(doc["messages"][1]["content"][:20])
        shared.append(known.of(doc)[: head // 4 // BLOCK * BLOCK])
    for state in states:
        index.add_replica(state.key, "m")
        for ids in rng.sample(shared, 2):
            known.stored(state.key, ids)
    scorer = PrecisePrefixCacheScorer()
    scorer.index, scorer.tokens = index, known
    use_in_default(scheduler, scorer, True)
    return known


def cell(
    endpoints: int, prompt_chars: int, iterations: int, profile: str | None, precise: bool = False
) -> dict:
    rng = random.Random(7)
    now = time.monotonic()
    states = _states(endpoints, rng, now)
    scheduler = build_scheduler()
    shared = prompt_chars * 3 // 4
    systems = ["".join(rng.choice("abcdefghij ") for _ in range(shared)) for _ in range(32)]

    def doc(k: int) -> dict[str, Any]:
        question = "".join(rng.choice("klmnopq ") for _ in range(prompt_chars - shared - 20))
        return {
            "model": "m",
            "messages": [
                {"role": "system", "content": systems[k % 32]},
                {"role": "user", "content": question},
            ],
        }

    known = _precise(scheduler, states, [doc(k) for k in range(32)], rng) if precise else None
    prof = scheduler.profile(profile)
    for k in range(256):
        d = doc(k)
        if known is not None:
            known.of(d)
        ctx = SchedulingContext("m", prompt_text(d).encode(), {}, False, 0.2, now, request=d)
        chosen = scheduler.pick(ctx, states, 4, profile).endpoints[0]
        prof.on_pick(ctx, chosen)
        if known is not None:
            known.stored(chosen.key, known.of(d))
    docs = [doc(k) for k in range(64)]
    if known is not None:
        for d in docs:
            known.of(d)
    pick_t: list[float] = []
    total_t: list[float] = []
    cpu_t: list[float] = []
    perf, cpu = time.perf_counter, time.thread_time
    for k in range(iterations):
        d = docs[k % len(docs)]
        cpu_start = cpu()
        start = perf()
        ctx = SchedulingContext(
            "m", lambda d=d: prompt_text(d).encode(), {}, False, 0.2, now, request=d
        )
        chosen = scheduler.pick(ctx, states, 4, profile).endpoints[0]
        picked = perf()
        cpu_picked = cpu()
        prof.on_pick(ctx, chosen)
        done = perf()
        pick_t.append((picked - start) * 1000)
        total_t.append((done - start) * 1000)
        cpu_t.append((cpu_picked - cpu_start) * 1000)
        if known is not None:
            known.stored(chosen.key, known.of(d))
    out: dict[str, Any] = {"endpoints": endpoints, "prompt_chars": prompt_chars}
    for name, xs in (("pick", pick_t), ("total", total_t), ("cpu", cpu_t)):
        for q in (50, 99, 99.9):
            out[f"{name}_p{q:g}"] = percentile(xs, q)
    return out


def report(res: dict[str, Any]) -> str:
    a = res["args"]
    rows = [
        [
            c["endpoints"],
            f"{c['prompt_chars']:,}",
            f"{c['pick_p50']:.3f}",
            f"{c['pick_p99']:.3f}",
            f"{c['pick_p99.9']:.3f}",
            f"{c['total_p50']:.3f}",
            f"{c['total_p99']:.3f}",
            f"{c['total_p99.9']:.3f}",
            f"{c['cpu_p50']:.3f}",
            f"{c['cpu_p99']:.3f}",
        ]
        for c in res["cells"]
    ]
    headers = [
        "endpoints",
        "prompt chars",
        "pick p50 ms",
        "pick p99 ms",
        "pick p99.9 ms",
        "pick + update p50 ms",
        "p99 ms",
        "p99.9 ms",
        "pick CPU p50 ms",
        "pick CPU p99 ms",
    ]
    return "\n".join(
        [
            f"Command: `python -m bench.scheduling --iterations {a['iterations']} "
            f"--repeats {a['repeats']}"
            f"{' --profile ' + a['profile'] if a['profile'] else ''}"
            f"{' --precise' if a.get('precise') else ''}` "
            f"({machine_line(res['machine'], res['load_after'])}). Profile: "
            f"`{a['profile'] or 'default'}` ({res['profile_plugins']}).",
            "",
            table(headers, rows),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=5000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", default=None, help="scheduling profile (default: the default)")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--precise", action="store_true", help="endpoints publish KV events")
    p.add_argument(
        "--cells",
        default=None,
        help="only these cells, e.g. '1000x16000,64x16000' (default: all; not written)",
    )
    args = p.parse_args(argv)
    cells_run = CELLS
    if args.cells:
        cells_run = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]
        args.no_write = True
    info = machine()
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in range(args.repeats):
        for endpoints, chars in cells_run:
            c = cell(endpoints, chars, args.iterations, args.profile, args.precise)
            runs.setdefault((endpoints, chars), []).append(c)
            print(
                f"[{r + 1}/{args.repeats}] {endpoints:4d} endpoints {chars:6,d} chars: pick p50 "
                f"{c['pick_p50']:.3f} p99 {c['pick_p99']:.3f} ms; with update p50 "
                f"{c['total_p50']:.3f} p99 {c['total_p99']:.3f} ms; pick CPU p50 "
                f"{c['cpu_p50']:.3f} p99 {c['cpu_p99']:.3f} ms",
                flush=True,
            )
    cells = [
        {
            k: statistics.median(c[k] for c in cs) if k.startswith(("pick", "total", "cpu")) else v
            for k, v in cs[0].items()
        }
        for cs in runs.values()
    ]

    scheduler = build_scheduler()
    if args.precise:
        use_in_default(scheduler, PrecisePrefixCacheScorer(), True)
    prof = scheduler.profile(args.profile)
    plugins = ", ".join(
        [f.name for f in prof.filters] + [f"{s.name} x{w:g}" for s, w in prof.scorers]
    )
    res = {
        "args": vars(args),
        "machine": info,
        "load_after": list(os.getloadavg()),
        "profile_plugins": plugins,
        "cells": cells,
    }
    if args.no_write:
        return
    section = "scheduling-precise" if args.precise else "scheduling"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{section}.json").write_text(json.dumps(res, indent=1))
    print(f"wrote {write_section(section, report(res))}")


if __name__ == "__main__":
    main()
