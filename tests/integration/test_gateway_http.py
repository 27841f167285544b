"""The gateway's own HTTP/1.1 server (``llmplane/gateway/http_server.py``) on the wire: keep-alive,
pipelining, body limits, Expect, HEAD, HTTP/1.0, malformed input, idle timeout, a stream whose
replica breaks, and a graceful close. Raw sockets where a client library would hide the bytes;
behind the gateway a real ``llmplane.sim`` engine."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest

from llmplane.controlplane.plan import MODEL_NAME_LABEL
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import Endpoint, StaticDiscovery
from llmplane.gateway.http_server import HttpRequest, HttpServer, Response
from llmplane.gateway.server import start_gateway
from llmplane.testing import eventually, sim
from tests.integration.openai_errors import assert_openai_error

MODEL = "m"
BODY = orjson.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 3, "ignore_eos": True})


@pytest.fixture(scope="module")
def engine():
    with sim(MODEL, "--time-scale", "0.01") as server:
        yield server


async def _gateway(engine, **config):
    discovery = StaticDiscovery(
        [Endpoint(engine.address, {MODEL_NAME_LABEL: MODEL}, MODEL, fixed_port=True)]
    )
    return await start_gateway(None, discovery, config=GatewayConfig(**config))


@pytest.fixture
async def gateway(engine):
    gw = await _gateway(engine, max_body_bytes=4096, client_keepalive_timeout=2.0)
    yield gw
    await gw.close()


def request(path: str = "/v1/completions", body: bytes = BODY, **headers: str) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\n"
    head += "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    return head.encode() + b"\r\n" + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response with a Content-Length body."""
    status_line = await asyncio.wait_for(reader.readline(), 10)
    assert status_line, "connection closed before a response"
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def connect(gw) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", gw.port)


async def test_keep_alive_and_pipelined_requests_are_answered_in_order(gateway):
    reader, writer = await connect(gateway)
    try:
        # Three requests in one write: a completion, a 404 path, a completion.
        writer.write(request() + request("/v1/nope") + request())
        responses = [await read_response(reader) for _ in range(3)]
        assert [r[0] for r in responses] == [200, 404, 200]
        assert orjson.loads(responses[0][2])["object"] == "text_completion"
        assert_openai_error(404, responses[1][2], 404, "not_found")
        assert responses[0][1]["x-llmplane-endpoint"] == gateway.registry.states.popitem()[0]
        # ... and the connection is still open for a fourth.
        writer.write(request())
        assert (await read_response(reader))[0] == 200
    finally:
        writer.close()


async def test_body_over_the_limit_is_413_without_reading_it(gateway):
    reader, writer = await connect(gateway)
    try:
        big = b"x" * 10_000
        writer.write(request(body=big))
        status, _headers, body = await read_response(reader)
        error = assert_openai_error(status, body, 413, "request_too_large")
        assert "10000 bytes" in error["message"]
        # A chunked body over the limit too (no Content-Length to check up front).
        chunk = b"y" * 3000
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%b\r\n" % (len(chunk), chunk) * 2
            + b"0\r\n\r\n"
        )
        assert (await read_response(reader))[0] == 413
        # ... while a chunked body under the limit is reassembled and served.
        half = len(BODY) // 2
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%b\r\n" % (half, BODY[:half])
            + b"%x\r\n%b\r\n" % (len(BODY) - half, BODY[half:])
            + b"0\r\n\r\n"
        )
        status, _, body = await read_response(reader)
        assert status == 200 and orjson.loads(body)["usage"]["completion_tokens"] == 3
    finally:
        writer.close()


async def test_expect_100_continue_and_unknown_expectations(gateway):
    reader, writer = await connect(gateway)
    try:
        head, _, body = request(Expect="100-continue").partition(b"\r\n\r\n")
        writer.write(head + b"\r\n\r\n")
        assert await asyncio.wait_for(reader.readline(), 10) == b"HTTP/1.1 100 Continue\r\n"
        assert await reader.readline() == b"\r\n"
        writer.write(body)
        assert (await read_response(reader))[0] == 200
    finally:
        writer.close()
    reader, writer = await connect(gateway)
    try:
        writer.write(request(Expect="something-else"))
        status, headers, body = await read_response(reader)
        assert headers["connection"] == "close"
        assert_openai_error(status, body, 417, "expectation_failed")
    finally:
        writer.close()


async def test_head_get_routes_and_http10(gateway):
    reader, writer = await connect(gateway)
    try:
        writer.write(
            b"HEAD /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )
        status_line = await reader.readline()
        assert status_line.startswith(b"HTTP/1.1 200")
        headers = {}
        while (line := await reader.readline()) != b"\r\n":
            k, _, v = line.decode().partition(":")
            headers[k.lower()] = v.strip()
        assert int(headers["content-length"]) == len(b'{"status":"ok"}')
        # No body after HEAD: the next bytes are the GET's response.
        status, _, body = await read_response(reader)
        assert status == 200 and body == b'{"status":"ok"}'
    finally:
        writer.close()
    reader, writer = await connect(gateway)
    try:
        writer.write(b"GET /health HTTP/1.0\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the gateway
    finally:
        writer.close()


async def test_malformed_request_and_oversized_headers(gateway):
    reader, writer = await connect(gateway)
    try:
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        status, _headers, body = await read_response(reader)
        assert_openai_error(status, body, 400, "bad_request")
        assert await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        writer.close()
    reader, writer = await connect(gateway)
    try:
        writer.write(request(X_Big="a" * 70_000))
        status, _, body = await read_response(reader)
        assert_openai_error(status, body, 431, "headers_too_large")
    finally:
        writer.close()


async def test_idle_keep_alive_connections_are_closed(gateway):
    reader, writer = await connect(gateway)
    try:
        writer.write(request())
        assert (await read_response(reader))[0] == 200
        # client_keepalive_timeout is 2 s in this fixture.
        assert await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        writer.close()


async def test_a_replica_breaking_mid_stream_with_none_to_continue_on_ends_with_an_error(
    engine, gateway
):
    """The one replica breaks the stream: nowhere to continue it (gateway/migration.py), so
    the client gets what was streamed, an error event and [DONE]: a complete response."""
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"http://{engine.address}/admin/faults", json={"disconnect_after": 2}
        ) as r:
            assert r.status == 200
        try:
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 20, "stream": True}
            events = []
            async with s.post(f"http://127.0.0.1:{gateway.port}/v1/completions", json=body) as r:
                assert r.status == 200
                async for line in r.content:
                    if line.startswith(b"data: "):
                        events.append(line.strip())
            assert len(events) == 4 and events[-1] == b"data: [DONE]", events
            error = orjson.loads(events[2][6:])["error"]
            assert error["code"] == "stream_lost" and "no other replica" in error["message"]
        finally:
            async with s.post(
                f"http://{engine.address}/admin/faults", json={"disconnect_after": None}
            ) as r:
                assert r.status == 200


async def test_close_lets_in_flight_requests_finish_and_refuses_new_ones(engine):
    gw = await _gateway(engine)
    port = gw.port
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 1500, "ignore_eos": True}
        # time-scale 0.01: 1,500 tokens take about 0.1 s, so close() starts mid-request.
        slow = asyncio.ensure_future(s.post(f"http://127.0.0.1:{port}/v1/completions", json=body))
        await eventually(
            lambda: any(st.inflight for st in gw.registry.states.values()),
            what="the request in flight",
            every=0.001,
        )
        t = time.monotonic()
        await gw.close()
        waited = time.monotonic() - t
        r = await slow
        assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 1500
        assert waited > 0.02  # close() waited for it rather than returning at once
        r.release()
        with pytest.raises(aiohttp.ClientConnectionError):
            await s.post(f"http://127.0.0.1:{port}/health")


async def test_a_client_that_goes_away_aborts_its_request_on_the_engine(processes):
    slow = processes.sim(MODEL, "--time-scale", "1")  # 2,000 tokens, ~6.5 ms a step: ~13 s
    gw = await _gateway(slow)

    async def aborts() -> float:
        async with aiohttp.ClientSession() as s, s.get(f"http://{slow.address}/metrics") as r:
            for line in (await r.text()).splitlines():
                if line.startswith("vllm:request_success_total") and 'reason="abort"' in line:
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    try:
        before = await aborts()
        _, writer = await connect(gw)
        body = orjson.dumps(
            {"model": MODEL, "prompt": "hi", "max_tokens": 2000, "ignore_eos": True}
        )
        writer.write(request(body=body))
        await writer.drain()
        state = await eventually(
            lambda: next(iter(gw.registry.states.values()), None), what="the engine registered"
        )
        await eventually(lambda: state.inflight, 5, what="the request in flight")
        assert state.inflight == 1
        writer.close()  # the client gives up
        # the engine stopped generating, within 5 s (not after the ~13 s of the whole answer)
        await eventually(lambda: state.inflight == 0, 5, what="the request to end")

        async def aborted() -> bool:
            return await aborts() > before

        await eventually(aborted, 5, what="an abort counted on the engine", every=0.05)
        assert await aborts() == before + 1
        assert 'status="499"' in gw.metrics.render().decode()
    finally:
        await gw.close()


async def read_chunked(reader: asyncio.StreamReader) -> tuple[dict[str, str], bytes]:
    """One chunked response's headers and de-chunked body (to its final 0-size chunk)."""
    status_line = await asyncio.wait_for(reader.readline(), 10)
    assert status_line.startswith(b"HTTP/1.1 200"), status_line
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    assert headers["transfer-encoding"] == "chunked"
    body = b""
    while size := int(await asyncio.wait_for(reader.readline(), 10), 16):
        body += await reader.readexactly(size)
        assert await reader.readexactly(2) == b"\r\n"
    assert await reader.readexactly(2) == b"\r\n"  # no trailers: the response ends here
    return headers, body


async def test_streams_end_framed_on_a_kept_connection_and_raw_for_http10(gateway):
    # The relay sends the head with the first piece and the final chunk with the last one
    # when the engine's stream has ended: the framing stays exact, the connection reusable.
    stream = orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": True})
    reader, writer = await connect(gateway)
    try:
        for _ in range(2):
            writer.write(request(body=stream))
            headers, body = await read_chunked(reader)
            assert headers["content-type"].startswith("text/event-stream")
            assert body.count(b"data: ") == 4 and body.endswith(b"data: [DONE]\n\n")
        writer.write(request())  # the same connection still serves (a unary completion)
        status, _, _ = await read_response(reader)
        assert status == 200
    finally:
        writer.close()
    reader, writer = await connect(gateway)
    try:
        writer.write(request(body=stream).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        raw = await asyncio.wait_for(reader.read(), 10)  # to the close
        head, _, body = raw.partition(b"\r\n\r\n")
        assert b"transfer-encoding" not in head.lower() and b"connection: close" in head.lower()
        assert body.count(b"data: ") == 4 and body.endswith(b"data: [DONE]\n\n")
    finally:
        writer.close()


async def test_a_repeated_header_reaches_the_handler_with_its_values_joined():
    # RFC 9110 5.3, whatever the case of the name; also one-character and empty values (which
    # Python may hand back as one shared string object each time).
    async def echo(req: HttpRequest) -> Response:
        return Response(body=orjson.dumps(dict(req.headers)), content_type="application/json")

    server = HttpServer({("POST", "/echo"): echo}, echo, max_body=1024)
    port = await server.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST /echo HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 1\r\nX-B: b\r\nX-C:\r\n"
            b"x-c:\r\nX-D: one\r\nX-d: two\r\nContent-Length: 0\r\n\r\n"
        )
        status, _, body = await read_response(reader)
        assert status == 200
        headers = orjson.loads(body)
        assert (headers["x-a"], headers["x-b"], headers["x-c"]) == ("1, 1", "b", ", ")
        assert headers["x-d"] == "one, two" and headers["host"] == "h"
    finally:
        writer.close()
        await server.close(1.0)
