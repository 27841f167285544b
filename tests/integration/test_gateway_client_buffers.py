"""What a client can make a gateway process hold, measured from outside (RSS from /proc, raw
sockets): request bodies of connections that went away, bodies held at once, a body sent too
slowly, and a stream its client does not read. Issue 27 (items 5, 6, 13) has the figures
before: 69 MB -> 3.4 GB over three rounds of half-sent bodies, and about 24 MB buffered per
unread stream of 100,000 tokens."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from llmplane.testing.process import Process, sim
from llmplane.testing.wait import always, wait_for
from tests.integration.gatewayprocess import GatewayProcess, read_all
from tests.integration.openai_errors import assert_openai_error

MODEL = "m"
MIB = 1024 * 1024


def head(length: int | None, path: str = "/v1/completions") -> bytes:
    framing = (
        b"Content-Length: %d" % length if length is not None else b"Transfer-Encoding: chunked"
    )
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s\r\n\r\n"
        % (path.encode(), framing)
    )


def request(body: dict) -> bytes:
    data = orjson.dumps(body)
    return head(len(data)) + data


def parse(response: bytes) -> tuple[int, bytes, dict]:
    """Status, head and JSON body of one Content-Length response."""
    line, _, rest = response.partition(b"\r\n")
    top, _, body = rest.partition(b"\r\n\r\n")
    return int(line.split(b" ", 2)[1]), top, orjson.loads(body)


def routable(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request({"model": MODEL, "prompt": "hi", "max_tokens": 1}))
        return read_all(s).startswith(b"HTTP/1.1 200 ")


@pytest.fixture
def engine() -> Iterator[Process]:
    # Room for one long generation: 100,000 tokens of about 240 bytes of SSE each.
    server = sim(MODEL, "--time-scale", "0", "--max-model-len", "300000", "--num-blocks", "40000")
    yield server
    server.stop()


def gateway(tmp: Path, engine: Process, settings: dict | None = None) -> GatewayProcess:
    gw = GatewayProcess(tmp, settings)
    gw.register("sim", engine.address, MODEL)
    wait_for(lambda: routable(gw.port), 30, 0.05, what="the sim to be routable")
    return gw


# --- item 5: bodies of connections that went away -------------------------------------------


def test_bodies_of_closed_connections_are_freed_at_once(tmp_path: Path, engine: Process) -> None:
    """Three rounds of connections that send most of a 15 MiB body and close: before, each
    body stayed with its connection's parser until a full garbage collection."""
    gw = gateway(tmp_path, engine)
    try:
        baseline = gw.rss_mb()
        for round_ in range(3):
            conns = []
            for _ in range(12):
                s = socket.create_connection(("127.0.0.1", gw.port))
                s.sendall(head(15 * MIB) + b"x" * (10 * MIB))
                conns.append(s)
            wait_for(lambda: gw.rss_mb() > baseline + 60, 30, 0.05, what="the bodies to arrive")
            for s in conns:
                s.close()
            wait_for(
                lambda: gw.rss_mb() < baseline + 40,
                15,
                0.1,
                what=f"round {round_}: the gateway's memory back near {baseline:.0f} MB",
            )
        assert routable(gw.port)
    finally:
        gw.stop()


def test_bodies_held_at_once_are_capped(tmp_path: Path, engine: Process) -> None:
    """``maxBodyBytesTotal``: the body that would go over it is not kept (read and dropped, as
    for a 413), gets 503 and its connection closes; bodies of other connections, and later
    ones, are unaffected."""
    gw = gateway(tmp_path, engine, {"maxBodyBytesTotal": 8 * MIB})
    held = []
    try:
        for _ in range(2):  # 2 x 3 MiB of 4 MiB bodies: held, under the cap
            s = socket.create_connection(("127.0.0.1", gw.port))
            s.sendall(head(4 * MIB) + b"x" * (3 * MIB))
            held.append(s)
        with socket.create_connection(("127.0.0.1", gw.port)) as over:
            over.sendall(head(4 * MIB) + b"x" * (4 * MIB))  # read and dropped, then answered
            answer = read_all(over)
        status, top, body = parse(answer)
        assert_openai_error(status, body, 503, "server_busy")
        assert b"Retry-After: 1" in top and b"Connection: close" in top
        for s in held:  # the held bodies complete: still there, parsed as a whole
            s.sendall(b"x" * MIB)
            assert read_all(s).startswith(b"HTTP/1.1 400 "), "a held body was lost"
            s.close()
        held.clear()
        # Their bytes were given back: a 7 MiB body fits again.
        with socket.create_connection(("127.0.0.1", gw.port)) as s:
            prompt = "x" * (7 * MIB)
            s.sendall(request({"model": "no-such-model", "prompt": prompt}))
            assert read_all(s).startswith(b"HTTP/1.1 404 ")
    finally:
        for s in held:
            s.close()
        gw.stop()


def test_pipelined_bodies_count_against_the_cap(tmp_path: Path) -> None:
    """Requests queued on a connection behind one being answered hold their bodies too."""
    slow = sim(MODEL, "--step-time", "0.05")  # 40 tokens: about 2 s
    gw = gateway(tmp_path, slow, {"maxBodyBytesTotal": 8 * MIB})
    try:
        first = request({"model": MODEL, "prompt": "hi", "max_tokens": 40, "ignore_eos": True})
        queued = request({"model": "no-such-model", "prompt": "x" * (3 * MIB)})
        with socket.create_connection(("127.0.0.1", gw.port)) as s:
            s.sendall(first + queued + queued + queued)  # 9 MiB behind the first
            s.settimeout(30)
            answers = b""
            while chunk := s.recv(65536):  # to the close after the 503
                answers += chunk
        statuses = [int(part.split(b" ", 1)[0]) for part in answers.split(b"HTTP/1.1 ")[1:]]
        assert statuses == [200, 404, 404, 503], statuses
    finally:
        gw.stop()
        slow.stop()


# --- item 13: a body sent too slowly ---------------------------------------------------------


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_sent_too_slowly_gets_408(tmp_path: Path, engine: Process, framing: str) -> None:
    """Before: a trickled body was cut without an answer when the keep-alive timeout (75 s)
    passed. Now ``clientBodyTimeout`` from the head's end: 408, then close."""
    gw = gateway(tmp_path, engine, {"clientBodyTimeout": 2})
    try:
        with socket.create_connection(("127.0.0.1", gw.port)) as s:
            s.sendall(head(1000 if framing == "content-length" else None))
            start = time.monotonic()
            s.settimeout(0.3)
            answer = b""
            while not answer and time.monotonic() - start < 10:
                try:
                    s.sendall(b"1\r\nx\r\n" if framing == "chunked" else b"x")
                    answer = s.recv(65536)
                except TimeoutError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
            took = time.monotonic() - start
        status, top, body = parse(answer)
        assert_openai_error(status, body, 408, "request_timeout")
        assert b"Connection: close" in top
        assert 1.5 < took < 8, f"408 after {took:.1f} s with a 2 s body timeout"
        # A body that arrives in time is served whatever its pace within the limit.
        with socket.create_connection(("127.0.0.1", gw.port)) as s:
            data = orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1})
            s.sendall(head(len(data)))
            for i in range(0, len(data), len(data) // 4 + 1):
                time.sleep(0.2)  # pacing the client's sends, not a wait on the server
                s.sendall(data[i : i + len(data) // 4 + 1])
            assert read_all(s).startswith(b"HTTP/1.1 200 ")
    finally:
        gw.stop()


# --- item 6: a stream its client does not read -----------------------------------------------

STREAMS = 4
TOKENS = 100_000


def read_stream(s: socket.socket) -> bytes:
    """The body of a chunked response, read to its last chunk."""
    s.settimeout(60)
    data = bytearray()
    while not data.endswith(b"\r\n0\r\n\r\n"):
        chunk = s.recv(1 << 20)
        assert chunk, "the stream ended without its last chunk"
        data += chunk
    top, _, rest = bytes(data).partition(b"\r\n\r\n")
    assert top.startswith(b"HTTP/1.1 200 "), top
    body, pos = [], 0
    while True:
        eol = rest.index(b"\r\n", pos)
        size = int(rest[pos:eol], 16)
        if not size:
            return b"".join(body)
        body.append(rest[eol + 2 : eol + 2 + size])
        pos = eol + 2 + size + 2


def test_a_client_that_does_not_read_holds_the_engine_back(tmp_path: Path, engine: Process) -> None:
    gw = gateway(tmp_path, engine)
    body = {
        "model": MODEL,
        "prompt": "hi",
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    clients = []
    try:
        before = gw.rss_mb()
        for _ in range(STREAMS):
            s = socket.create_connection(("127.0.0.1", gw.port))
            s.sendall(request(body))  # and reads nothing, for now
            clients.append(s)
        # Held back: the gateway stops reading each stream's upstream once a little of it
        # waits for the client, so the engine's writes block (its TCP window fills) instead
        # of the gateway buffering the generation (the sim makes 100,000 tokens in about 2 s).
        always(
            lambda: gw.rss_mb() - before < 16,
            4,
            0.05,
            what=f"the gateway's RSS within 16 MB of {before:.0f} MB",
        )
        for s in clients:
            stream = read_stream(s)
            events = stream.split(b"\n\n")
            assert events[-2:] == [b"data: [DONE]", b""], events[-3:]
            assert orjson.loads(events[-3][6:])["usage"]["completion_tokens"] == TOKENS
            assert sum(1 for e in events if e.startswith(b"data: {")) == TOKENS + 1
    finally:
        for s in clients:
            s.close()
        gw.stop()
