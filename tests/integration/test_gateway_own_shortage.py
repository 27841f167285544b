"""A gateway out of descriptors blames nobody but itself: a real ``llmplane gateway`` started
under ``prlimit`` with a small open-files limit and ``maxClientConnections`` above what that
limit can hold, two real sims, and a burst of concurrent streaming requests, so that the
gateway's upstream connects fail with EMFILE. No replica is ejected (no "ejecting" line, the
ejections counter stays at zero), the requests that could not be served get 503 with
``Retry-After`` in the API's error shape (not 502), the shortage is logged once, and once the
burst is over a request is served at once. (Some connections are closed unanswered as they
are accepted: that is libuv's answer to EMFILE on accept, not an engine's failure.)"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from llmplane.testing.process import Process, sim
from llmplane.testing.wait import wait_for
from tests.integration.gatewayprocess import GatewayProcess

MODEL = "m"
NOFILE = 96  # the gateway's soft and hard limit: a few dozen beyond what it holds idle
BURST = 160  # concurrent streams: more than the descriptors left for clients and engines
BODY = orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 40, "stream": True})
REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY)
)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[GatewayProcess, list[Process]]]:
    engines: list[Process] = []
    gw: GatewayProcess | None = None
    try:
        engines = [sim(MODEL, "--time-scale", "0.2") for _ in range(2)]
        gw = GatewayProcess(tmp_path, {"maxClientConnections": 10000}, nofile=NOFILE)
        for i, engine in enumerate(engines):
            gw.register(f"sim{i}", engine.address, MODEL)
        wait_for(lambda: status_of(stream(gw.port)) == 200, 30, 0.1, what="the sims routable")
        yield gw, engines
    finally:
        if gw is not None:
            gw.stop()
        for engine in engines:
            engine.stop()


async def fetch(port: int, request: bytes = REQUEST, timeout: float = 60) -> bytes:
    """One request on its own connection; everything the gateway sent until it closed (b"" for
    a connection closed unanswered, whether with FIN or, the request unread, with RST)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.read(), timeout)
    except (ConnectionResetError, BrokenPipeError):
        return b""
    finally:
        writer.close()


def stream(port: int) -> bytes:
    return asyncio.run(fetch(port))


def status_of(answer: bytes) -> int:
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def test_running_out_of_descriptors_ejects_no_replica(
    fleet: tuple[GatewayProcess, list[Process]],
) -> None:
    gw, _ = fleet

    async def burst() -> list[bytes | BaseException]:
        return await asyncio.gather(*(fetch(gw.port) for _ in range(BURST)), return_exceptions=True)

    answers = asyncio.run(burst())
    statuses = Counter(status_of(a) if isinstance(a, bytes) else repr(a) for a in answers)
    refused = [a for a in answers if isinstance(a, bytes) and status_of(a) == 503]
    assert refused, f"no upstream connect ran out of descriptors: {statuses}"
    assert statuses[200] > 0, statuses
    # Never a 502 blaming an engine. (0: a connection closed unanswered: out of descriptors,
    # uvloop's accept takes and closes waiting connections rather than spin on EMFILE; the
    # client sees a reset when its request was still unread.)
    assert set(statuses) <= {200, 503, 0}, statuses
    for answer in refused:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"\r\nRetry-After: 1\r\n" in head, head
        error = orjson.loads(body)["error"]
        assert error["type"] == "service_unavailable", error
        assert error["code"] == "out_of_resources", error
        assert "out of resources" in error["message"], error
        assert "Too many open files" in error["message"], error
    for answer in answers:
        if isinstance(answer, bytes) and status_of(answer) == 200:
            assert b"data: [DONE]" in answer[-300:], answer[-300:]

    # The burst is over: served at once, and nothing was blamed on the engines.
    first = stream(gw.port)
    assert status_of(first) == 200, first[:500]
    log = gw.log()
    assert "ejecting" not in log, log[-3000:]
    assert log.count("ran out of its own resources") == 1, log[-3000:]
    metrics = asyncio.run(
        fetch(gw.port, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    ).decode()
    ejected = [
        line
        for line in metrics.splitlines()
        if line.startswith("llmplane_gateway_ejections_total{") and not line.endswith(" 0.0")
    ]
    assert not ejected, ejected
