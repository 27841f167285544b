"""The HTTP server alone: the gateway's own (``llmplane/gateway/http_server.py`` on httptools
and uvloop) vs granian's RSGI interface (Rust HTTP, DESIGN.md asks for this comparison before
the HTTP layer is extended), each answering a POST with a fixed chat completion, no upstream.

    python -m bench.granian_http [--rounds 5] [--duration 3] [--concurrency 8 32]

One process each (granian ``--workers 1 --loop uvloop``), wrk 2 threads, alternating cells;
medians of req/s and of CPU per request (the server's process tree). Needs ``pip install
granian``. Prints a table; nothing is written.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
from typing import Any

from bench.common import free_port, launch, machine, machine_line, measured_wrk, table, wrk
from llmplane.testing import Process

FIXED = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":0,"model":"bench","choices":'
    b'[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}'
)
BODY = b'{"model":"bench","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
HEADERS = [("content-type", "application/json")]


async def app(scope: Any, proto: Any) -> None:
    """The RSGI application granian serves (``bench.granian_http:app``)."""
    await proto()  # the whole body, as the gateway reads it
    proto.response_bytes(200, HEADERS, FIXED)


def serve_own(port: int) -> None:
    """The gateway's HTTP server with one route answering FIXED (run in a child process)."""
    import uvloop

    from llmplane.gateway.http_server import HttpRequest, HttpServer, Response

    async def handle(request: HttpRequest) -> Response:
        return Response(body=FIXED, content_type="application/json")

    async def not_found(request: HttpRequest) -> Response:
        return Response(status=404, body=b"")

    async def main() -> None:
        server = HttpServer(
            {("POST", "/v1/chat/completions"): handle}, not_found, max_body=16 << 20
        )
        await server.start("127.0.0.1", port)
        print(f"LISTENING 127.0.0.1:{port}", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    p.add_argument("--serve-own", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_own:
        serve_own(args.serve_own)
        return
    granian = shutil.which("granian")
    if granian is None:
        sys.exit("granian is not installed (pip install granian)")
    info = machine()
    procs: dict[str, Process] = {}
    urls: dict[str, str] = {}
    try:
        port = free_port()
        procs["llmplane http_server"] = launch(
            "own", [sys.executable, "-m", "bench.granian_http", "--serve-own", str(port)]
        )
        procs["llmplane http_server"].ready()
        urls["llmplane http_server"] = f"http://127.0.0.1:{port}/v1/chat/completions"
        port = free_port()
        argv = [granian, "--interface", "rsgi", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--workers", "1", "--loop", "uvloop", "--log-level", "warning"]
        procs["granian rsgi"] = launch("granian", [*argv, "bench.granian_http:app"])
        urls["granian rsgi"] = f"http://127.0.0.1:{port}/v1/chat/completions"
        procs["granian rsgi"].wait_http(urls["granian rsgi"], BODY, timeout=60)
        names = list(urls)
        for name in names:
            wrk(urls[name], BODY, 8, 1)
        cells: list[dict[str, Any]] = []
        for r in range(args.rounds):
            for c in args.concurrency:
                order = names if (r + c) % 2 == 0 else names[::-1]
                for name in order:
                    cell = measured_wrk(urls[name], BODY, c, args.duration, [procs[name].pid])
                    cell.update(system=name, c=c)
                    cells.append(cell)
    finally:
        for proc in procs.values():
            proc.stop()
    rows = []
    for c in args.concurrency:
        for name in names:
            mine = [x for x in cells if x["system"] == name and x["c"] == c]
            rows.append(
                [
                    c,
                    name,
                    f"{statistics.median(x['rps'] for x in mine):,.0f}",
                    f"{statistics.median(x['cpu_per_1k'] for x in mine) * 1000:,.1f}",
                    f"{statistics.median(x['p99'] for x in mine):.2f}",
                    sum(x["errors"] for x in mine),
                ]
            )
    print(
        f"`python -m bench.granian_http --rounds {args.rounds} --duration {args.duration:g}`; "
        + machine_line(info, os.getloadavg())
    )
    print()
    print(table(["c", "server", "req/s", "CPU us / req", "p99 ms", "errors"], rows, "rlrrrr"))


if __name__ == "__main__":
    main()
