"""The local runtime's HTTP probe (``probes.http_ok``) against real servers on 127.0.0.1:
kubelet semantics (200-399 succeed, redirects not followed), a new connection per attempt, and
a clear reason for every failure."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
from aiohttp import web

from llmplane.aio import PAGE_MAX_BYTES
from llmplane.controlplane.plan import HttpProbe
from llmplane.runtime.probes import USER_AGENT, http_ok, running_requests, schedule, spread


async def _app_server() -> tuple[web.AppRunner, str, list[tuple[web.Request, object]]]:
    seen: list[tuple[web.Request, object]] = []  # (request, the client's address and port)

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append((request, request.transport.get_extra_info("peername")))  # type: ignore[union-attr]
        code = int(request.match_info["code"])
        if code == 302:
            raise web.HTTPFound("/elsewhere")
        return web.Response(status=code, body=b"x" * 100_000)  # more than one read

    app = web.Application()
    app.router.add_get("/status/{code}", handle)
    runner, address = await _serve(app)
    return runner, f"http://{address}", seen


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    """``app`` on a free port of 127.0.0.1: its runner and ``host:port``."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


async def test_status_codes_decide_and_each_attempt_is_a_new_connection() -> None:
    runner, base, seen = await _app_server()
    try:
        assert await http_ok(f"{base}/status/200", 1) == (True, "")
        assert await http_ok(f"{base}/status/204", 1) == (True, "")
        assert await http_ok(f"{base}/status/302", 1) == (True, "")  # not followed
        ok, why = await http_ok(f"{base}/status/503", 1)
        assert not ok and why == f"GET {base}/status/503: HTTP 503"
        assert [r.path for r, _ in seen] == ["/status/200", "/status/204", "/status/302",
                                             "/status/503"]  # fmt: skip
        assert all(r.headers["User-Agent"] == USER_AGENT for r, _ in seen)
        assert all(r.headers["Connection"] == "close" for r, _ in seen)
        assert len({peer for _, peer in seen}) == len(seen)
    finally:
        await runner.cleanup()


async def test_failures_say_why() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    ok, why = await http_ok(f"http://127.0.0.1:{closed}/health", 1)
    assert not ok and why.startswith(f"GET http://127.0.0.1:{closed}/health: ") and len(why) > 40

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        await asyncio.sleep(5)
        writer.close()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
        await writer.drain()
        writer.close()

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.close()

    for handler, expected in (
        (silent, "no answer within 0.2s"),
        (garbage, "not an HTTP answer"),
        (hang_up, "closed without an answer"),
    ):
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            ok, why = await http_ok(f"http://127.0.0.1:{port}/health", 0.2)
        finally:
            server.close()
        assert not ok and why == f"GET http://127.0.0.1:{port}/health: {expected}", why


async def test_schedule_shifts_the_ticks_after_the_first_by_the_phase() -> None:
    """Replicas started together probe out of step: the phase is added once, after the first
    tick (which stays where initialDelaySeconds puts it: readiness is not delayed)."""
    probe = HttpProbe("/health", 8000, period_seconds=1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    ticks: list[float] = []
    async for counted in schedule(probe, start, start, phase=0.5):
        assert counted
        ticks.append(loop.time())
        if len(ticks) == 2:
            break
    assert ticks[0] - start < 0.5, "the first tick was delayed"
    assert ticks[1] - ticks[0] >= 1.5 - 0.01, "the phase was not added to the second tick"
    phases = {spread(probe) for _ in range(50)}
    assert len(phases) > 40 and all(0 <= p < 1 for p in phases)


async def test_running_requests_reads_a_metrics_page_up_to_its_limit() -> None:
    """The engine's /metrics gives the running requests; a page over PAGE_MAX_BYTES (a broken
    or hostile server) tells nothing rather than being read whole."""
    page = b'vllm:num_requests_running{model_name="m"} 3.0\n'
    pages = [page, page + b"# " + b"x" * PAGE_MAX_BYTES + b"\n"]

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=pages[0])

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner, address = await _serve(app)
    try:
        async with aiohttp.ClientSession() as session:
            assert await running_requests(session, address, 5) == 3
            pages.pop(0)
            assert await running_requests(session, address, 5) is None
    finally:
        await runner.cleanup()
