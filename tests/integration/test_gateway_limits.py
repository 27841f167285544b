"""Every buffer the gateway holds for a client is bounded as the bytes arrive, and slow or
numerous clients cannot hold it: raw sockets against a ``llmplane gateway`` process, whose
memory is read from /proc. Today's numbers before these limits are in issue 12."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from llmplane.testing.process import sim
from llmplane.testing.wait import wait_for
from tests.integration.gatewayprocess import GatewayProcess, read_all

MODEL = "m"
HEADER_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    engine = sim(MODEL, "--time-scale", "0.01")
    gw = GatewayProcess(tmp_path_factory.mktemp("gw"), {"clientHeaderTimeout": HEADER_TIMEOUT})
    try:
        gw.register("sim", engine.address, MODEL)
        wait_for(lambda: completion(gw.port)[0] == 200, 30, 0.05, what="the sim to be routable")
        yield gw
    finally:
        gw.stop()
        engine.stop()


def completion(port: int) -> tuple[int, bytes]:
    body = orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        data = read_all(s)
    return int(data.split(b" ", 2)[1]) if data else 0, data


def send_until_refused(s: socket.socket, chunks: Iterator[bytes]) -> int:
    """Send until the server stops reading (it answered and closed); the bytes sent."""
    sent = 0
    s.settimeout(10)
    try:
        for chunk in chunks:
            s.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass
    return sent


def test_a_header_line_that_never_ends_is_refused_as_it_arrives(gateway: GatewayProcess) -> None:
    before = gateway.rss_mb()
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: ")
        line = b"a" * 65536
        sent = send_until_refused(s, iter([line] * 512))  # up to 32 MiB, never a line end
        response = read_all(s)
    assert response.startswith(b"HTTP/1.1 431 "), response[:200]
    assert response.count(b"HTTP/1.1 ") == 1
    assert b"over 65536 bytes" in response
    assert sent < 32 * 1024 * 1024, "the gateway kept reading an endless header line"
    assert gateway.rss_mb() - before < 16
    assert completion(gateway.port)[0] == 200  # and everyone else is served


def test_many_tiny_body_chunks_cost_the_body_not_an_object_per_chunk(
    gateway: GatewayProcess,
) -> None:
    """8 MB of JSON as 2-byte chunks: before, each chunk was its own object (~200 MB)."""
    head, tail = b'{"model": "no-such-model", "prompt": "', b'"}'

    def in_pairs(data: bytes) -> bytes:
        return b"".join(
            b"%x\r\n%b\r\n" % (len(p), p) for p in (data[i : i + 2] for i in range(0, len(data), 2))
        )

    # the prompt's 8 MiB of "x" as 2-byte chunks, built by repetition (cheap for the test)
    chunked = in_pairs(head) + b"2\r\nxx\r\n" * (4 * 1024 * 1024) + in_pairs(tail)
    peak_before = gateway.rss_mb("VmHWM")
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        s.sendall(chunked + b"0\r\n\r\n")
        response = read_all(s, 60)
    assert response.startswith(b"HTTP/1.1 404 "), response[:300]  # parsed whole, then routed
    assert b"no-such-model" in response
    growth = gateway.rss_mb("VmHWM") - peak_before
    # the body (8 MB) a few times over while it is joined and parsed; not 25 times
    assert growth < 64, f"the gateway's peak RSS grew by {growth:.0f} MB for an 8 MB body"


def test_a_slow_head_is_timed_out_and_a_silent_connection_closed(
    gateway: GatewayProcess,
) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port)) as slow:
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
        response = read_all(slow, 10 + HEADER_TIMEOUT)
    assert response.startswith(b"HTTP/1.1 408 "), response[:200]
    with socket.create_connection(("127.0.0.1", gateway.port)) as silent:
        assert read_all(silent, 10 + HEADER_TIMEOUT).startswith(b"HTTP/1.1 408 ")
    # A keep-alive connection between requests is not a slow head: it stays open.
    with socket.create_connection(("127.0.0.1", gateway.port)) as idle:
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_all(idle).startswith(b"HTTP/1.1 200 ")
        idle.settimeout(HEADER_TIMEOUT * 3)
        with pytest.raises(TimeoutError):
            idle.recv(1)  # nothing: neither 408 nor a close


def test_connect_and_upgrades_get_one_answer_and_a_close(gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        response = read_all(s)
    assert response.startswith(b"HTTP/1.1 405 "), response
    assert response.count(b"HTTP/1.1 ") == 1, response  # no unsolicited second response
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\n\r\n"
        )
        response = read_all(s)
    assert response.startswith(b"HTTP/1.1 200 ") and response.count(b"HTTP/1.1 ") == 1, response


def test_a_get_on_a_post_route_is_405_with_allow(gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(b"GET /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        response = read_all(s)
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405 "), response
    assert b"\r\nAllow: POST" in head
    assert orjson.loads(body)["error"]["type"] == "invalid_request_error"


def _closed_by_server(conn: socket.socket) -> bool:
    conn.setblocking(False)
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        conn.setblocking(True)


def test_the_connection_cap_makes_room_from_idle_connections_else_refuses(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path, {"maxClientConnections": 4})
    held: list[socket.socket] = []
    health = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    try:
        # Four idle keep-alive connections: a fifth client is served, one idle one is closed.
        for _ in range(4):
            conn = socket.create_connection(("127.0.0.1", gw.port))
            conn.sendall(health)
            assert read_all(conn).startswith(b"HTTP/1.1 200 ")
            held.append(conn)
        with socket.create_connection(("127.0.0.1", gw.port)) as extra:
            extra.sendall(health)
            assert read_all(extra).startswith(b"HTTP/1.1 200 ")
            closed = wait_for(
                lambda: [c for c in held if _closed_by_server(c)] or None,
                10,
                what="an idle connection closed to make room",
            )
            assert len(closed) == 1, f"{len(closed)} idle connections closed for one new one"
        for conn in held:
            conn.close()
        held.clear()

        # Four connections in the middle of a request (a head still arriving): none is idle,
        # so a fifth gets 503 + Retry-After and is closed.
        for _ in range(4):
            conn = socket.create_connection(("127.0.0.1", gw.port))
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            held.append(conn)

        def refused() -> bytes | None:
            with socket.create_connection(("127.0.0.1", gw.port)) as extra:
                answer = read_all(extra)
            return answer if answer.startswith(b"HTTP/1.1 503 ") else None

        answer = wait_for(refused, 10, 0.05, what="a fifth connection refused")
        assert b"Retry-After: 1" in answer and b"server_busy" in answer, answer
        assert not any(_closed_by_server(c) for c in held), "a busy connection was closed"
        held.pop().close()

        def served() -> bool:
            with socket.create_connection(("127.0.0.1", gw.port)) as again:
                again.sendall(health)
                return read_all(again).startswith(b"HTTP/1.1 200 ")

        wait_for(served, 10, 0.05, what="a connection to be accepted once one closed")
    finally:
        for conn in held:
            conn.close()
        gw.stop()
