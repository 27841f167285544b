"""A minimal HTTP/1.1 client for the gateway's upstream requests.

aiohttp's client was half of the gateway's Python CPU per request (ClientRequest, cookies, URL
and header merging, tracing hooks); the gateway sends one POST with bytes it already has to
``host:port`` and reads the answer. This client keeps idle keep-alive connections per address,
writes a request in one ``write`` and parses responses with httptools' C parser (llhttp, as the
gateway's server does requests): Content-Length, chunked, or until close; it refuses the
framings a request smuggler plays with (two Content-Lengths, Content-Length with chunked).
``request`` gives a whole response, ``open`` + ``UpstreamResponse.readany`` de-chunked pieces.

Errors: ``UpstreamError`` (an ``OSError``: refused, reset, closed before a complete response,
malformed) and ``TimeoutError``. A connection is reused only after a complete response that
allows keep-alive, and closed when a request is abandoned.

Stale keep-alive connections: engines close idle connections after 5 s (uvicorn under vLLM and
llmplane's llama.cpp engine; cpp-httplib under llama-server), so idle ones are kept
``keepalive_timeout`` (4 s) seconds, and a request on a reused connection that the server
closes or resets before any byte of the answer (it closed the idle connection as the request
went out) is sent once more on a new connection: never after a response byte, never for a new
connection. ``on_resend`` is told each time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from llmplane.aio import BodyTooLarge
from llmplane.gateway.deadlines import Deadlines

_MAX_HEAD = 64 * 1024  # bytes of a response head (with any 1xx heads before it)
KEEPALIVE_TIMEOUT = 4.0  # seconds an idle connection is kept: below the engines' 5 s
# A body's bytes that have arrived and not been taken: above this the connection stops reading
# until they are, so a slow client of a stream holds the engine back through TCP instead of the
# gateway buffering the whole generation.
STREAM_HIGH_WATER = 256 * 1024

log = logging.getLogger("llmplane.gateway")

# A connection's states: no request, waiting for the head, reading the body, response complete.
_IDLE, _HEAD, _BODY, _DONE = 0, 1, 2, 3


class UpstreamError(OSError):
    """The upstream connection failed or answered with something that is not HTTP/1.x."""


class ServerDisconnected(UpstreamError):
    """The server closed the connection (EOF) before the response was complete."""


class ConnectionLost(UpstreamError):
    """The connection failed (reset, broken pipe) before the response was complete."""


class RawHeaders(Mapping[str, str]):
    """A response's header lines as received. Relaying them (``forward``) copies the bytes;
    a case-insensitive multidict is decoded only if someone looks a header up."""

    __slots__ = ("_lines", "_multi", "_names")

    def __init__(self, lines: list[bytes], names: list[bytes] | None = None) -> None:
        self._lines = lines
        # Each line's lower-case name (the parser has them already).
        self._names = names if names is not None else [_name(line) for line in lines]
        self._multi: CIMultiDictProxy[str] | None = None

    def _decoded(self) -> CIMultiDictProxy[str]:
        if self._multi is None:
            headers: CIMultiDict[str] = CIMultiDict()
            for line in self._lines:
                name, _, value = line.partition(b":")
                headers.add(
                    name.strip().decode("utf-8", "surrogateescape"),
                    value.strip().decode("utf-8", "surrogateescape"),
                )
            self._multi = CIMultiDictProxy(headers)
        return self._multi

    def __getitem__(self, key: str) -> str:
        return self._decoded()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._lines)

    def forward(self, skip: frozenset[bytes]) -> bytes:
        """The header lines whose lower-case name is not in ``skip``, CRLF-terminated."""
        kept = [line for name, line in zip(self._names, self._lines) if name not in skip]  # noqa: B905
        return b"\r\n".join(kept) + b"\r\n" if kept else b""


def _name(line: bytes) -> bytes:
    return line[: line.find(b":")].strip().lower()


class UpstreamResponse:
    """Status and headers of a response whose body is read with ``readany`` / ``read``."""

    __slots__ = ("_conn", "headers", "status")

    def __init__(self, conn: _Connection, status: int, headers: RawHeaders) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers

    @property
    def ended(self) -> bool:
        """The whole body has arrived and been read: the next ``readany`` gives b""."""
        return self._conn._state == _DONE and not self._conn._pieces

    async def readany(self) -> bytes:
        """The body bytes that have arrived since the last call (de-chunked, at least one
        byte, waiting if needed); b"" at its end."""
        return await self._conn.next_piece()

    async def read(self, limit: int | None = None) -> bytes:
        """The rest of the body; ``BodyTooLarge`` as soon as more than ``limit`` bytes arrive
        (the connection reads at most ``STREAM_HIGH_WATER`` ahead of this)."""
        parts = []
        size = 0
        while piece := await self._conn.next_piece():
            size += len(piece)
            if limit is not None and size > limit:
                raise BodyTooLarge(f"a response body of more than {limit} bytes")
            parts.append(piece)
        return b"".join(parts)

    def release(self) -> None:
        """Give the connection back (complete response) or close it (anything else)."""
        self._conn.finish()

    def abort(self, err: Exception) -> None:
        """Close the connection now: a ``readany`` waiting (or the next one) raises ``err``."""
        self._conn._fail(err)


class _Connection(asyncio.Protocol):
    """One upstream connection. httptools' callbacks below collect a response's head and body
    pieces; the one waiter (for the head or for a piece) is woken once per read."""

    __slots__ = ("_buffered", "_error", "_framed", "_head", "_keep_alive", "_lines", "_names",
                 "_parser", "_pieces", "_read_paused", "_received", "_state", "_waiter",
                 "idle_since", "key", "loop", "pool", "transport")  # fmt: skip

    def __init__(self, pool: UpstreamPool, key: str, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.key = key
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._error: Exception | None = None  # the connection failed: every wait raises it
        # One parser for the connection's life: it is reused only after a complete response,
        # where llhttp expects the next.
        self._parser = httptools.HttpResponseParser(self)
        self._state = _IDLE
        self._received = 0  # bytes of this request's answer so far
        self._waiter: asyncio.Future[None] | None = None
        self._head: tuple[int, RawHeaders] | None = None
        self._lines: list[bytes] = []  # the head's header lines, and their lower-case names
        self._names: list[bytes] = []
        self._framed = False  # Content-Length or Transfer-Encoding: else the body ends at EOF
        self._pieces: collections.deque[bytes] = collections.deque()
        self._buffered = 0  # bytes in ``_pieces``
        self._read_paused = False
        self._keep_alive = True
        self.idle_since = 0.0  # when it was last pooled; 0.0: never (a new connection)

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool._forget(self)
        if self._state == _BODY and not self._framed and exc is None:
            self.on_message_complete()  # a body without framing ends with the connection
        elif self._error is None:
            self._error = (
                ConnectionLost(f"connection lost: {exc}")
                if exc is not None
                else ServerDisconnected("server disconnected")
            )
        self._wake()

    def data_received(self, data: bytes) -> None:
        if self._state in (_IDLE, _DONE):
            # Bytes nobody asked for (or after a complete response): never reuse this one.
            self._keep_alive = False
            if self._state == _IDLE and self.transport is not None:
                self.transport.close()
            return
        self._received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamError("malformed response: an upgrade, not an answer"))
            return
        except httptools.HttpParserError as err:
            if self._state != _DONE:  # (garbage after a complete response: not reused)
                self._fail(UpstreamError(f"malformed response: {err}"))
                return
            self._keep_alive = False
        if self._state == _HEAD and self._received > _MAX_HEAD:
            self._fail(UpstreamError("response head too large"))
            return
        if self._buffered > STREAM_HIGH_WATER and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        self._wake()

    # --- httptools' callbacks (within ``feed_data``) ---

    def on_message_begin(self) -> None:
        if self._state == _DONE:  # more after a complete response: never reuse this one
            self._keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-length" or lower == b"transfer-encoding":
            self._framed = True
        self._lines.append(name + b": " + value)
        self._names.append(lower)

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        lines, names = self._lines, self._names
        self._lines, self._names = [], []
        if status < 200:  # a 1xx interim head: the real one follows
            self._framed = False
            return
        self._keep_alive = self._parser.should_keep_alive()
        self._head = (status, RawHeaders(lines, names))
        self._state = _BODY

    def on_body(self, piece: bytes) -> None:
        self._pieces.append(piece)
        self._buffered += len(piece)

    def on_message_complete(self) -> None:
        if self._state == _BODY:
            self._state = _DONE

    # --- waiting ---

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._error is not None:
                waiter.set_exception(self._error)
            else:
                waiter.set_result(None)

    async def _wait(self) -> None:
        """Until the next read or failure (which raises)."""
        if self._error is not None:
            raise self._error
        waiter = self._waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _fail(self, err: Exception) -> None:
        self._error = err
        self._keep_alive = False
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    # --- used by the pool and responses ---

    @property
    def usable(self) -> bool:
        t = self.transport
        return self._error is None and t is not None and not t.is_closing()

    def _start(self) -> None:
        """Ready for the next response."""
        self._state = _HEAD
        self._head = None
        self._framed = False
        self._received = 0
        self._pieces.clear()

    async def send(self, data: bytes) -> UpstreamResponse:
        """Write a request; return once its response's head is in."""
        assert self.transport is not None
        self._start()
        self.transport.write(data)
        while self._head is None:
            await self._wait()
        return UpstreamResponse(self, *self._head)

    async def next_piece(self) -> bytes:
        while True:
            pieces = self._pieces
            if pieces:
                self._resume()
                # Everything that has arrived, as one piece: one write to the client.
                data = pieces.popleft() if len(pieces) == 1 else b"".join(pieces)
                pieces.clear()
                return data
            if self._state != _BODY:
                return b""
            await self._wait()

    def _resume(self) -> None:
        """The pieces were taken: read again."""
        self._buffered = 0
        if self._read_paused:
            self._read_paused = False
            if self.usable:
                self.transport.resume_reading()  # type: ignore[union-attr]

    def finish(self) -> None:
        """The caller is done with the response: pool the connection if it can be reused."""
        if self._state == _IDLE:
            return
        complete = self._state == _DONE and not self._pieces
        self._state = _IDLE
        self._pieces.clear()
        self._resume()
        if complete and self._keep_alive and self.usable:
            self.pool._release(self)
        else:
            self.pool._discard(self)


def _unanswered(conn: _Connection, err: BaseException) -> bool:
    """Whether ``err`` is a reused connection closed or reset by the server before any byte of
    the answer: the server closed it as idle while the request went out, without reading it,
    so the request may go again on a new connection (Go's net/http does so for replayable
    requests; an inference POST has no side effect beyond the compute). A new connection
    (``idle_since`` 0), a byte of the answer (a head begun, a 1xx) or any other error (a
    timeout, a malformed answer) says no."""
    return (
        conn.idle_since != 0.0
        and isinstance(err, (ServerDisconnected, ConnectionLost))
        and conn._state == _HEAD
        and not conn._received
    )


class UpstreamPool:
    """Keep-alive connections per ``host:port``; at most ``limit`` open at once (0 = no limit).

    ``on_resend(address)`` is called when a request goes again on a new connection because the
    server closed the reused one before answering (``_unanswered``)."""

    def __init__(
        self,
        limit: int = 1024,
        keepalive_timeout: float = KEEPALIVE_TIMEOUT,
        connect_timeout: float = 5.0,
        on_resend: Callable[[str], None] | None = None,
    ) -> None:
        self.limit = limit
        self.keepalive_timeout = keepalive_timeout
        self.connect_timeout = connect_timeout
        self.on_resend = on_resend
        self.resends = 0  # requests sent again after a stale connection (tests, debugging)
        self._idle: dict[str, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        self._deadlines: Deadlines | None = None

    @property
    def deadlines(self) -> Deadlines:
        """The timeouts of this pool's requests (and of callers' ``with`` blocks around them)."""
        if self._deadlines is None:
            self._deadlines = Deadlines(asyncio.get_running_loop())
        return self._deadlines

    async def request(
        self, address: str, data: bytes, timeout: float | None = None, limit: int | None = None
    ) -> tuple[int, RawHeaders, bytes]:
        """Send ``data`` (a complete request) and read the whole response, within ``timeout``
        seconds in total (connecting included) and ``limit`` bytes of body."""
        with self.deadlines.after(timeout):
            resp = await self.open(address, data)
            try:
                body = await resp.read(limit)
            finally:
                resp.release()
            return resp.status, resp.headers, body

    async def open(self, address: str, data: bytes) -> UpstreamResponse:
        """Send ``data`` and return once the response head is in; call ``release()`` after."""
        conn = await self._acquire(address)
        while True:
            try:
                return await conn.send(data)
            except BaseException as err:
                stale = _unanswered(conn, err)
                conn._keep_alive = False
                conn.finish()
                if not stale:
                    raise
            self.resends += 1
            log.info(
                "upstream %s closed a keep-alive connection (idle %.1f s before the request) "
                "without answering: the request goes again on a new connection",
                address,
                time.monotonic() - conn.idle_since,
            )
            if self.on_resend is not None:
                self.on_resend(address)
            try:
                conn = await self._acquire(address, fresh=True)  # (a new one is never stale)
            except ConnectionRefusedError as refused:
                # It held the request a moment ago and listens no more: the replica was lost
                # (its process died with the request on it), not a replica that never answered.
                raise ConnectionLost(f"connection lost, then refused: {refused}") from refused

    def _fresh(self, conn: _Connection, now: float) -> bool:
        return conn.usable and now - conn.idle_since < self.keepalive_timeout

    def warm(self, address: str) -> bool:
        """Whether a request to ``address`` would find an idle keep-alive connection (no TCP
        connect): the scheduler prefers such endpoints among equally scored ones."""
        idle = self._idle.get(address)
        return bool(idle) and self._fresh(idle[-1], time.monotonic())  # type: ignore[index]

    async def _acquire(self, address: str, fresh: bool = False) -> _Connection:
        """A connection to ``address``: an idle one still good to use (not when ``fresh``),
        else a new one once the limit allows."""
        while True:
            if self._closed:
                raise UpstreamError("the upstream pool is closed")
            idle = None if fresh else self._idle.get(address)
            while idle:
                conn = idle.pop()
                if self._fresh(conn, time.monotonic()):
                    return conn
                self._discard(conn)
            if not self.limit or len(self._open) < self.limit:
                break
            if self._close_oldest_idle():
                continue  # an idle connection elsewhere made room
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        host, _, port = address.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        loop = asyncio.get_running_loop()
        conn = _Connection(self, address, loop)
        self._open.add(conn)
        try:
            with self.deadlines.after(self.connect_timeout):
                await loop.create_connection(lambda: conn, host, int(port or 80))
        except BaseException:
            self._discard(conn)
            raise
        return conn

    def _release(self, conn: _Connection) -> None:
        if self._closed:
            self._discard(conn)
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)
        self._wake()

    def connections(self, address: str) -> int:
        """Open connections to ``address``, busy or idle (tests, debugging)."""
        return sum(1 for conn in self._open if conn.key == address)

    def _close_oldest_idle(self) -> bool:
        """Close the longest-idle connection (to any address), if there is one: at the limit,
        idle keep-alive connections to other endpoints (the scraper keeps one per endpoint)
        must not make a request wait."""
        heads = [idle[0] for idle in self._idle.values() if idle]
        oldest = min(heads, key=lambda conn: conn.idle_since, default=None)
        if oldest is None:
            return False
        self._discard(oldest)
        return True

    def _discard(self, conn: _Connection) -> None:
        if conn.transport is not None and not conn.transport.is_closing():
            conn.transport.close()
        self._forget(conn)

    def _forget(self, conn: _Connection) -> None:
        if conn in self._open:
            self._open.discard(conn)
            idle = self._idle.get(conn.key)
            if idle and conn in idle:
                idle.remove(conn)
            self._wake()

    def _wake(self) -> None:
        """Let one request waiting for room go on."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def close(self) -> None:
        self._closed = True
        if self._deadlines is not None:
            self._deadlines.close()
        for conn in list(self._open):
            if conn.transport is not None:
                conn.transport.close()
        self._open.clear()
        self._idle.clear()
        await asyncio.sleep(0)


def encode_request(method: str, path_qs: str, address: str, headers: Any, body: bytes) -> bytes:
    """Request line, ``Host``, the given headers (already without hop-by-hop ones), ``Accept``
    unless given, ``Content-Length`` and the body, as one buffer."""
    lines = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
    accept = "" if any(k.lower() == "accept" for k in headers) else "Accept: */*\r\n"
    head = f"{method} {path_qs} HTTP/1.1\r\nHost: {address}\r\n{lines}{accept}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode("utf-8", "surrogateescape") + body
