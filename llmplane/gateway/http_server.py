"""The gateway's HTTP/1.1 server: httptools' C parser on an asyncio Protocol.

Why not aiohttp's server: for every request it builds a header multidict, a Request with URL
parsing, a payload stream and a response with a multidict of its own, and runs the handler
through several coroutine layers; py-spy showed that as the largest share of the gateway's
Python time per request. Here httptools' callbacks parse a request into plain objects, a
response is one ``transport.write``, and a stream is chunked by hand.

What it does: keep-alive and pipelining (requests on a connection are answered in order), the
request-body limit (413 without buffering the rest), ``Expect: 100-continue``, HEAD for GET
routes, write back-pressure for streams, limits on a head's size and time, a body's time, the
bodies held at once and the connections (at the cap an idle one is closed to make room, else
503), and a graceful close that lets in-flight requests finish. A handler is cancelled when its
client goes away: its upstream connection closes and the engine aborts the request.

The request/response classes keep the attribute names of aiohttp's (``headers``, ``path_qs``;
``Response``, ``StreamResponse.prepare/write/write_eof``) so handlers read the same.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools
import orjson

from llmplane.aio import wait_event
from llmplane.gateway.clip import clip

log = logging.getLogger("llmplane.gateway.http_server")

MAX_HEADER_BYTES = 64 * 1024  # request line + headers; over it: 431
MAX_QUEUED = 32  # pipelined requests waiting on one connection before reading pauses
HEADER_TIMEOUT = 10.0  # seconds from a head's first byte (or from connecting) to its end
EVICTION_SCAN = 64  # connections looked at for an idle one when a new one arrives at the cap
_HEAD_TOO_LARGE = f"the request line and headers are over {MAX_HEADER_BYTES} bytes"

_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}


def _date_header() -> bytes:
    """``Date`` and ``Server`` lines; the server refreshes its copy once a second."""
    return f"Date: {formatdate(usegmt=True)}\r\nServer: llmplane\r\n".encode()


def _message(
    status: int,
    raw_headers: bytes,
    headers: dict[str, str] | None,
    date: bytes,
    framing: bytes,
    keep_alive: bool,
    body: bytes = b"",
) -> bytes:
    """A response's bytes: status line, relayed header lines, ours, Date/Server, the framing
    header, ``Connection: close`` unless ``keep_alive``, the blank line, ``body``."""
    line = _STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode()
    ours = "".join([f"{k}: {v}\r\n" for k, v in headers.items()]) if headers else ""
    close = b"" if keep_alive else b"Connection: close\r\n"
    ours_bytes = ours.encode("utf-8", "surrogateescape")
    return b"".join((line, raw_headers, ours_bytes, date, framing, close, b"\r\n", body))


class Headers(dict[str, str]):
    """Request headers by lower-case name; lookups ignore case. A repeated header's values are
    joined with ``", "`` (RFC 9110 5.3)."""

    __slots__ = ()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return dict.__getitem__(self, key.lower())

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key.lower() if isinstance(key, str) else key)


@dataclass(slots=True, eq=False)
class HttpRequest:
    """One request as read off the wire (the parsed body is an ``InferenceRequest``)."""

    _protocol: _Protocol
    method: str
    path: str
    path_qs: str  # the request target as sent (path and query)
    headers: Headers
    body: bytes
    version: str
    keep_alive: bool
    too_large: bool  # the body was over the limit and was not kept

    def __repr__(self) -> str:
        return f"HttpRequest(method={self.method!r}, path_qs={self.path_qs!r})"

    @property
    def content_length(self) -> int | None:
        value = dict.get(self.headers, "content-length")
        return int(value) if value is not None and value.isdigit() else None


class Response:
    """A whole response, written in one piece."""

    __slots__ = ("body", "headers", "raw_headers", "status")

    def __init__(
        self,
        *,
        status: int = 200,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        content_type: str | None = None,
        raw_headers: bytes = b"",
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.raw_headers = raw_headers  # CRLF-terminated lines relayed as they came
        if content_type is not None:
            self.headers = {**(headers or {}), "Content-Type": content_type}

    def encode(self, keep_alive: bool, head: bool, date: bytes) -> bytes:
        bodied = self.status >= 200 and self.status not in (204, 304)
        framing = b"Content-Length: %d\r\n" % len(self.body) if bodied else b""
        body = b"" if head else self.body
        return _message(
            self.status, self.raw_headers, self.headers, date, framing, keep_alive, body
        )


class StreamResponse:
    """A response whose body is written piece by piece (``Transfer-Encoding: chunked``; for an
    HTTP/1.0 client, raw bytes and the connection closes at the end)."""

    __slots__ = ("_chunked", "_protocol", "finished", "headers", "prepared", "raw_headers",
                 "status")  # fmt: skip

    def __init__(
        self, *, status: int = 200, headers: dict[str, str] | None = None, raw_headers: bytes = b""
    ) -> None:
        self.status = status
        self.headers = headers
        self.raw_headers = raw_headers
        self.prepared = False
        self.finished = False
        self._protocol: _Protocol | None = None
        self._chunked = True

    async def prepare(self, request: HttpRequest, first: bytes = b"", last: bool = False) -> None:
        """Send the head; with ``first``, the body's first piece in the same write, and with
        ``last`` the end of the body too (a relay that has them already saves a write each)."""
        self._protocol = request._protocol
        self.prepared = True
        self._chunked = request.version != "1.0"
        if not self._chunked:
            request.keep_alive = False
        framing = b"Transfer-Encoding: chunked\r\n" if self._chunked else b""
        date = request._protocol.server.date
        body = self._framed(first, last)
        await self._send(
            _message(
                self.status, self.raw_headers, self.headers, date, framing, request.keep_alive, body
            )
        )

    async def write(self, data: bytes, last: bool = False) -> None:
        """Send ``data`` as it is (chunk-framed); ``last``: and end the body in the same write."""
        assert self._protocol is not None, "prepare() first"
        await self._send(self._framed(data, last))

    async def write_eof(self) -> None:
        if self.finished:
            return
        end = self._framed(b"", True)
        protocol = self._protocol
        if end and protocol is not None and not protocol.closed:
            protocol.transport.write(end)

    def _framed(self, data: bytes, last: bool) -> bytes:
        if last:
            self.finished = True
        if not self._chunked or (not data and not last):
            return data
        if not data:
            return b"0\r\n\r\n"
        return (b"%x\r\n%b\r\n0\r\n\r\n" if last else b"%x\r\n%b\r\n") % (len(data), data)

    async def _send(self, data: bytes) -> None:
        protocol = self._protocol
        assert protocol is not None
        if protocol.closed:
            raise ConnectionResetError("the client closed the connection")
        if data:
            protocol.transport.write(data)
            if protocol.write_paused:
                await protocol.drain()


Handler = Callable[[HttpRequest], Awaitable["Response | StreamResponse"]]


def error_body(message: str, kind: str, code: str, param: str | None = None) -> bytes:
    """OpenAI's error shape (``param`` always there: null unless one request field is at
    fault); gateway/errors.py builds its errors on it."""
    error = {"message": message, "type": kind, "param": param, "code": code}
    return orjson.dumps({"error": error})


def _error(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> Response:
    """The server's own errors: malformed or refused requests, limits, timeouts, a failed
    handler."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 503:
        kind = "service_unavailable"
    return Response(
        status=status,
        body=error_body(message, kind, code),
        headers={"Content-Type": "application/json", **(headers or {})},
    )


class _TooLarge(Exception):
    pass


class _Protocol(asyncio.Protocol):
    """One client connection: httptools' callbacks parse its requests into ``queue``, and one
    serving task answers them in order."""

    __slots__ = ("_body", "_complete", "_drain", "_failed", "_head_left", "_header_bytes",
                 "_headers", "_held", "_in_body", "_more", "_read_paused", "_refusal",
                 "_too_large", "_url", "body_since", "busy", "closed", "head_since",
                 "idle_since", "parser", "queue", "server", "task", "transport",
                 "write_paused")  # fmt: skip

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.queue: collections.deque[HttpRequest | Response] = collections.deque()
        # The serving task: started by the first request, then parked on ``_more`` between
        # requests, for as long as the connection lives.
        self.task: asyncio.Task[None] | None = None
        self._more: asyncio.Future[None] | None = None
        self.busy = False  # a request is queued or being answered
        self.closed = False
        self.write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._read_paused = False
        self.idle_since = time.monotonic()  # when its last request finished
        self.on_message_begin()  # the fields of the request being read
        # Raw bytes a head may still take; counted as they arrive, because httptools keeps
        # an unfinished header line to itself (growing it by copying) until the line ends.
        self._head_left = MAX_HEADER_BYTES
        self._in_body = False  # between a head's end and its message's end
        # When the head being read began (None: between requests, where the keep-alive idle
        # timeout applies instead); a new connection must send its first head in time too.
        self.head_since: float | None = time.monotonic()
        self.body_since: float | None = None  # when the body being read began (its head ended)
        # Body bytes of this connection counted in ``server.body_bytes``: the body being read,
        # and those of its requests queued or being answered.
        self._held = 0
        self._failed = False  # a parse error is queued: read nothing more

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        server = self.server
        if (
            server.max_connections
            and len(server.connections) >= server.max_connections
            and not server.make_room()
        ):
            busy = _error(503, "too many connections to the gateway", "server_busy",
                          {"Retry-After": "1"})  # fmt: skip
            self.transport.write(busy.encode(False, False, server.date))
            self.transport.close()
            self.closed = self._failed = True
            return
        server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self.task is not None and not self.task.done():
            # The client is gone: stop its request, which closes the upstream connection, so
            # the engine aborts the generation instead of computing tokens nobody will read.
            self.task.cancel()
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("the client closed the connection"))
            self._drain.exception()  # retrieved: nobody may be waiting
        self.queue.clear()
        # Nothing of the connection outlives it: the parser holds this protocol's callbacks
        # (a cycle only a full garbage collection would find), and the body it was reading
        # would stay with them.
        self.parser = None  # type: ignore[assignment]
        self._body = b""
        self._headers = Headers()
        self._url = b""
        self._refusal = None
        self._drain = self._more = None
        self._release(self._held)

    def _release(self, size: int) -> None:
        """``size`` body bytes of this connection are no longer held."""
        size = min(size, self._held)
        self._held -= size
        self.server.body_bytes -= size

    def data_received(self, data: bytes) -> None:
        try:
            self._feed(data)
        except httptools.HttpParserUpgrade:
            if self._complete and self.queue:
                # The request that asked to upgrade (or CONNECT) is queued and will be
                # answered; it is the connection's last: no second, unsolicited response.
                last = self.queue[-1]
                if isinstance(last, HttpRequest):
                    last.keep_alive = False
                self._failed = True  # the parser stays paused: read nothing more
                self.transport.pause_reading()
            else:
                self._fail(_error(400, "protocol upgrades are not supported", "bad_request"))
        except httptools.HttpParserCallbackError as err:
            if isinstance(err.__context__, _TooLarge):
                self._fail(_error(431, _HEAD_TOO_LARGE, "headers_too_large"))
            else:
                log.exception("request parsing failed")
                self._fail(_error(400, "malformed request", "bad_request"))
        except httptools.HttpParserError as err:
            self._fail(_error(400, f"malformed HTTP request: {err}", "bad_request"))

    def _feed(self, data: bytes) -> None:
        """Feed the parser a head no more than its remaining budget at a time: 431 once it is
        spent (a head that ends inside a piece leaves the rest to the next head's budget)."""
        while data and not self._failed:
            if self._in_body:
                self.parser.feed_data(data)
                return
            if self.head_since is None:
                self.head_since = time.monotonic()
            piece = data[: self._head_left]
            self.parser.feed_data(piece)
            if self.head_since is not None:  # the head goes on past this piece
                self._head_left -= len(piece)
                if self._head_left <= 0:
                    self._fail(_error(431, _HEAD_TOO_LARGE, "headers_too_large"))
                    return
            data = data[len(piece) :]

    def idle(self) -> bool:
        """No request under way, queued or arriving (a keep-alive connection between requests,
        or a new one that has sent nothing): closing it loses nothing."""
        return (
            not self.busy
            and not self.queue
            and not self._in_body
            and not self.closed
            and self._head_left == MAX_HEADER_BYTES
        )

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    async def drain(self) -> None:
        """Until the client has taken what was written (back-pressure for streams)."""
        if not self.write_paused:
            return
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()
        await self._drain

    # --- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = Headers()
        # One piece (the usual case) or a bytearray: never a list of pieces, so a body sent
        # in 1-byte chunks costs its length, not an object per chunk.
        self._body: bytes | bytearray = b""
        self._header_bytes = 0  # of the head being parsed (request line and header lines)
        self._too_large = False
        self._refusal: Response | None = None  # answered instead of the request (417, 503)
        self._complete = False  # the message ended (an upgrade after it needs no reply)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        key = name.decode("latin-1").lower()
        text = value.decode("utf-8", "surrogateescape")
        headers = self._headers
        known = dict.get(headers, key)
        headers[key] = text if known is None else f"{known}, {text}"

    def _count_head(self, size: int) -> None:
        """The parsed head's size (the raw count in ``_feed`` misses a head that begins in the
        piece where the previous one ended)."""
        self._header_bytes += size
        if self._header_bytes > MAX_HEADER_BYTES:
            raise _TooLarge

    def on_headers_complete(self) -> None:
        self._head_left = MAX_HEADER_BYTES
        self.head_since = None
        self._in_body = True
        self.body_since = time.monotonic()
        headers = self._headers
        length = dict.get(headers, "content-length")
        if length is not None and length.isdigit() and int(length) > self.server.max_body:
            self._too_large = True
        expect = dict.get(headers, "expect")
        if expect is not None and self.parser.get_http_version() == "1.1":
            if expect.lower() != "100-continue":
                self._refusal = _error(417, f"unknown Expect: {expect}", "expectation_failed")
            elif not self._too_large:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._too_large or self._refusal is not None:
            return
        server, size = self.server, len(body)
        if len(self._body) + size > server.max_body:
            self._too_large = True
            self._drop_body()
            return
        if server.max_body_total and server.body_bytes + size > server.max_body_total:
            # Over the bodies held at once: the rest of this one is read and dropped (as for
            # a 413), then 503 and close.
            self._drop_body()
            self._refusal = _error(
                503,
                "the gateway holds too many request bodies at once; retry later",
                "server_busy",
                {"Retry-After": "1"},
            )
            return
        server.body_bytes += size
        self._held += size
        collected = self._body
        if not collected:
            self._body = body  # one piece: kept as it came, no copy
        elif isinstance(collected, bytearray):
            collected += body
        else:
            self._body = bytearray(collected) + body

    def _drop_body(self) -> None:
        self._release(len(self._body))
        self._body = b""

    def on_message_complete(self) -> None:
        parser = self.parser
        method = parser.get_method().decode("latin-1")
        self._complete = True
        self._in_body = False
        self.body_since = None
        if method == "CONNECT":  # a proxy request: not for us; one answer, then close
            self._refusal = _error(405, "CONNECT is not supported", "method_not_allowed",
                                   {"Allow": "GET, HEAD, POST"})  # fmt: skip
        if self._refusal is not None:
            self.queue.append(self._refusal)
        else:
            raw = self._url.decode("latin-1")
            path = raw.partition("?")[0]
            if "%" in path:
                path = unquote(path)
            body = bytes(self._body) if isinstance(self._body, bytearray) else self._body
            version, keep_alive = parser.get_http_version(), parser.should_keep_alive()
            self.queue.append(HttpRequest(self, method, path, raw, self._headers, body, version,
                                          keep_alive, self._too_large))  # fmt: skip
        self._body = b""
        if not self._wake() and len(self.queue) > MAX_QUEUED and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def _fail(self, response: Response) -> None:
        """A request we cannot parse: answer it after the ones before it, then close."""
        self._failed = True
        self.head_since = None
        self.queue.append(response)
        self._wake()
        self.transport.pause_reading()

    # --- serving ------------------------------------------------------------------------------

    def _wake(self) -> bool:
        """Get the queue served: start the serving task, or wake it where it is parked. False
        if it is busy already (it takes the queue in order)."""
        if self.task is None:
            self.busy = True
            self.task = self.server.loop.create_task(self._serve())  # type: ignore[union-attr]
            return True
        more = self._more
        if more is None:
            return False
        self._more = None
        self.busy = True
        if not more.done():
            more.set_result(None)
        return True

    async def _serve(self) -> None:
        queue, server = self.queue, self.server
        try:
            while not self.closed:
                if not queue:
                    if server.closing:
                        return
                    # Park until the connection's next request (``_wake``).
                    self.busy = False
                    self.idle_since = time.monotonic()
                    self._more = server.loop.create_future()  # type: ignore[union-attr]
                    await self._more
                    continue
                request = queue.popleft()
                if isinstance(request, Response):  # a refusal decided while parsing
                    self.transport.write(request.encode(False, False, server.date))
                    self.transport.close()
                    return
                try:
                    response = server.guard and server.guard(request)
                    response = response or await server.dispatch(request)
                except Exception:
                    log.exception("handler failed: %s %s", request.method, clip(request.path))
                    response = _error(500, "internal error in the gateway", "internal_error")
                self._release(len(request.body))  # the handler is done with it
                if self.closed:
                    return
                if isinstance(response, Response):
                    head = request.method == "HEAD"
                    self.transport.write(response.encode(request.keep_alive, head, server.date))
                elif not response.prepared:
                    await response.prepare(request)
                    await response.write_eof()
                elif not response.finished:
                    # The handler gave up mid-stream (the upstream broke): no final chunk,
                    # so the client sees a truncated response, not a complete one.
                    self.transport.close()
                    return
                if not request.keep_alive or server.closing:
                    self.transport.close()
                    return
                if self._read_paused and len(queue) <= MAX_QUEUED // 2:
                    self._read_paused = False
                    self.transport.resume_reading()
        except (ConnectionError, asyncio.CancelledError):
            if not self.closed:
                self.transport.close()
            raise
        finally:
            self.task = self._more = None
            self.busy = False
            self.idle_since = time.monotonic()
            if server.closing:
                self.transport.close()
                if not server.busy():
                    server.idle.set()


class HttpServer:
    """Routes by exact (method, path); anything else goes to ``fallback``."""

    def __init__(
        self,
        routes: dict[tuple[str, str], Handler],
        fallback: Handler,
        *,
        max_body: int,
        max_body_total: int = 0,
        keepalive_timeout: float = 75.0,
        header_timeout: float = HEADER_TIMEOUT,
        body_timeout: float = 0.0,
        max_connections: int = 0,
        guard: Callable[[HttpRequest], Response | None] | None = None,
    ) -> None:
        self.routes = dict(routes)
        for (method, path), handler in routes.items():
            if method == "GET":
                self.routes.setdefault(("HEAD", path), handler)
        # A known path asked with another method: 405 naming the methods it takes.
        self.allowed: dict[str, str] = {}
        for method, path in sorted(self.routes):
            known = self.allowed.get(path)
            self.allowed[path] = f"{known}, {method}" if known else method
        self.fallback = fallback
        self.max_body = max_body
        # Body bytes held at once across all connections (``_Protocol._held``); over
        # ``max_body_total`` (0: no cap) a body gets 503 and its connection is closed.
        self.max_body_total = max_body_total
        self.body_bytes = 0
        self.body_timeout = body_timeout  # seconds from a head's end to its body's; 0: none
        self.keepalive_timeout = keepalive_timeout
        self.header_timeout = header_timeout
        self.max_connections = max_connections  # 0: no cap
        self.guard = guard  # checked before routing; a Response it returns is the answer
        self.connections: set[_Protocol] = set()
        self.closing = False
        self.idle = asyncio.Event()
        self.date = _date_header()
        self._server: asyncio.base_events.Server | None = None
        self._ticker: asyncio.Task[None] | None = None
        # The serving loop, kept: on Python 3.11 every asyncio.get_running_loop() is a
        # getpid() system call.
        self.loop: asyncio.AbstractEventLoop | None = None

    async def dispatch(self, request: HttpRequest) -> Response | StreamResponse:
        handler = self.routes.get((request.method, request.path))
        if handler is None:
            allow = self.allowed.get(request.path)
            if allow is not None:
                message = f"{request.method} is not allowed on {clip(request.path)}"
                return _error(405, message, "method_not_allowed", {"Allow": allow})
            handler = self.fallback
        return await handler(request)

    def busy(self) -> bool:
        return any(c.busy for c in self.connections)

    def make_room(self) -> bool:
        """At the connection cap: close an idle connection for the new one. Looks at no more
        than ``EVICTION_SCAN`` connections, so a cap full of busy ones costs a new connection
        little; False then (the new one is refused)."""
        for conn in itertools.islice(self.connections, EVICTION_SCAN):
            if conn.idle():
                self.connections.discard(conn)  # its place is the new connection's now
                conn.transport.close()
                return True
        return False

    async def start(
        self, host: str, port: int, backlog: int = 2048, sock: socket.socket | None = None
    ) -> int:
        """Serve on ``host:port``, or on ``sock``, a listening socket a supervisor shares
        between worker processes (``llmplane/gateway/workers``)."""
        loop = self.loop = asyncio.get_running_loop()
        where: dict[str, Any] = (
            {"sock": sock}
            if sock is not None
            else {"host": host, "port": port, "reuse_address": True}
        )
        self._server = await loop.create_server(lambda: _Protocol(self), backlog=backlog, **where)
        self._ticker = loop.create_task(self._tick())
        return self._server.sockets[0].getsockname()[1]

    async def _tick(self) -> None:
        """Once a second: the Date header, and the time limits of heads, bodies and idle
        keep-alive connections (one sweep instead of a timer armed and cancelled per request)."""
        while True:
            await asyncio.sleep(1.0)
            self.date = _date_header()
            now = time.monotonic()
            for conn in list(self.connections):
                if conn.busy or conn.queue:
                    continue
                head, body = conn.head_since, conn.body_since
                if head is not None and self.header_timeout:
                    if now - head > self.header_timeout:
                        self._time_out(conn, "the request head took too long")
                elif body is not None and self.body_timeout:
                    if now - body > self.body_timeout:
                        self._time_out(conn, "the request body took too long")
                elif (
                    head is None
                    and self.keepalive_timeout
                    and now - conn.idle_since > self.keepalive_timeout
                ):
                    conn.transport.close()

    def _time_out(self, conn: _Protocol, message: str) -> None:
        """408 and close: a head or a body that did not arrive in time."""
        conn.transport.write(
            _error(408, message, "request_timeout").encode(False, False, self.date)
        )
        conn.transport.close()

    async def close(self, grace: float = 60.0) -> None:
        """Stop accepting, close idle connections, let in-flight requests finish (up to
        ``grace`` seconds), then close the rest."""
        self.closing = True
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if not conn.busy and not conn.queue:
                conn.transport.close()
        deadline = time.monotonic() + grace
        while self.busy() and time.monotonic() < deadline:
            self.idle.clear()
            await wait_event(self.idle, max(0.0, deadline - time.monotonic()))
        for conn in list(self.connections):
            if conn.task is not None:
                conn.task.cancel()
            conn.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
