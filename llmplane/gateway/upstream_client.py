"""A minimal HTTP/1.1 client for the gateway's upstream requests.

aiohttp's client was half of the gateway's Python CPU per request (building a ClientRequest,
cookie filtering, URL and header merging, payload lookup, tracing hooks); the gateway needs
none of that: it sends one POST with bytes it already has to ``host:port`` and reads the answer.
This client keeps idle keep-alive connections per address, writes request line, headers and
body in one ``write`` and parses responses with httptools' C parser (llhttp, as the gateway's
server does requests): Content-Length, chunked, or until close, and it refuses the framings a
request smuggler plays with (two Content-Lengths, Content-Length with chunked). Responses are
delivered whole (``request``) or as de-chunked body pieces (``open`` +
``UpstreamResponse.readany``) for streaming.

Errors: ``UpstreamError`` (an ``OSError``: connection refused or reset, the server closing
before a complete response, a malformed response) and ``TimeoutError``; a connection is reused
only after a complete response that allows keep-alive, and closed when a request is abandoned.

Stale keep-alive connections: engines close idle connections after a few seconds (uvicorn's
default, which vLLM and the llama.cpp engine llmplane runs keep: 5 s; cpp-httplib's, under
llama.cpp's own llama-server: 5 s), so idle ones are kept ``keepalive_timeout`` seconds (4 by
default, below theirs), and a request written on a reused connection that the server closes
or resets before any byte of the answer arrived (it closed the idle connection as the request
went out) is sent once more on a new connection; never once a response byte arrived, never
for a new connection. ``on_resend`` is told each time.
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

from llmplane.gateway.deadlines import Deadlines

_MAX_HEAD = 64 * 1024  # bytes of a response head (with any 1xx heads before it)
# Idle keep-alive connections are closed after this many seconds: below the 5 s after which
# uvicorn (vLLM, llmplane's llama.cpp engine) and cpp-httplib (llama-server) close theirs.
KEEPALIVE_TIMEOUT = 4.0
# A streamed body's pieces that have arrived and not been taken (``next_piece``): above this,
# the connection stops reading until they are, so a client that reads slowly (or never) holds
# the engine back through TCP instead of the gateway buffering the whole generation.
STREAM_HIGH_WATER = 256 * 1024

log = logging.getLogger("llmplane.gateway")

# A connection's states.
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
        # Each line's lower-case name, when the parser has them already.
        self._names = names
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
        names = self._names
        if names is None:
            kept = [
                line for line in self._lines if line[: line.find(b":")].strip().lower() not in skip
            ]
        else:
            # (the parser builds both lists together: one name per line)
            kept = [line for name, line in zip(names, self._lines) if name not in skip]  # noqa: B905
        return b"\r\n".join(kept) + b"\r\n" if kept else b""


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
        conn = self._conn
        return conn._done and not conn._pieces

    async def readany(self) -> bytes:
        """The body bytes that have arrived since the last call (de-chunked, at least one
        byte, waiting if needed); b"" at its end."""
        return await self._conn.next_piece()

    async def read(self) -> bytes:
        parts = []
        while True:
            piece = await self._conn.next_piece()
            if not piece:
                return b"".join(parts)
            parts.append(piece)

    def release(self) -> None:
        """Give the connection back (complete response) or close it (anything else)."""
        self._conn.finish()

    def abort(self, err: Exception) -> None:
        """Close the connection now: a ``readany`` waiting (or the next one) raises ``err``."""
        self._conn._fail(err)


class _Connection:
    """One upstream connection (an asyncio protocol by its methods); its responses are parsed
    by httptools' C parser (llhttp), whose callbacks below collect the head and body pieces;
    waiters are woken once per read, after the parser has taken it."""

    __slots__ = (
        "_buffered",
        "_closed_exc",
        "_done",
        "_framed",
        "_head",
        "_head_waiter",
        "_interim",
        "_keep_alive",
        "_lines",
        "_names",
        "_parser",
        "_piece_waiter",
        "_pieces",
        "_read_paused",
        "_received",
        "_state",
        "_whole",
        "idle_since",
        "key",
        "loop",
        "pool",
        "transport",
    )

    def __init__(self, pool: UpstreamPool, key: str, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.key = key
        # Kept: on Python 3.11 every asyncio.get_running_loop() is a getpid() system call.
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._closed_exc: Exception | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._state = _IDLE
        self._received = 0  # bytes of this request's answer so far (the head's limit)
        self._head_waiter: asyncio.Future[Any] | None = None
        self._piece_waiter: asyncio.Future[None] | None = None
        self._head: tuple[int, RawHeaders] | None = None  # parsed, not yet handed over
        self._lines: list[bytes] = []  # the head's header lines, and their lower-case names
        self._names: list[bytes] = []
        self._framed = False  # Content-Length or Transfer-Encoding: else the body ends at EOF
        self._pieces: collections.deque[bytes] = collections.deque()
        self._buffered = 0  # bytes in ``_pieces`` of a streamed body
        self._read_paused = False  # reading paused until the pieces are taken
        self._done = False
        self._keep_alive = True
        # ``exchange``: the head waiter gets (status, headers, body) once the body is in.
        self._whole = False
        # Set once the connection is pooled: 0.0 means it has never been reused.
        self.idle_since = 0.0
        # A 1xx interim head has ever arrived (never reset: no store per request); such a
        # connection's requests are not sent again (``_unanswered``).
        self._interim = False

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
            self._wake()
            return
        if self._closed_exc is None:
            self._closed_exc = (
                ConnectionLost(f"connection lost: {exc}")
                if exc is not None
                else ServerDisconnected("server disconnected")
            )
        self._wake_all()

    def eof_received(self) -> None:
        """The server shut its side: the transport closes (asyncio.Protocol's default)."""

    def pause_writing(self) -> None:
        """Requests are written whole and small: no back-pressure to keep."""

    def resume_writing(self) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        state = self._state
        if state in (_IDLE, _DONE):
            # Bytes nobody asked for (or after a complete response): never reuse this one.
            self._keep_alive = False
            if state == _IDLE and self.transport is not None:
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
        parser = self._parser
        status = parser.get_status_code()
        lines, names = self._lines, self._names
        self._lines, self._names = [], []
        if status < 200:  # a 1xx interim head: the real one follows
            self._interim = True
            self._framed = False
            return
        self._keep_alive = parser.should_keep_alive()
        self._head = (status, RawHeaders(lines, names))
        self._state = _BODY

    def on_body(self, piece: bytes) -> None:
        self._pieces.append(piece)
        if not self._whole:
            self._buffered += len(piece)

    def on_message_complete(self) -> None:
        if self._state == _BODY:
            self._state = _DONE
            self._done = True

    # --- waking the waiters, once per read ---

    def _wake(self) -> None:
        """Hand over what the last read completed: the head (streams), the whole response
        (``exchange``), body pieces; pause reading while a slow reader leaves them."""
        head = self._head
        if self._whole:
            if self._done and head is not None:
                self._head = None
                waiter = self._head_waiter
                self._head_waiter = None
                pieces = self._pieces
                body = pieces.popleft() if len(pieces) == 1 else b"".join(pieces)
                pieces.clear()
                if waiter is not None and not waiter.done():
                    waiter.set_result((*head, body))
            return
        if head is not None:
            self._head = None
            waiter = self._head_waiter
            self._head_waiter = None
            if waiter is not None and not waiter.done():
                waiter.set_result(head)
        if self._buffered > STREAM_HIGH_WATER and not self._read_paused:
            t = self.transport
            if t is not None:
                self._read_paused = True
                t.pause_reading()
        w = self._piece_waiter
        if w is not None and not w.done() and (self._pieces or self._done):
            w.set_result(None)

    def _fail(self, err: Exception) -> None:
        self._closed_exc = err
        self._keep_alive = False
        if self.transport is not None:
            self.transport.abort()
        self._wake_all()

    def _wake_all(self) -> None:
        exc = self._closed_exc
        for w in (self._head_waiter, self._piece_waiter):
            if w is not None and not w.done():
                w.set_exception(exc)  # type: ignore[arg-type]
        self._head_waiter = self._piece_waiter = None

    # --- used by the pool and responses ---

    @property
    def usable(self) -> bool:
        t = self.transport
        return self._closed_exc is None and t is not None and not t.is_closing()

    def _start(self, whole: bool) -> asyncio.Future[Any]:
        """Ready for the next response. The connection's parser goes on from the last one: a
        connection is reused only after a complete response, where llhttp expects the next."""
        self._state = _HEAD
        self._done = False
        self._whole = whole
        self._head = None
        self._framed = False
        self._received = 0
        if self._pieces:
            self._pieces.clear()
        waiter = self._head_waiter = self.loop.create_future()
        return waiter

    async def send(self, data: bytes) -> UpstreamResponse:
        assert self.transport is not None
        waiter = self._start(False)
        self.transport.write(data)
        status, headers = await waiter
        return UpstreamResponse(self, status, headers)

    def exchange(self, data: bytes) -> asyncio.Future[tuple[int, RawHeaders, bytes]]:
        """Send ``data``; await the returned future for the whole response, woken once (a
        future, not a coroutine: one frame less per request)."""
        assert self.transport is not None
        waiter = self._start(True)
        self.transport.write(data)
        return waiter

    def _resume(self) -> None:
        """The streamed pieces were taken: read again."""
        self._buffered = 0
        if self._read_paused:
            self._read_paused = False
            t = self.transport
            if t is not None and not t.is_closing():
                t.resume_reading()

    async def next_piece(self) -> bytes:
        while True:
            pieces = self._pieces
            if pieces:
                if self._buffered:
                    self._resume()
                if len(pieces) == 1:
                    return pieces.popleft()
                # Everything that has arrived, as one piece: one write to the client.
                data = b"".join(pieces)
                pieces.clear()
                return data
            if self._done:
                return b""
            if self._closed_exc is not None:
                raise self._closed_exc
            waiter = self._piece_waiter = self.loop.create_future()
            try:
                await waiter
            finally:
                self._piece_waiter = None

    def finish(self) -> None:
        """The caller is done with the response: pool the connection if it can be reused."""
        if self._state == _IDLE:
            return
        complete = self._done and not self._pieces
        self._state = _IDLE
        self._pieces.clear()
        self._resume()
        t = self.transport  # ``usable``, inline: once per request
        if (
            complete
            and self._keep_alive
            and self._closed_exc is None
            and t is not None
            and not t.is_closing()
        ):
            self.pool._release(self)
        else:
            self.pool._discard(self)


def _unanswered(conn: _Connection, err: BaseException) -> bool:
    """Whether ``err`` is a reused connection closed or reset by the server before any byte of
    the answer arrived: the server closed it as idle while the request went out, without
    reading it, so the request may go again on a new connection (Go's net/http does so for
    replayable requests; an inference POST has no side effect beyond the compute). A new
    connection (never pooled: ``idle_since`` 0), a byte of the answer (a head begun, a 1xx)
    or any other error (a timeout, a malformed answer) says no."""
    return (
        conn.idle_since != 0.0
        and isinstance(err, (ServerDisconnected, ConnectionLost))
        and conn._state == _HEAD
        and not conn._received
        and not conn._interim
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
        deadlines = self._deadlines
        if deadlines is None:
            deadlines = self._deadlines = Deadlines(asyncio.get_running_loop())
        return deadlines

    async def request(
        self, address: str, data: bytes, timeout: float | None = None
    ) -> tuple[int, RawHeaders, bytes]:
        """Send ``data`` (a complete request) and read the whole response, within ``timeout``
        seconds in total (connecting included)."""
        with (self._deadlines or self.deadlines).after(timeout):
            conn = self._idle_one(address) or await self._acquire(address)
            try:
                result = await conn.exchange(data)
            except BaseException as err:
                conn._keep_alive = False
                stale = _unanswered(conn, err)
                conn.finish()
                if not stale:
                    raise
                self._resending(conn)
                conn = await self._acquire(address, fresh=True)
                try:
                    result = await conn.exchange(data)
                except BaseException:
                    conn._keep_alive = False
                    conn.finish()
                    raise
            conn.finish()
            return result

    async def open(self, address: str, data: bytes) -> UpstreamResponse:
        """Send ``data`` and return once the response head is in; call ``release()`` after."""
        conn = await self._acquire(address)
        try:
            return await conn.send(data)
        except BaseException as err:
            conn._keep_alive = False
            stale = _unanswered(conn, err)
            conn.finish()
            self._discard(conn)
            if not stale:
                raise
        self._resending(conn)
        conn = await self._acquire(address, fresh=True)
        try:
            return await conn.send(data)
        except BaseException:
            conn._keep_alive = False
            conn.finish()
            self._discard(conn)
            raise

    def _resending(self, conn: _Connection) -> None:
        """Count and log a request sent again because ``conn`` went stale (``_unanswered``)."""
        self.resends += 1
        idle = time.monotonic() - conn.idle_since
        log.info(
            "upstream %s closed a keep-alive connection (idle %.1f s before the request) "
            "without answering: the request goes again on a new connection",
            conn.key,
            idle,
        )
        if self.on_resend is not None:
            self.on_resend(conn.key)

    def _idle_one(self, address: str) -> _Connection | None:
        """An idle keep-alive connection to ``address`` still good to use, if there is one."""
        if self._closed:
            raise UpstreamError("the upstream pool is closed")
        idle = self._idle.get(address)
        if idle:
            now = time.monotonic()
            while idle:
                conn = idle.pop()
                t = conn.transport  # ``usable``, inline: once per request
                if (
                    conn._closed_exc is None
                    and t is not None
                    and not t.is_closing()
                    and now - conn.idle_since < self.keepalive_timeout
                ):
                    return conn
                self._discard(conn)
        return None

    async def _acquire(self, address: str, fresh: bool = False) -> _Connection:
        """A connection to ``address``: an idle one if there is one (not when ``fresh``), else
        a new one once the limit allows."""
        conn = None if fresh else self._idle_one(address)
        if conn is not None:
            return conn
        if self._closed:
            raise UpstreamError("the upstream pool is closed")
        while self.limit and len(self._open) >= self.limit:
            if self._close_oldest_idle():
                continue  # an idle connection elsewhere made room
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
            idle = None if fresh else self._idle.get(address)
            if idle:
                conn = idle.pop()
                if conn.usable:
                    return conn
                self._discard(conn)
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

    def warm(self, address: str) -> bool:
        """Whether a request to ``address`` would find an idle keep-alive connection (no TCP
        connect): the scheduler prefers such endpoints among equally scored ones."""
        idle = self._idle.get(address)
        if not idle:
            return False
        conn = idle[-1]  # the one ``_idle_one`` would take, if not too old
        t = conn.transport
        return (
            conn._closed_exc is None
            and t is not None
            and not t.is_closing()
            and time.monotonic() - conn.idle_since < self.keepalive_timeout
        )

    def connections(self, address: str) -> int:
        """Open connections to ``address``, busy or idle (tests, debugging)."""
        return sum(1 for conn in self._open if conn.key == address)

    def _close_oldest_idle(self) -> bool:
        """Close the longest-idle connection (to any address), if there is one: at the limit,
        idle keep-alive connections to other endpoints (the scraper keeps one per endpoint)
        must not make a request wait."""
        oldest: _Connection | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest.idle_since):
                oldest = idle[0]
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
    """Request line, ``Host``, the given headers (already without hop-by-hop ones),
    ``Content-Length`` and the body, as one buffer."""
    parts = [f"{method} {path_qs} HTTP/1.1\r\nHost: {address}\r\n"]
    has_accept = False
    for k, v in headers.items():
        if not has_accept and k.lower() == "accept":
            has_accept = True
        parts.append(f"{k}: {v}\r\n")
    if not has_accept:
        parts.append("Accept: */*\r\n")
    parts.append(f"Content-Length: {len(body)}\r\n\r\n")
    return "".join(parts).encode("utf-8", "surrogateescape") + body
