"""Fuzzing a running ``llmplane gateway`` process with hypothesis: over 10,000 generated requests
as raw HTTP bytes (methods, paths, versions, header names and values, framing, bodies; several
per connection, pipelined) and as JSON bodies (every request field with values of every type),
in front of a real ``llmplane.sim``. Whatever arrives: no 500 from the gateway (a 5xx only when
relayed from the engine, which names itself in x-llmplane-endpoint), no traceback in the
gateway's output, memory bounded, and the gateway still serves a normal request afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from typing import Any

import httptools
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from llmplane.testing.process import sim
from llmplane.testing.wait import wait_for
from tests.integration.gatewayprocess import GatewayProcess

MODEL = "fuzz"
PER_EXAMPLE = 25  # requests per hypothesis example (sent on one or a few connections)
GENERATED = 5  # of them drawn from the strategies below; the rest are mutations of those
CONCURRENCY = 32  # connections at once
CLOSE_WITHIN = 20.0  # seconds: every connection must be closed by the gateway by then
EXAMPLES = 420  # 420 x 25 = 10,500 requests
SETTINGS = {
    "maxBodyBytes": 4096,
    "clientHeaderTimeout": 2,
    "clientKeepaliveTimeout": 2,
    "clientBodyTimeout": 2,  # a body shorter than its Content-Length: 408 after 2-3 s
    "defaultRetryAttempts": 0,
    "streamStallTimeout": 5,
    "defaultTimeout": 10,
}

PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models", "/health",
         "/metrics", "/", "/v1", "/v1/completions/", "//v1/completions", "/v1/%63ompletions",
         "/v1/completions?x=1", "*", "http://evil.example/v1/completions"]  # fmt: skip
# Not HEAD: its answer has no body, which the parser here cannot know for pipelined requests
# (HEAD is tested in test_gateway_http).
METHODS = ["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "CONNECT", "PRI",
           "post", "G ET", "PROPFIND"]  # fmt: skip
VERSIONS = ["HTTP/1.1", "HTTP/1.0", "HTTP/1.1", "HTTP/2.0", "HTTP/0.9", "HTTP/1.10", "HTTX/1.1"]
HEADER_NAMES = ["Host", "Content-Type", "Content-Length", "Transfer-Encoding", "Expect",
                "Connection", "Upgrade", "Accept", "Authorization", "X-Forwarded-For",
                "x-llmplane-endpoint", "Cookie", "Content-Encoding", "Trailer"]  # fmt: skip
HEADER_VALUES = ["127.0.0.1", "localhost", "evil.example", "application/json", "text/plain",
                 "chunked", "gzip, chunked", "100-continue", "close", "keep-alive", "Upgrade",
                 "websocket", "h2c", "0", "-1", "99999999999999999999", "1e3", " 5", "5, 5",
                 "application/json; charset=utf-8"]  # fmt: skip
FIELDS = ["model", "prompt", "messages", "stream", "stream_options", "max_tokens",
          "max_completion_tokens", "n", "best_of", "temperature", "top_p", "stop", "logprobs",
          "echo", "seed", "user", "input", "ignore_eos", "tools", "response_format"]  # fmt: skip

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),  # what orjson writes
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.sampled_from([MODEL, "true", "false", "1", "", "[DONE]", "\x00", "🙂" * 3]),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
request_doc = st.dictionaries(st.sampled_from(FIELDS), json_value, max_size=8).map(
    # mostly routable, so the whole pipeline (limits, scheduler, proxy, sim) sees them
    lambda d: {"model": MODEL, "max_tokens": 2, **d} if len(d) % 3 else d
)


def _body(doc: Any, raw: bytes, which: int) -> bytes:
    if which == 0:
        return orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS) if doc is not None else b""
    if which == 1:
        return raw
    if which == 2:  # over the body limit
        return b'{"model": "fuzz", "prompt": "' + raw * 100 + b"x" * 5000 + b'"}'
    return b"{" * 300 + b"}" * (which % 300)  # deep or truncated JSON


@st.composite
def raw_request(draw: Any) -> bytes:
    """One request as bytes: usually well-framed, sometimes not at all."""
    method = draw(st.sampled_from(METHODS))
    path = draw(st.one_of(st.sampled_from(PATHS), st.text(max_size=30).map(lambda t: "/" + t)))
    version = draw(st.sampled_from(VERSIONS))
    headers = draw(
        st.lists(
            st.tuples(
                st.one_of(st.sampled_from(HEADER_NAMES), st.text(max_size=12)),
                st.one_of(st.sampled_from(HEADER_VALUES), st.text(max_size=30)),
            ),
            max_size=6,
        )
    )
    which = draw(st.integers(0, 6))
    body = _body(draw(request_doc) if which == 0 else None, draw(st.binary(max_size=64)), which)
    framing = draw(st.sampled_from(["length", "length", "chunked", "none", "wrong-length"]))
    lines = [f"{method} {path} {version}"]
    lines += ["Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers]
    if framing == "length":
        lines.append(f"Content-Length: {len(body)}")
    elif framing == "wrong-length":
        lines.append(f"Content-Length: {len(body) + draw(st.integers(-5, 5))}")
    elif framing == "chunked":
        lines.append("Transfer-Encoding: chunked")
        size = draw(st.integers(1, 16))
        body = (
            b"".join(
                b"%x\r\n%b\r\n" % (len(body[i : i + size]), body[i : i + size])
                for i in range(0, len(body), size)
            )
            + b"0\r\n\r\n"
        )
    head = "\r\n".join(lines).encode("utf-8", "surrogatepass") + b"\r\n\r\n"
    if draw(st.integers(0, 30)) == 0:  # bytes anywhere: a broken request line or header
        at = draw(st.integers(0, len(head)))
        head = head[:at] + draw(st.binary(min_size=1, max_size=8)) + head[at:]
    return head + body


@st.composite
def json_request(draw: Any) -> bytes:
    """A well-framed POST whose JSON body is generated field by field."""
    path = draw(st.sampled_from(PATHS[:3]))
    doc = draw(request_doc)
    if draw(st.integers(0, 9)) == 0:  # over the body limit
        doc = {**doc, "prompt": "x" * 5000}
    body = orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS)
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


_SPLICES = [b"\r\n", b"\r\n\r\n", b"\n", b":", b" ", b"\x00", b"\xff", b"0\r\n\r\n",
            b"Content-Length: 7\r\n", b"Transfer-Encoding: chunked\r\n", b'"stream":"true",',
            b"%", b"?", b"\t", b"{", b"}", b'"', b"-1"]  # fmt: skip


def mutate(data: bytes, rnd: random.Random) -> bytes:
    """A cheap variation of a generated request (hypothesis draws the seed): what a
    coverage-blind mutation fuzzer does, so that 10,000 requests cost seconds to generate."""
    for _ in range(rnd.randint(1, 3)):
        at = rnd.randrange(len(data) + 1)
        op = rnd.randrange(6)
        if op == 0 and data:  # flip a byte
            at = min(at, len(data) - 1)
            data = data[:at] + bytes([data[at] ^ (1 << rnd.randrange(8))]) + data[at + 1 :]
        elif op == 1:  # cut a slice out
            data = data[:at] + data[at + rnd.randint(1, 16) :]
        elif op == 2:  # repeat a slice
            piece = data[at : at + rnd.randint(1, 32)]
            data = data[:at] + piece * rnd.randint(2, 50) + data[at:]
        elif op == 3:  # splice in something with meaning to a parser
            data = data[:at] + rnd.choice(_SPLICES) + data[at:]
        elif op == 4:  # truncate
            data = data[:at]
        else:  # random bytes
            data = data[:at] + rnd.randbytes(rnd.randint(1, 8)) + data[at:]
    return data


class Responses:
    """Parses what came back on a connection: status and headers of every response."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.items: list[tuple[int, dict[str, str]]] = []
        self._headers: dict[str, str] = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.items.append((self.parser.get_status_code(), self._headers))
        self._headers = {}

    def feed(self, data: bytes) -> None:
        self.parser.feed_data(data)


SENTINEL = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


async def exchange(port: int, payload: bytes, limit: asyncio.Semaphore) -> tuple[bytes, bytes]:
    """Send ``payload`` and a last ``Connection: close`` request on one connection and read
    until the gateway closes it: (payload, what came back). A request whose body is longer
    than what was sent keeps the connection until the gateway's idle timeout."""
    async with limit:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(payload + SENTINEL)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            try:
                received = await asyncio.wait_for(reader.read(), CLOSE_WITHIN)
            except ConnectionError:
                received = b""
            except TimeoutError:
                pytest.fail(f"the gateway held a connection over {CLOSE_WITHIN} s: {payload!r}")
        finally:
            writer.close()
    return payload, received


def parse(payload: bytes, received: bytes) -> list[tuple[int, dict[str, str]]]:
    responses = Responses()
    try:
        responses.feed(received)
    except httptools.HttpParserError as err:
        pytest.fail(
            f"the gateway answered {payload!r} with something not HTTP ({err}): {received!r}"
        )
    return responses.items


async def send_all(port: int, payloads: list[bytes]) -> list[tuple[bytes, bytes]]:
    limit = asyncio.Semaphore(CONCURRENCY)
    return await asyncio.gather(*(exchange(port, p, limit) for p in payloads))


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory):
    engine = sim(MODEL, "--time-scale", "0")
    gw = GatewayProcess(tmp_path_factory.mktemp("fuzz"), SETTINGS)
    try:
        gw.register("sim", engine.address, MODEL)
        wait_for(lambda: normal_request(gw.port) == 200, 30, 0.05, what="the sim to be routable")
        yield gw
    finally:
        gw.stop()
        engine.stop()


def normal_request(port: int) -> int:
    body = orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2})
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        head = s.recv(65536)
    return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0


STATUSES: dict[int, int] = {}
SENT = [0]


def check(items: list[tuple[int, dict[str, str]]]) -> None:
    for status, headers in items:
        STATUSES[status] = STATUSES.get(status, 0) + 1
        assert status != 500, f"the gateway failed on a request: {headers}"
        if status >= 500:  # 502/503/504 only about the engine, never about the request
            assert "x-llmplane-endpoint" in headers or status == 503, (status, headers)


def test_ten_thousand_generated_requests_break_nothing(fuzzed: GatewayProcess) -> None:
    rss_before = fuzzed.rss_mb()
    payloads: list[bytes] = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,  # the same requests in every run (CI reproducible)
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        st.lists(st.one_of(raw_request(), json_request()), min_size=GENERATED, max_size=GENERATED),
        st.randoms(use_true_random=False),
        st.integers(1, 5),
    )
    def generate(generated: list[bytes], rnd: random.Random, per_connection: int) -> None:
        requests = generated + [
            mutate(rnd.choice(generated), rnd) for _ in range(PER_EXAMPLE - GENERATED)
        ]
        rnd.shuffle(requests)
        for i in range(0, len(requests), per_connection):
            payloads.append(b"".join(requests[i : i + per_connection]))
        SENT[0] += len(requests)

    generate()  # hypothesis draws the requests; they are sent concurrently below
    assert SENT[0] >= 10_000
    for payload, received in asyncio.run(send_all(fuzzed.port, payloads)):
        check(parse(payload, received))
    output = fuzzed.log()
    assert "Traceback" not in output, output[-5000:]
    assert fuzzed.rss_mb() - rss_before < 64, f"RSS grew from {rss_before:.0f} MB"
    assert normal_request(fuzzed.port) == 200  # still serving
    answered = sum(STATUSES.values())
    assert answered > 5_000, STATUSES  # most requests were answered, not just dropped
    assert {200, 400, 404, 405, 413}.issubset(STATUSES), sorted(STATUSES.items())  # reached
