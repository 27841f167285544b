"""The tenant-specific work of one request in one process: authentication, the rate limiter's
and the usage hook's reserve and settle, the response head (the upstream's relayed lines, the
``x-ratelimit-*`` lines, ``Response.encode``) and the tenant request counter; without any
Tenant, with a keyed Tenant, and with a keyed Tenant whose requests, input and output tokens
are limited (as ``bench/tenant_auth.py``'s three gateways, minus the HTTP and the proxying).

    python -m bench.tenant_path [--rounds 9] [--requests 20000] [--baseline REF] [--stages]
                                [--limits all|busy]

Each round times ``--requests`` requests of each kind in turn; reported: the best round of
each kind in microseconds a request, and what a Tenant adds. ``--baseline REF`` runs the same
measurement on another build (a git ref, checked out into a temporary worktree) in a
subprocess, alternating with this tree's. ``--stages`` times each stage of a request alone
instead (and what the gateway does for a Tenant outside these stages: parsing the key's
header, forwarding the request upstream, sending the larger response head over a loopback TCP
socket), to account for what a Tenant costs stage by stage. ``--limits busy`` uses
``bench/tenant_auth.py``'s busy limits (the header values change with every request). A
micro-benchmark: the gateway process pays more than these figures for the same Python (see
docs/benchmarks.md, issue 15).
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
# What llmplane/testing/upstream.py reports for every unary request, and its response head.
USAGE = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
UPSTREAM_HEAD = [
    (b"content-type", b"Content-Type: application/json; charset=utf-8"),
    (b"content-length", b"Content-Length: 261"),
    (b"date", b"Date: Tue, 24 Nov 2026 13:00:00 GMT"),
    (b"server", b"Server: Python/3.11 aiohttp/3.11.18"),
]
RESPONSE_BODY = b"x" * 261
DATE = b"Date: Tue, 24 Nov 2026 13:00:00 GMT\r\nServer: llmplane\r\n"


class Setup:
    """One kind's gateway parts as the gateway wires them (authenticator, limiter, usage
    hook, the tenant counter) and one request's headers."""

    def __init__(self, kind: str, limits: str = "all") -> None:
        from bench.tenant_auth import BUSY, LIMITS, tenant_object
        from llmplane.gateway import apikeys
        from llmplane.gateway.auth import Authenticator
        from llmplane.gateway.config import GatewayConfig
        from llmplane.gateway.ratelimit.limiter import RateLimiter
        from llmplane.gateway.request import InferenceRequest
        from llmplane.gateway.tenant_usage import TenantUsage
        from llmplane.gateway.upstream_client import RawHeaders

        made = apikeys.new_key()
        objects = []
        if kind != "open":
            chosen = {"all": LIMITS, "busy": BUSY}[limits] if kind == "limited" else None
            objects = [tenant_object("t0", made, chosen)]
        self.auth = Authenticator()
        self.auth.update(objects)
        self.limiter = RateLimiter(GatewayConfig())
        self.limiter.update(objects)
        self.usage = TenantUsage(None)
        self.hooks = (self.limiter, self.usage)
        self.headers = {"content-type": "application/json"}
        if kind != "open":
            self.headers["authorization"] = f"Bearer {made.key}"
        self.inference = InferenceRequest("/v1/completions", self.headers, BODY)
        self.http = SimpleNamespace(headers=self.headers)
        self.upstream = RawHeaders(
            [line for _, line in UPSTREAM_HEAD], [n for n, _ in UPSTREAM_HEAD]
        )
        self.tenant_series: dict[tuple[str, int], Any] = {}


def now(coroutine: Any) -> Any:
    """The value of a coroutine that finishes without waiting (the hooks on local buckets),
    run without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("the coroutine waited")


def context_of(s: Setup, decision: Any) -> Any:
    """A request's context after the route stage: parsed, authenticated, routed."""
    from llmplane.gateway.context import RequestContext

    ctx = RequestContext(s.http)  # type: ignore[arg-type]
    ctx.inference = s.inference
    tenant = ctx.tenant = s.auth.authenticate(s.headers)
    if tenant is not None:
        s.auth.permit(tenant, s.inference.model)
    ctx.decision = decision
    return ctx


def request_of(kind: str, limits: str = "all") -> Any:
    """One request's tenant-specific work for ``kind``, as the gateway's route stage, proxy
    (the response head) and finish stage do it."""
    from llmplane.gateway.context import RequestContext
    from llmplane.gateway.hooks import Reservation, Usage
    from llmplane.gateway.http_server import Response
    from llmplane.gateway.proxy import relayed_headers
    from llmplane.gateway.routing import RouteDecision

    s = Setup(kind, limits)
    auth, hooks, headers, inference, http = s.auth, s.hooks, s.headers, s.inference, s.http
    upstream, tenant_series, requests = s.upstream, s.tenant_series, s.auth.requests

    def one() -> None:
        ctx = RequestContext(http)  # type: ignore[arg-type]
        ctx.inference = inference
        tenant = ctx.tenant = auth.authenticate(headers)
        if tenant is not None:
            auth.permit(tenant, inference.model)
        ctx.decision = RouteDecision("r", None, "bench")  # type: ignore[arg-type]
        for hook in hooks:
            reservation = now(hook.reserve(ctx))
            ctx.reservations.append((hook, reservation))
            if isinstance(reservation, Reservation):
                ctx.adopt(reservation)
        Response(
            status=200,
            body=RESPONSE_BODY,
            **relayed_headers(upstream, "127.0.0.1:1", ctx.response_headers),
        ).encode(True, False, DATE)
        ctx.status = 200
        ctx.usage = Usage.of(USAGE)
        for hook, reservation in ctx.reservations:
            hook.settle(ctx, reservation, ctx.usage)
        if tenant is not None:  # Gateway.observe's tenant counter
            series = tenant_series.get((tenant.name, 200))
            if series is None:
                series = tenant_series[(tenant.name, 200)] = requests.labels(tenant.name, "200")
            series.value += 1

    return one


def measure(rounds: int, requests: int, limits: str = "all") -> dict[str, float]:
    """Best round per kind, microseconds a request."""
    calls = {kind: request_of(kind, limits) for kind in KINDS}
    return best_of(calls, rounds, requests)


def best_of(calls: dict[str, Any], rounds: int, requests: int) -> dict[str, float]:
    """The best round of each call (``requests`` calls a round, the calls in turn), in
    microseconds a call."""
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, one in calls.items():
            start = time.perf_counter()
            for _ in range(requests):
                one()
            best[name] = min(best[name], (time.perf_counter() - start) / requests * 1e6)
    return best


def stages_of(kind: str, limits: str = "all") -> dict[str, Any]:
    """Each stage of ``request_of``'s request alone (a call each, on state the stage leaves
    as it found it, give or take a bucket's level), and the gateway's work for a Tenant
    outside them: parsing the request's headers (``_Protocol.on_header``, once per header),
    the request forwarded upstream (``forwarded_headers`` + ``encode_request``) and the
    response sent (``socket.send`` of the encoded response over loopback TCP, drained by a
    reader every 64 sends: the reader's time is in the figure too, as wrk's is not)."""
    import socket

    from llmplane.gateway.context import RequestContext
    from llmplane.gateway.hooks import Reservation, Usage
    from llmplane.gateway.http_server import Headers, Response, _Protocol
    from llmplane.gateway.proxy import forwarded_headers, relayed_headers
    from llmplane.gateway.routing import RouteDecision
    from llmplane.gateway.upstream_client import encode_request

    s = Setup(kind, limits)
    auth, headers, inference, http = s.auth, s.headers, s.inference, s.http
    limiter, usage = s.hooks
    ctx = context_of(s, RouteDecision("r", None, "bench"))  # type: ignore[arg-type]
    ctx.status = 200
    reported = Usage.of(USAGE)
    reservation = now(limiter.reserve(ctx))
    for made in (reservation, now(usage.reserve(ctx))):
        if isinstance(made, Reservation):
            ctx.adopt(made)
    response = Response(
        status=200,
        body=RESPONSE_BODY,
        **relayed_headers(s.upstream, "127.0.0.1:1", ctx.response_headers),
    ).encode(True, False, DATE)
    wire_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
    parser = _Protocol.__new__(_Protocol)  # its fields only
    parser._header_bytes = 0
    parser._headers = Headers()
    sent = SimpleNamespace(n=0)
    server = socket.create_server(("127.0.0.1", 0))
    writer = socket.create_connection(server.getsockname())
    reader, _ = server.accept()
    server.close()
    writer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def authenticate() -> None:
        found = auth.authenticate(headers)
        if found is not None:
            auth.permit(found, inference.model)

    fresh = RequestContext(http)  # type: ignore[arg-type]

    def reserve() -> None:  # (the buckets refill faster than a round takes from them)
        taken = now(limiter.reserve(ctx))
        if isinstance(taken, Reservation):
            fresh.adopt(taken)
            fresh.response_headers = None

    def settle() -> None:
        limiter.settle(ctx, reservation, Usage.of(USAGE))

    def usage_hook() -> None:
        usage.settle(ctx, now(usage.reserve(ctx)), reported)

    def head() -> None:
        Response(
            status=200,
            body=RESPONSE_BODY,
            **relayed_headers(s.upstream, "127.0.0.1:1", ctx.response_headers),
        ).encode(True, False, DATE)

    def parse() -> None:
        parser._header_bytes = 0
        parser._headers = Headers()
        for name, value in wire_headers:
            _Protocol.on_header(parser, name, value)  # type: ignore[arg-type]

    def forward() -> None:
        encode_request("POST", "/v1/completions", "127.0.0.1:1", forwarded_headers(http), BODY)  # type: ignore[arg-type]

    def send() -> None:
        writer.send(response)
        sent.n += 1
        if sent.n == 64:
            sent.n = 0
            want = 64 * len(response)
            while want:
                want -= len(reader.recv(want))

    return {
        "authenticate": authenticate,
        "limiter reserve": reserve,
        "limiter settle": settle,
        "usage hook": usage_hook,
        "response head": head,
        "request headers parsed": parse,
        "request forwarded": forward,
        "response sent": send,
    }


def measure_stages(rounds: int, requests: int, limits: str = "all") -> dict[str, float]:
    """Best round of each (kind, stage), microseconds a call; keys ``kind/stage``."""
    calls = {
        f"{kind}/{stage}": call for kind in KINDS for stage, call in stages_of(kind, limits).items()
    }
    return best_of(calls, rounds, requests)


def line(name: str, us: dict[str, float]) -> str:
    return (
        f"| {name} | {us['open']:.2f} | {us['keyed']:.2f} | {us['limited']:.2f} | "
        f"{us['keyed'] - us['open']:+.2f} | {us['limited'] - us['open']:+.2f} |"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--baseline", help="git ref of a build to measure beside this one")
    p.add_argument("--stages", action="store_true", help="time each stage alone")
    p.add_argument("--limits", choices=("all", "busy"), default="all")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a baseline's run
    args = p.parse_args(argv)
    if args.json:
        run = measure_stages if args.stages else measure
        print(orjson.dumps(run(args.rounds, args.requests, args.limits)).decode())
        return
    from bench.common import (
        ROOT,
        checkout,
        machine,
        machine_line,
        remove_checkout,
    )

    info = machine()
    builds = {"this tree": ROOT}
    tmp = Path(tempfile.mkdtemp(prefix="llmplane-tenant-path-"))
    if args.baseline:
        builds = {f"baseline {args.baseline}": checkout(args.baseline, tmp / "baseline"), **builds}
    flags = ["--rounds", str(args.rounds), "--requests", str(args.requests)]
    flags += ["--limits", args.limits, *(["--stages"] if args.stages else [])]
    try:
        results: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
        for _ in range(3):  # alternating builds, a fresh process each
            for name, tree in builds.items():
                env = {**os.environ, "PYTHONPATH": str(tree)}
                out = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--json", *flags],
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
    extra = " ".join(flags[4:] + (["--baseline", args.baseline] if args.baseline else []))
    print(f"`python -m bench.tenant_path {' '.join(flags[:4])} {extra}`", end=" ")
    print(f"({machine_line(info, list(os.getloadavg()))}); best of 3 processes x {args.rounds}")
    print()
    if not args.stages:
        print("| build | no Tenant us | keyed us | with limits us | keyed adds | limits add |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, runs in results.items():
            print(line(name, {k: min(r[k] for r in runs) for k in KINDS}))
        return
    for name, runs in results.items():
        best = {k: min(r[k] for r in runs) for k in runs[0]}
        stages = list(dict.fromkeys(k.split("/", 1)[1] for k in best))
        print(f"{name}:")
        print()
        print("| stage | no Tenant us | keyed us | with limits us | keyed adds | limits add |")
        print("|---|---:|---:|---:|---:|---:|")
        for stage in stages:
            print(line(stage, {kind: best[f"{kind}/{stage}"] for kind in KINDS}))
        print()


if __name__ == "__main__":
    main()
