"""The gateway's HTTP/1.1 client (``llmplane.gateway.upstream_client.UpstreamPool``) against a
real asyncio server on 127.0.0.1 that answers with bytes each test scripts: body framings
(Content-Length, chunked, until close, none), 1xx, keep-alive reuse and when a connection must
not be reused, the connection limit, timeouts, malformed answers and a closed pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from llmplane.aio import BodyTooLarge
from llmplane.gateway.upstream_client import (
    ConnectionLost,
    ServerDisconnected,
    UpstreamError,
    UpstreamPool,
    encode_request,
)
from llmplane.testing import eventually

OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'

# A reply: bytes to write (a list: written one by one with a pause in between), or None to
# send nothing (hang), then whether to close the connection afterwards.
Reply = tuple[bytes | list[bytes] | None, bool]


@dataclass
class Upstream:
    """Counts connections and requests; ``reply(n)`` scripts the answer to request number n."""

    reply: Callable[[int], Reply] = lambda n: (OK, False)
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    address: str = ""
    handlers: set[asyncio.Task[None]] = field(default_factory=set)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                data, close = self.reply(len(self.requests))
                if data is None:
                    await asyncio.sleep(3600)
                for piece in data if isinstance(data, list) else [data]:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.01)
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    behaviour = Upstream()
    server = await asyncio.start_server(behaviour.serve, "127.0.0.1", 0)
    behaviour.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield behaviour
    finally:
        server.close()
        for task in behaviour.handlers:  # connections still open (a hanging reply)
            task.cancel()
        await asyncio.gather(*behaviour.handlers, return_exceptions=True)
        await server.wait_closed()


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    p = UpstreamPool(limit=4)
    try:
        yield p
    finally:
        await p.close()


def post(address: str, body: bytes = b'{"model":"m"}') -> bytes:
    return encode_request("POST", "/v1/completions", address, {"Content-Type": "x"}, body)


async def test_request_encoding_and_keep_alive_reuse(upstream, pool) -> None:
    for _ in range(3):
        status, headers, body = await pool.request(upstream.address, post(upstream.address))
        assert (status, body, headers["content-type"]) == (200, b'{"ok":true}', "application/json")
    assert upstream.connections == 1  # one connection, reused
    assert pool.warm(upstream.address)  # idle in the pool: the next request takes it
    first = upstream.requests[0]
    assert first.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: " + upstream.address.encode())
    assert b"Accept: */*\r\n" in first and b"Content-Length: 13\r\n\r\n" in first
    assert first.endswith(b'{"model":"m"}')


async def test_chunked_body_arrives_in_pieces_and_whole(upstream, pool) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunks = [head, b"5\r\nhello\r\n", b"6;ext=1\r\n world\r\n", b"0\r\nX-Trailer: t\r\n\r\n"]
    upstream.reply = lambda n: (chunks, False)
    resp = await pool.open(upstream.address, post(upstream.address))
    pieces = []
    while piece := await resp.readany():
        pieces.append(piece)
    resp.release()
    assert b"".join(pieces) == b"hello world" and len(pieces) >= 2  # streamed, not buffered
    # The connection survived the chunked body (trailers read) and is reused.
    assert (await pool.request(upstream.address, post(upstream.address)))[2] == b"hello world"
    assert upstream.connections == 1


async def test_interim_1xx_is_skipped_and_204_has_no_body(upstream, pool) -> None:
    continue_then_ok = b"HTTP/1.1 100 Continue\r\n\r\n" + OK
    no_content = b"HTTP/1.1 204 No Content\r\n\r\n"
    upstream.reply = lambda n: (continue_then_ok if n == 1 else no_content, False)
    assert (await pool.request(upstream.address, post(upstream.address), timeout=5))[0] == 200
    assert await pool.request(upstream.address, post(upstream.address), timeout=5) == (204, {}, b"")
    assert upstream.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        # body until the server closes: complete, but the connection is gone
        b"HTTP/1.1 200 OK\r\n\r\nuntil close",
        # the server says so
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 11\r\n\r\nuntil close",
        # HTTP/1.0 without keep-alive
        b"HTTP/1.0 200 OK\r\nContent-Length: 11\r\n\r\nuntil close",
    ],
    ids=["until-close", "connection-close", "http-1.0"],
)
async def test_connections_that_must_not_be_reused_are_not(upstream, pool, answer) -> None:
    upstream.reply = lambda n: (answer, True)
    for _ in range(2):
        status, _, body = await pool.request(upstream.address, post(upstream.address))
        assert (status, body) == (200, b"until close")
    assert upstream.connections == 2


@pytest.mark.parametrize(
    ("answer", "connections"),
    [
        # the server says close but leaves the connection open: the client closes it
        (b"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 11\r\n\r\nuntil close", 2),
        # an HTTP/1.0 server that keeps it alive, among other tokens
        (
            b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive, x\r\nContent-Length: 11\r\n\r\nuntil close",
            1,
        ),
    ],
    ids=["close-left-open", "http-1.0-keep-alive"],
)
async def test_the_connection_header_decides_reuse(upstream, pool, answer, connections) -> None:
    upstream.reply = lambda n: (answer, False)
    for _ in range(2):
        status, _, body = await pool.request(upstream.address, post(upstream.address))
        assert (status, body) == (200, b"until close")
    assert upstream.connections == connections


async def test_a_whole_response_in_one_read_or_split_or_with_bytes_after_it(upstream, pool) -> None:
    # One read holding head and body (the usual case, taken without copying through the
    # buffer), the body split after the head or inside it, and bytes nobody asked for after a
    # complete body (read with it): the same answer each time; only the last connection is
    # not reused.
    half = OK.index(b"\r\n\r\n") + 4
    replies = {1: OK, 2: [OK[:half], OK[half:]], 3: [OK[: half + 3], OK[half + 3 :]], 4: OK + b"X"}
    upstream.reply = lambda n: (replies[n], False)
    for n in range(1, 5):
        status, headers, body = await pool.request(upstream.address, post(upstream.address))
        assert (status, body, headers["content-length"]) == (200, b'{"ok":true}', "11"), n
        assert upstream.connections == 1, n
    await eventually(lambda: not pool._open, what="the connection with stray bytes closed")


async def test_an_idle_connection_the_server_closed_is_not_used(upstream, pool) -> None:
    upstream.reply = lambda n: (OK, True)  # closes after answering, without saying so
    assert (await pool.request(upstream.address, post(upstream.address)))[0] == 200
    await eventually(lambda: not pool._open, what="the pool to notice the close")
    assert (await pool.request(upstream.address, post(upstream.address)))[0] == 200
    assert upstream.connections == 2


async def test_idle_connections_expire_after_the_keepalive_timeout(upstream) -> None:
    pool = UpstreamPool(keepalive_timeout=0.0)  # every idle connection is already too old
    try:
        for _ in range(2):
            assert (await pool.request(upstream.address, post(upstream.address)))[0] == 200
            assert not pool.warm(upstream.address)  # pooled, but too old to be taken
        assert upstream.connections == 2
    finally:
        await pool.close()


async def test_the_limit_bounds_open_connections_and_waiters_get_one(upstream) -> None:
    pool = UpstreamPool(limit=1)
    try:
        upstream.reply = lambda n: ([OK[:20], OK[20:]], False)  # a little slow
        results = await asyncio.gather(
            *(pool.request(upstream.address, post(upstream.address)) for _ in range(5))
        )
        assert [r[0] for r in results] == [200] * 5
        assert upstream.connections == 1
    finally:
        await pool.close()


async def test_a_timeout_abandons_the_connection(upstream, pool) -> None:
    upstream.reply = lambda n: (None, False) if n == 1 else (OK, False)  # the first one hangs
    with pytest.raises(TimeoutError):
        await pool.request(upstream.address, post(upstream.address), timeout=0.2)
    # The abandoned connection is never handed out again (its answer could still arrive).
    assert (await pool.request(upstream.address, post(upstream.address)))[0] == 200
    assert upstream.connections == 2


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"SPDY/3 200 OK\r\n\r\n", "malformed response: Expected HTTP/"),
        (b"HTTP/1.1 abc OK\r\n\r\n", "malformed response: Invalid status"),
        (b"HTTP/1.1 200 OK\r\nno-colon\r\n\r\n", "malformed response: Invalid header"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "Invalid character in Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "in chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", "after chunk data"),
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000, "response head too large"),
        # Framing a smuggler would play with: refused, not guessed.
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "Duplicate"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nab",
            "Transfer-Encoding can't be present with Content-Length",
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
            "upgrade",
        ),
    ],
    ids=[
        "not-http",
        "status",
        "header",
        "length",
        "chunk-size",
        "chunk-crlf",
        "head-size",
        "two-lengths",
        "length-and-chunked",
        "upgrade",
    ],
)
async def test_malformed_answers_are_upstream_errors(upstream, pool, answer, error) -> None:
    upstream.reply = lambda n: (answer, False)
    with pytest.raises(UpstreamError, match=error):
        await pool.request(upstream.address, post(upstream.address), timeout=5)
    upstream.reply = lambda n: (OK, False)  # and the broken connection is not reused
    assert (await pool.request(upstream.address, post(upstream.address)))[0] == 200
    assert upstream.connections == 2


async def test_a_server_closing_mid_response_or_refusing(upstream, pool) -> None:
    upstream.reply = lambda n: (OK[:-4], True)  # Content-Length says 11, fewer arrive
    with pytest.raises(ServerDisconnected):
        await pool.request(upstream.address, post(upstream.address), timeout=5)
    with pytest.raises(OSError):  # nothing listens on the discard port
        await pool.request("127.0.0.1:9", post("127.0.0.1:9"), timeout=5)


async def test_a_closed_pool_refuses_new_requests(upstream) -> None:
    pool = UpstreamPool()
    assert (await pool.request(upstream.address, post(upstream.address)))[0] == 200
    await pool.close()
    with pytest.raises(UpstreamError, match="closed"):
        await pool.request(upstream.address, post(upstream.address))
    await eventually(lambda: upstream.connections == 1, what="the one connection")


# Stale keep-alive connections. The scripted server reads a request and closes the connection
# without answering: what the gateway sees when an engine closes an idle connection as the
# request goes out (tests/integration/test_gateway_upstream_keepalive.py has the real race).


async def test_a_reused_connection_closed_unanswered_sends_the_request_again_once(upstream):
    resent: list[str] = []
    pool = UpstreamPool(on_resend=resent.append)
    upstream.reply = lambda n: (b"", True) if n == 2 else (OK, False)
    try:
        assert (await pool.request(upstream.address, post(upstream.address)))[0] == 200
        # Request 2 goes out on the pooled connection, which the server closes unanswered;
        # request 3 is the same request on a new connection.
        assert (await pool.request(upstream.address, post(upstream.address)))[0] == 200
        assert upstream.requests[1] == upstream.requests[2]
        assert (len(upstream.requests), upstream.connections) == (3, 2)
        assert resent == [upstream.address] and pool.resends == 1
        # Streaming (``open``) the same way.
        upstream.reply = lambda n: (b"", True) if n == 4 else (OK, False)
        resp = await pool.open(upstream.address, post(upstream.address))
        assert resp.status == 200 and await resp.read() == b'{"ok":true}'
        resp.release()
        assert (len(upstream.requests), upstream.connections) == (5, 3)
        assert resent == [upstream.address] * 2
    finally:
        await pool.close()


async def test_a_server_gone_after_closing_the_reused_connection_is_a_lost_one() -> None:
    """A replica that dies with a request on a reused connection closes it unanswered and then
    refuses the resend: the request was lost on it (``ConnectionLost``: the retry loop's
    "replica lost", a 503 with Retry-After), not refused by a replica that never answered."""
    behaviour = Upstream()
    server = await asyncio.start_server(behaviour.serve, "127.0.0.1", 0)
    address = behaviour.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

    def die(n: int) -> Reply:
        if n == 1:
            return OK, False
        server.close()  # stops listening: the resend is refused
        return b"", True

    behaviour.reply = die
    pool = UpstreamPool()
    try:
        assert (await pool.request(address, post(address)))[0] == 200
        with pytest.raises(ConnectionLost, match="refused"):
            await pool.request(address, post(address), timeout=5)
        assert pool.resends == 1
    finally:
        await pool.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("stream", [False, True])
async def test_no_resend_after_a_response_byte_or_on_a_new_connection(upstream, stream):
    resent: list[str] = []
    pool = UpstreamPool(on_resend=resent.append)

    async def call() -> None:
        if stream:
            resp = await pool.open(upstream.address, post(upstream.address))
            await resp.read()  # the whole answer read: the connection is pooled
            resp.release()
        else:
            await pool.request(upstream.address, post(upstream.address), timeout=5)

    try:
        # A new connection closed unanswered: the server saw the request; not sent again.
        upstream.reply = lambda n: (b"", True) if n == 1 else (OK, False)
        with pytest.raises(ServerDisconnected):
            await call()
        assert len(upstream.requests) == 1
        # A reused connection closed after part of the answer (bytes of the head, or a 1xx).
        await call()  # request 2: a new connection, pooled after
        for n, partial in (
            (3, b"HTTP/1.1 200 OK\r\nContent-"),
            (5, b"HTTP/1.1 100 Continue\r\n\r\n"),
        ):
            upstream.reply = lambda m, n=n, partial=partial: (
                (partial, True) if m == n else (OK, False)
            )
            with pytest.raises(ServerDisconnected):
                await call()
            assert len(upstream.requests) == n
            await call()  # request n + 1 on a new connection, pooled for the next round
        # A resent request that fails again fails: sent twice, never more.
        upstream.reply = lambda n: (b"", True) if n >= 7 else (OK, False)
        with pytest.raises(ServerDisconnected):
            await call()
        assert len(upstream.requests) == 8
        assert resent == [upstream.address]
    finally:
        await pool.close()


async def test_a_body_over_the_limit_fails_as_it_arrives_not_at_its_end(upstream, pool) -> None:
    """The body never ends (three 100 KiB chunks, then the server waits): a read with a limit
    fails once the bytes pass it, and the connection is not reused."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"19000\r\n" + b"x" * 0x19000 + b"\r\n"
    upstream.reply = lambda n: ([head, chunk, chunk, chunk], False) if n == 1 else (OK, False)
    async with asyncio.timeout(10):  # (without the limit: waits for the end forever)
        with pytest.raises(BodyTooLarge, match="more than 204800 bytes"):
            await pool.request(upstream.address, post(upstream.address), limit=200 * 1024)
        assert (await pool.request(upstream.address, post(upstream.address)))[2] == b'{"ok":true}'
    assert upstream.connections == 2
