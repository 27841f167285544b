"""The tenant-specific work of one request in one process: authentication, the rate limiter's
and the usage hook's reserve and settle, and the response head's rate-limit lines; without any
Tenant, with a keyed Tenant, and with a keyed Tenant whose requests, input and output tokens
are limited (as ``bench/tenant_auth.py``'s three gateways, minus the HTTP and the proxying).

    python -m bench.tenant_path [--rounds 9] [--requests 20000] [--baseline REF]

Each round times ``--requests`` requests of each kind in turn; reported: the best round of
each kind in microseconds a request, and what a Tenant adds. ``--baseline REF`` runs the same
measurement on another build (a git ref, checked out into a temporary worktree) in a
subprocess, alternating with this tree's. A micro-benchmark: the gateway process pays two to
three times these figures for the same Python (see docs/benchmarks.md, issue 15).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson

KINDS = ("open", "keyed", "limited")
BODY = orjson.dumps({"model": "bench", "prompt": "Say hello.", "max_tokens": 16})
# What bench/gateway_upstream.py reports for every unary request.
USAGE = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}


def request_of(kind: str) -> Any:
    """One request's tenant-specific work for ``kind``, as the gateway's route and finish
    stages do it."""
    from bench.tenant_auth import LIMITS, tenant_object
    from llmplane.gateway import apikeys
    from llmplane.gateway.auth import Authenticator
    from llmplane.gateway.context import RequestContext
    from llmplane.gateway.hooks import Reservation, Usage
    from llmplane.gateway.ratelimit.limiter import RateLimiter
    from llmplane.gateway.request import InferenceRequest
    from llmplane.gateway.routing import Decision
    from llmplane.gateway.tenant_usage import TenantUsage

    made = apikeys.new_key()
    objects = []
    if kind != "open":
        objects = [tenant_object("t0", made, LIMITS if kind == "limited" else None)]
    auth = Authenticator()
    auth.update(objects)
    limiter = RateLimiter(SimpleNamespace())
    limiter.update(objects)
    usage = TenantUsage(None)
    hooks = [(h.reserve_now, h.settle_now) for h in (limiter, usage)]
    headers = {"content-type": "application/json"}
    if kind != "open":
        headers["authorization"] = f"Bearer {made.key}"
    inference = InferenceRequest("/v1/completions", headers, BODY)
    http = SimpleNamespace(headers=headers)

    def one() -> None:
        ctx = RequestContext(http)  # type: ignore[arg-type]
        tenant = auth.authenticate(headers)
        decision = Decision("r", None, "bench")  # type: ignore[arg-type]
        if tenant is not None:
            auth.permit(tenant, inference.model)
            decision.tenant = tenant.name
            decision.criticality = tenant.criticality
        held = []
        for reserve_now, settle_now in hooks:
            reservation = reserve_now(inference, decision)
            held.append((settle_now, reservation))
            if isinstance(reservation, Reservation):
                ctx.adopt(reservation)
        reported = Usage.of(USAGE)
        for settle_now, reservation in held:
            settle_now(inference, decision, reservation, reported, 200)

    return one


def measure(rounds: int, requests: int) -> dict[str, float]:
    """Best round per kind, microseconds a request."""
    calls = {kind: request_of(kind) for kind in KINDS}
    best = dict.fromkeys(KINDS, float("inf"))
    for _ in range(rounds):
        for kind, one in calls.items():
            start = time.perf_counter()
            for _ in range(requests):
                one()
            best[kind] = min(best[kind], (time.perf_counter() - start) / requests * 1e6)
    return best


def line(name: str, us: dict[str, float]) -> str:
    return (
        f"| {name} | {us['open']:.2f} | {us['keyed']:.2f} | {us['limited']:.2f} | "
        f"+{us['keyed'] - us['open']:.2f} | +{us['limited'] - us['open']:.2f} |"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--baseline", help="git ref of a build to measure beside this one")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a baseline's run
    args = p.parse_args(argv)
    if args.json:
        print(orjson.dumps(measure(args.rounds, args.requests)).decode())
        return
    from bench.common import ROOT, checkout, machine, machine_line, remove_checkout

    info = machine()
    builds = {"this tree": ROOT}
    tmp = Path(tempfile.mkdtemp(prefix="llmplane-tenant-path-"))
    if args.baseline:
        builds = {f"baseline {args.baseline}": checkout(args.baseline, tmp / "baseline"), **builds}
    try:
        results: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
        for _ in range(3):  # alternating builds, a fresh process each
            for name, tree in builds.items():
                env = {**os.environ, "PYTHONPATH": str(tree)}
                out = subprocess.run(
                    [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "--json",
                        *("--rounds", str(args.rounds), "--requests", str(args.requests)),
                    ],
                    env=env,
                    cwd=tree,
                    check=True,
                    capture_output=True,
                    text=True,
                )
                results[name].append(orjson.loads(out.stdout))
    finally:
        if args.baseline:
            remove_checkout(builds[f"baseline {args.baseline}"])
    print(f"`python -m bench.tenant_path --rounds {args.rounds} --requests {args.requests}", end="")
    print(f"{' --baseline ' + args.baseline if args.baseline else ''}`", end=" ")
    print(f"({machine_line(info, list(os.getloadavg()))}); best of 3 processes x {args.rounds}")
    print()
    print("| build | no Tenant us | keyed us | with limits us | keyed adds | limits add |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        print(line(name, {k: min(r[k] for r in runs) for k in KINDS}))


if __name__ == "__main__":
    main()
