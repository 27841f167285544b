"""What each stage of a non-streaming request costs the gateway, in-process, without sockets.

    python -m bench.gateway_stages [--repeats 20] [--requests 5000] [--no-access-log]
                                   [--no-flow-control]

Three parts, each timed over ``--requests`` requests per repeat, the least of ``--repeats``
repeats reported (on this shared machine a repeat's time moves by up to 2x with the load; the
least is the one nothing else disturbed):

- **HTTP request parse**: ``http_server._Protocol.data_received`` fed wrk's request (head and
  body in one read) over a stub transport: httptools and its callbacks, the ``HttpRequest``;
- **upstream response parse**: ``upstream_client._Connection`` given nginx's answer
  (bench/nginx_upstream.py's completion) in one read, set up as ``send`` sets it up:
  head and body parsed;
- **pipeline**: ``Gateway.handle`` over one endpoint with the default settings (access log
  on, into /dev/null through the CLI's ``AccessSink``; flow control on) and the upstream
  pool's ``request`` replaced by one returning that answer at once, then ``Response.encode``:
  everything between the parsed request and the response bytes. Its stages are timed by
  wrapping their functions (the wrappers' own cost, calibrated, is taken off); what no stage
  covers is the glue: the coroutines and objects that carry a request between the stages.

Not covered: system calls and the event loop (uvloop's callbacks, futures, task steps), which
``bench.workers`` / ``bench.gateway_ab`` measure with the rest as CPU per request. Nothing is
written: paste the figures into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson

from bench.common import machine, machine_line
from bench.nginx_upstream import COMPLETION
from bench.workers import UNARY

BODY = COMPLETION.encode()
HEADER_LINES = [
    b"Server: nginx/1.24.0",
    b"Date: Tue, 24 Nov 2026 10:00:00 GMT",
    b"Content-Type: application/json",
    b"Content-Length: %d" % len(BODY),
    b"Connection: keep-alive",
]
RESPONSE = b"HTTP/1.1 200 OK\r\n" + b"\r\n".join(HEADER_LINES) + b"\r\n\r\n" + BODY
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    b"Content-Length: %d\r\nContent-Type: application/json\r\n\r\n" % len(UNARY)
) + UNARY
MODEL = orjson.loads(UNARY)["model"]


class _Transport:
    """Takes writes and ignores them (both directions)."""

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def least(repeats: int, requests: int, run: Callable[[int], None]) -> float:
    """us per request: the least over ``repeats`` runs of ``run(requests)``."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        run(requests)
        best = min(best, (time.perf_counter() - t) / requests * 1e6)
    return best


def http_parse(repeats: int, requests: int) -> float:
    from llmplane.gateway import http_server

    class Server:
        max_connections = 0
        max_body = 1 << 20
        max_body_total = 0
        body_bytes = 0
        connections: set[Any] = set()
        loop = None
        closing = False

    protocol = http_server._Protocol(Server())  # type: ignore[arg-type]
    protocol.connection_made(_Transport())  # type: ignore[arg-type]
    protocol.task = object()  # type: ignore[assignment]  # parked: a request wakes it

    def run(n: int) -> None:
        for _ in range(n):
            protocol._more = None
            protocol.data_received(REQUEST)
            protocol.queue.clear()

    return least(repeats, requests, run)


def upstream_parse(repeats: int, requests: int) -> float:
    from llmplane.gateway.upstream_client import UpstreamPool, _Connection

    loop = asyncio.new_event_loop()
    try:
        conn = _Connection(UpstreamPool(), "127.0.0.1:1", loop)
        conn.transport = _Transport()  # type: ignore[assignment]

        def run(n: int) -> None:
            for _ in range(n):
                conn._start()  # what ``send`` does before its write
                conn.data_received(RESPONSE)
                assert conn._head is not None and conn._pieces[0] == BODY

        return least(repeats, requests, run)
    finally:
        loop.close()


# The pipeline's stages: (owner, function name, stage). Module-level functions that other
# modules imported by name are re-bound there too (``_REBIND``).
def _stages() -> list[tuple[Any, str, str]]:
    from llmplane.gateway import (
        admission,
        auth,
        context,
        hooks,
        http_server,
        observability,
        proxy,
        request,
        response_usage,
        routing,
        server,
        tenant_usage,
        upstream_client,
    )
    from llmplane.gateway.flowcontrol import controller
    from llmplane.gateway.ratelimit import limiter
    from llmplane.gateway.scheduler import framework

    return [
        (context.RequestContext, "__init__", "request context"),
        (request.InferenceRequest, "__init__", "body parse and field checks"),
        (auth.Authenticator, "authenticate", "authentication (no Tenant: off on loopback)"),
        (routing.RoutingTable, "resolve", "route resolve"),
        (limiter.RateLimiter, "reserve", "hooks: rate limits, tenant usage"),
        (limiter.RateLimiter, "settle", "hooks: rate limits, tenant usage"),
        (tenant_usage.TenantUsage, "reserve", "hooks: rate limits, tenant usage"),
        (tenant_usage.TenantUsage, "settle", "hooks: rate limits, tenant usage"),
        (admission.Admission, "admit", "admission"),
        (controller.FlowControl, "_saturated", "flow control check"),
        (server.Gateway, "schedule", "scheduler pick"),
        (framework.Profile, "on_pick", "prefix index update (prompt text, block hashes)"),
        (proxy, "forwarded_headers", "upstream request bytes"),
        (upstream_client, "encode_request", "upstream request bytes"),
        (proxy, "relayed_headers", "response headers relayed"),
        (response_usage, "extract_usage", "usage extraction"),
        (hooks.Usage, "of", "usage extraction"),
        (server.Gateway, "observe", "metrics"),  # less the access log, below
        (context.RequestContext, "access_record", "access log line"),
        (observability, "write_access", "access log line"),
        (http_server.Response, "encode", "response bytes"),
    ]


_REBIND = {
    "encode_request": ("proxy",),
    "extract_usage": ("proxy",),
    "write_access": ("server",),
}


class _Timer:
    """Wraps functions to add their wall time to a stage; ``overhead`` ns per wrapped call."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.overhead = 0.0

    def wrap(self, owner: Any, name: str, stage: str) -> None:
        fn = getattr(owner, name)
        clock = time.perf_counter_ns
        spent, calls = self.ns, self.calls
        spent.setdefault(stage, 0)
        calls.setdefault(stage, 0)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[stage] += clock() - t
                calls[stage] += 1

        setattr(owner, name, timed)

    def calibrate(self) -> None:
        class Probe:
            def f(self) -> None:
                pass

        self.wrap(Probe, "f", "calibration")
        probe = Probe()
        for _ in range(200_000):
            probe.f()
        self.overhead = self.ns.pop("calibration") / self.calls.pop("calibration")

    def take(self, requests: int) -> dict[str, float]:
        """us per request per stage since the last call (wrapper cost taken off)."""
        out = {
            stage: (self.ns[stage] - self.overhead * self.calls[stage]) / requests / 1000
            for stage in self.ns
        }
        # observe holds the access log's two calls: metrics is the rest.
        log = self.calls["access log line"]
        out["metrics"] -= out["access log line"] + self.overhead * log / requests / 1000
        for stage in self.ns:
            self.ns[stage] = self.calls[stage] = 0
        return out


async def pipeline(
    repeats: int, requests: int, access: bool, flow: bool, staged: bool
) -> tuple[float, dict[str, float]]:
    """us per request of ``Gateway.handle`` + ``Response.encode`` (least of the repeats), and
    with ``staged`` each stage's least."""
    from llmplane.gateway import observability, proxy, server
    from llmplane.gateway.config import GatewayConfig
    from llmplane.gateway.discovery import Endpoint, StaticDiscovery
    from llmplane.gateway.http_server import Headers, HttpRequest
    from llmplane.gateway.upstream_client import RawHeaders

    timer = _Timer()
    if staged:
        timer.calibrate()
        modules = {"proxy": proxy, "server": server}
        for owner, name, stage in _stages():
            timer.wrap(owner, name, stage)
            for module in _REBIND.get(name, ()):
                setattr(modules[module], name, getattr(owner, name))
    gateway = server.Gateway(
        None,
        StaticDiscovery([Endpoint("127.0.0.1:1", model_name=MODEL)]),
        GatewayConfig(flow_control=flow),
    )
    await gateway.start_routing()
    gateway.proxy.start()
    devnull = os.open(os.devnull, os.O_WRONLY)
    access_log = logging.getLogger("llmplane.gateway.access")
    level = access_log.level
    if access:
        observability.install_access_sink(devnull)
        access_log.setLevel(logging.INFO)
    else:
        access_log.setLevel(logging.WARNING)
    names = [line.split(b":", 1)[0].lower() for line in HEADER_LINES]

    async def answer(address: str, data: bytes, timeout: float | None = None) -> Any:
        return 200, RawHeaders(HEADER_LINES, names), BODY

    assert gateway.proxy.pool is not None
    gateway.proxy.pool.request = answer  # type: ignore[method-assign]
    date = b"Date: Tue, 24 Nov 2026 10:00:00 GMT\r\nServer: llmplane\r\n"
    head = {
        "host": "127.0.0.1:8000",
        "content-length": str(len(UNARY)),
        "content-type": "application/json",
    }

    def make() -> HttpRequest:
        headers = Headers()
        dict.update(headers, head)
        path = "/v1/chat/completions"
        return HttpRequest(None, "POST", path, path, headers, UNARY, "1.1", True, False)  # type: ignore[arg-type]

    best = float("inf")
    stages: dict[str, float] = {}
    try:
        for _ in range(repeats):
            batch = [make() for _ in range(requests)]
            if staged:
                timer.take(1)  # reset
            t = time.perf_counter()
            for req in batch:
                response = await gateway.handle(req)
                response.encode(True, False, date)
            best = min(best, (time.perf_counter() - t) / requests * 1e6)
            assert response.status == 200, response.body
            if staged:
                for stage, us in timer.take(requests).items():
                    stages[stage] = min(us, stages.get(stage, float("inf")))
    finally:
        observability.flush_access_log()
        observability.access_sink = None
        access_log.setLevel(level)
        os.close(devnull)
        await gateway.close()
    return best, stages


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--no-access-log", action="store_true")
    p.add_argument("--no-flow-control", action="store_true")
    args = p.parse_args(argv)
    info = machine()
    access, flow = not args.no_access_log, not args.no_flow_control
    parse = http_parse(args.repeats, args.requests * 4)
    upstream = upstream_parse(args.repeats, args.requests * 4)
    total, _ = asyncio.run(pipeline(args.repeats, args.requests, access, flow, staged=False))
    staged_total, stages = asyncio.run(
        pipeline(args.repeats, args.requests, access, flow, staged=True)
    )
    covered = sum(stages.values())
    rows = [
        ("HTTP request parse (httptools + callbacks)", parse),
        ("upstream response parse (head, body, waiter)", upstream),
        (f"pipeline, `Gateway.handle` + `Response.encode` (unwrapped: {total:.1f})", None),
        *sorted(stages.items(), key=lambda kv: -kv[1]),
        ("glue: what no stage covers (coroutines, context, attempts)", total - covered),
    ]
    print(
        f"Command: `python -m bench.gateway_stages --repeats {args.repeats} --requests "
        f"{args.requests}{'' if access else ' --no-access-log'}"
        f"{'' if flow else ' --no-flow-control'}`; {machine_line(info)}\n"
    )
    print("| stage | us / request |\n|---|---:|")
    for name, us in rows:
        print(f"| {name} | {'' if us is None else f'{us:.2f}'} |")
    print(f"\n(the staged run took {staged_total:.1f} us a request, wrappers included)")


if __name__ == "__main__":
    main()
