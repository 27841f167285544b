"""What authentication and tenant limits cost: one build, the same upstream, a gateway without
any Tenant, one whose requests carry a Tenant's API key, and one whose Tenant also has limits
(requests, input and output tokens per second, set so high nothing is refused: every request
reserves and settles in the tenant's buckets, and its usage is counted and recorded), in
alternating wrk cells.

    python -m bench.tenant_auth [--rounds 8] [--duration 3] [--concurrency 8] [--tenants 1]
                                [--limits all|requests|busy] [--baseline REF]

All gateways are ``python -m llmplane.gateway.cli`` of this tree (uvloop, access log off) in
front of one ``llmplane/testing/upstream.py --delay 0``; unary completions only (the key is
checked once per request, before anything is streamed). ``--tenants N`` stores N Tenants of
one key each (the request's key is the last), to show the lookup does not scan.
``--limits requests`` limits only requests (one bucket) instead of requests and tokens.
With ``--limits all`` the buckets refill faster than any run takes, so every request finds
them full and the ``x-ratelimit-*`` values repeat (what a tenant well inside its limits
sees); ``--limits busy`` sets per-hour limits that refill slower than the run takes (and
still never refuse within a run of a few minutes), so the values change with every request.
``--baseline REF`` adds the same three gateways of another build (a git ref, checked out into a
temporary worktree) to every round: what a change to these paths gained. Reported: medians over
rounds of req/s, gateway CPU per request and wrk's p50/p99, and the ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import orjson

from bench.common import (
    ROOT,
    checkout,
    cpu_seconds,
    gateway_proc,
    machine,
    machine_line,
    remove_checkout,
    store_objects,
    table,
    upstream_proc,
    wrk,
)
from llmplane.testing import Process

# Never reached in a run: every request takes from each bucket, none is refused.
UNREACHABLE = 4_000_000_000
LIMITS = {
    "requestsPerUnit": UNREACHABLE,
    "inputTokensPerUnit": UNREACHABLE,
    "outputTokensPerUnit": UNREACHABLE,
    "unit": "second",
}
# Refilled at 5,000 requests and 25,000 tokens a second, less than a run takes: the levels
# (and the headers) change with every request; a run of minutes never empties them.
BUSY = {
    "requestsPerUnit": 18_000_000,
    "inputTokensPerUnit": 90_000_000,
    "outputTokensPerUnit": 90_000_000,
    "unit": "hour",
}


def tenant_object(name: str, made: object, limits: dict | None = None) -> dict:
    spec: dict = {
        "models": ["bench*"],
        "keys": [{"id": made.id, "salt": made.salt, "hash": made.hash}],  # type: ignore[attr-defined]
    }
    if limits:
        spec["rateLimit"] = limits
    return {
        "apiVersion": "llmplane.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--tenants", type=int, default=1)
    p.add_argument("--limits", choices=("all", "requests", "busy"), default="all")
    p.add_argument("--baseline", help="git ref of a build to run beside this one")
    p.add_argument(
        "--kinds",
        nargs="+",
        choices=("open", "keyed", "limited"),
        default=["open", "keyed", "limited"],
        help="which gateways to run (e.g. only 'limited' with --baseline: more rounds a minute)",
    )
    args = p.parse_args(argv)

    from llmplane.gateway import apikeys
    from llmplane.gateway.discovery.store_endpoints import endpoint_object

    info = machine()
    work = Path(tempfile.mkdtemp(prefix="llmplane-auth-"))
    base_tree = checkout(args.baseline, work / "baseline") if args.baseline else None
    procs: list[Process] = []
    try:
        up = upstream_proc()
        procs.append(up)
        address = up.ready()
        endpoint = endpoint_object("bench", address, "bench", engine="vllm")
        keys = [apikeys.new_key() for _ in range(args.tenants)]
        store_objects(str(work / "open"), endpoint)
        limited = {"all": LIMITS, "busy": BUSY, "requests": {"requestsPerUnit": UNREACHABLE}}[
            args.limits
        ]
        for name, limits in (("keyed", None), ("limited", limited)):
            store_objects(
                str(work / name),
                endpoint,
                *(tenant_object(f"t{i}", made, limits) for i, made in enumerate(keys)),
            )
        bearer = {"Authorization": f"Bearer {keys[-1].key}"}
        kinds = {
            k: h
            for k, h in {"open": {}, "keyed": bearer, "limited": bearer}.items()
            if k in args.kinds
        }
        builds = {"": ROOT} if base_tree is None else {"": ROOT, " (baseline)": base_tree}
        headers = {f"{kind}{build}": h for build in builds for kind, h in kinds.items()}
        gws = {
            f"{kind}{build}": gateway_proc(
                str(work / kind), name=f"{kind}{build.strip(' ()')}", tree=tree
            )
            for build, tree in builds.items()
            for kind in kinds
        }
        procs += gws.values()
        urls = {name: f"http://{gw.ready()}/v1/completions" for name, gw in gws.items()}
        body = orjson.dumps({"model": "bench", "prompt": "Say hello.", "max_tokens": 16})
        for name, url in urls.items():  # warm up
            gws[name].wait_http(url, body, headers=headers[name])
            wrk(url, body, args.concurrency, 1, headers=headers[name])
        cells: dict[str, list[dict[str, float]]] = {}
        for r in range(args.rounds):
            names = list(headers)  # each one first in turn
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                before = cpu_seconds(gws[name].pid)
                out = wrk(urls[name], body, args.concurrency, args.duration, headers=headers[name])
                out["cpu_us"] = (
                    (cpu_seconds(gws[name].pid) - before) / max(1, out["requests"]) * 1e6
                )
                cells.setdefault(name, []).append(out)
            print(f"round {r + 1}/{args.rounds} done", flush=True)

        def med(name: str, key: str) -> float:
            return statistics.median(o[key] for o in cells[name])

        labels = {
            "open": "no Tenant",
            "keyed": f"{args.tenants} Tenant(s), keyed",
            "limited": f"{args.tenants} Tenant(s), keyed, with limits ({args.limits})",
        }
        rows = [
            [
                labels[name.split(" ")[0]] + name[len(name.split(" ")[0]) :],
                f"{med(name, 'rps'):,.0f}",
                f"{med(name, 'cpu_us'):.0f}",
                f"{med(name, 'p50'):.2f}",
                f"{med(name, 'p99'):.2f}",
                sum(o["errors"] for o in cells[name]),
            ]
            for name in headers
        ]
        print()
        print(
            f"`python -m bench.tenant_auth --rounds {args.rounds} --duration {args.duration:g} "
            f"--concurrency {args.concurrency} --tenants {args.tenants} --limits {args.limits}"
            f"{' --kinds ' + ' '.join(args.kinds) if len(args.kinds) < 3 else ''}"
            f"{' --baseline ' + args.baseline if args.baseline else ''}"
            "` "
            f"({machine_line(info, list(os.getloadavg()))}); medians over rounds"
        )
        print()
        print(
            table(
                ["gateway", "req/s", "gateway CPU us / req", "p50 ms", "p99 ms", "errors"],
                rows,
                "lrrrrr",
            )
        )
        for build in builds:
            for name in ("keyed", "limited"):
                if "open" not in kinds or name not in kinds:
                    continue
                ratio = med(name + build, "rps") / med("open" + build, "rps")
                print(f"{name}{build} / open{build} throughput: {ratio:.3f}")
        if base_tree is not None:  # paired: each round's cells of the two builds
            for kind in kinds:
                diffs = [
                    a["cpu_us"] - b["cpu_us"]
                    for a, b in zip(cells[kind], cells[f"{kind} (baseline)"], strict=True)
                ]
                print(
                    f"{kind}: gateway CPU us / req, this tree - baseline, median of the rounds'"
                    f" differences: {statistics.median(diffs):+.1f}"
                )
    finally:
        for proc in reversed(procs):
            proc.stop()
        if base_tree is not None:
            remove_checkout(base_tree)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
