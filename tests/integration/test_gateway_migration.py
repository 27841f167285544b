"""Streams that survive their replica: three real ``llmplane.sim`` engines behind an in-process
gateway, streams of a few hundred tokens, one replica SIGKILLed (or SIGSTOPped) mid-stream.
Every stream completes without an error, its text equals an uninterrupted run's (temperature
0, a seed), its usage has exactly max_tokens completion tokens and the gateway's usage
accounting (what rate limits and tenant usage read) counts each generation once."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable

import aiohttp
import orjson
import pytest

from llmplane.console.api import Console
from llmplane.controlplane.plan import MODEL_NAME_LABEL
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import Endpoint, StaticDiscovery
from llmplane.gateway.server import start_gateway
from llmplane.store.sqlite import SQLiteStore
from llmplane.testing import eventually
from llmplane.testing.process import sim

MODEL = "m"
TOKENS = 300
STREAMS = 9


@pytest.fixture
def engines():
    servers = [sim(MODEL, "--time-scale", "1", "--max-num-seqs", "64") for _ in range(3)]
    yield servers
    for server in servers:
        if server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


def request(i: int) -> tuple[str, dict]:
    """Stream ``i``: completions and chat in turn, each with its own prompt."""
    common = {"model": MODEL, "max_tokens": TOKENS, "ignore_eos": True, "temperature": 0,
              "seed": 11, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    if i % 2:
        return "/v1/chat/completions", {
            **common,
            "messages": [{"role": "user", "content": f"story number {i}"}],
        }
    return "/v1/completions", {**common, "prompt": f"once upon a time, number {i}"}


def text_of(events: list[dict], chat: bool) -> str:
    out = []
    for e in events:
        for c in e.get("choices") or ():
            out.append((c["delta"].get("content") if chat else c["text"]) or "")
    return "".join(out)


async def read(session, url: str, body: dict, streaming: set[str]) -> tuple[str, list[bytes]]:
    async with session.post(url, data=orjson.dumps(body)) as resp:
        assert resp.status == 200, await resp.text()
        endpoint = resp.headers.get("x-llmplane-endpoint", "")
        events: list[bytes] = []
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
                if len(events) == 20:
                    streaming.add(endpoint)
        return endpoint, events


async def uninterrupted(address: str) -> list[tuple[str, int]]:
    """(text, prompt tokens) of every request, streamed straight from one sim."""

    async def one(session, i: int) -> tuple[str, int]:
        path, body = request(i)
        _, raw = await read(session, f"http://{address}{path}", body, set())
        events = [orjson.loads(e) for e in raw[:-1]]
        return text_of(events, "chat" in path), events[-1]["usage"]["prompt_tokens"]

    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(one(session, i) for i in range(STREAMS))))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
async def test_streams_continue_on_another_replica(engines, sig, caplog):
    caplog.set_level(logging.INFO, logger="llmplane.gateway.access")
    discovery = StaticDiscovery(
        [
            Endpoint(e.address, {MODEL_NAME_LABEL: MODEL}, MODEL, fixed_port=True, engine="sim")
            for e in engines
        ]
    )
    config = GatewayConfig(stream_stall_timeout=1.0, default_timeout=10.0)
    gw = await start_gateway(None, discovery, config=config)
    by_address = {e.address: e for e in engines}
    expected = await uninterrupted(engines[0].address)
    try:
        async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as s:
            streaming: set[str] = set()
            tasks = []
            for i in range(STREAMS):
                path, body = request(i)
                url = f"http://127.0.0.1:{gw.port}{path}"
                tasks.append(asyncio.create_task(read(s, url, body, streaming)))
            deadline = time.monotonic() + 30
            while streaming != set(by_address):
                assert time.monotonic() < deadline, f"streams never spread: {streaming}"
                assert not any(t.done() for t in tasks), "a stream ended before the kill"
                await asyncio.sleep(0.02)
            victim = sorted(by_address)[0]
            os.kill(by_address[victim].proc.pid, sig)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 90)

            moved = 0
            for i, (endpoint, raw) in enumerate(results):
                chat = i % 2 == 1
                assert raw[-1] == b"[DONE]", raw[-3:]
                assert not any(b'"error"' in e for e in raw), [e for e in raw if b"error" in e]
                events = [orjson.loads(e) for e in raw[:-1]]
                assert len({(e["id"], e["created"], e["model"]) for e in events}) == 1
                finals = [c for e in events for c in e["choices"] if c["finish_reason"]]
                assert [c["finish_reason"] for c in finals] == ["length"]
                if chat:  # one role chunk, first
                    roles = [
                        e for e in events if e["choices"] and "role" in e["choices"][0]["delta"]
                    ]
                    assert roles == [events[0]]
                # the gateway asked for token ids; the client, who did not, gets none
                assert all(c.get("token_ids") is None for e in events for c in e["choices"])
                text, prompt_tokens = expected[i]
                assert text_of(events, chat) == text, f"stream {i} differs"
                usage = events[-1]["usage"]
                assert usage == {**usage, "prompt_tokens": prompt_tokens,
                                 "completion_tokens": TOKENS,
                                 "total_tokens": prompt_tokens + TOKENS}  # fmt: skip
                moved += endpoint == victim
            assert moved, "no stream was on the victim"

            metrics = gw.metrics.render().decode()
            reason = "broken" if sig == signal.SIGKILL else "stalled"
            route = f"Model/{MODEL}"
            line = f'llmplane_gateway_stream_migrations_total{{reason="{reason}",route="{route}"}}'
            assert f"{line} {moved}.0" in metrics, [
                m for m in metrics.splitlines() if "migration" in m
            ]
            assert (
                f'llmplane_gateway_output_tokens_total{{model="{MODEL}"}} {STREAMS * TOKENS}.0'
                in metrics
            )
            assert "llmplane_gateway_stream_resume_seconds_count" in metrics
            # the access log's field: one continuation per moved stream, away from the victim
            logged = [orjson.loads(r.getMessage()) for r in caplog.records
                      if r.name == "llmplane.gateway.access"]  # fmt: skip
            moves = [m for line in logged for m in line.get("migrations") or ()]
            assert len(moves) == moved and {m["from"] for m in moves} == {victim}
            assert all(m["reason"] == reason and m["to"] != victim for m in moves)
            assert all(m["resume_ms"] >= 0 for m in moves)
    finally:
        await gw.close()


async def test_engine_error_events_and_cut_streams_continue_elsewhere(engines, tmp_path):
    """One sim ends its streams with vLLM's engine-failure event after 30 events, another cuts
    them after 60; every stream still completes with the uninterrupted text, and a replica
    that lost a stream is never picked for it again. The console's fleet page has them."""
    discovery = StaticDiscovery(
        [
            Endpoint(e.address, {MODEL_NAME_LABEL: MODEL}, MODEL, fixed_port=True, engine="sim")
            for e in engines
        ]
    )
    expected = await uninterrupted(engines[2].address)
    store = SQLiteStore(tmp_path / "db.sqlite")  # (the console's fleet reads one; empty)
    gw = await start_gateway(
        store, discovery, config=GatewayConfig(default_timeout=10.0), extensions=[Console]
    )
    try:
        async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as s:
            for engine, fault in zip(engines, ({"error_event_after": 30},
                                               {"disconnect_after": 60}), strict=False):  # fmt: skip
                async with s.post(f"http://{engine.address}/admin/faults", json=fault) as r:
                    assert r.status == 200, await r.text()
            tasks = []
            for i in range(STREAMS):
                path, body = request(i)
                tasks.append(read(s, f"http://127.0.0.1:{gw.port}{path}", body, set()))
            results = await asyncio.wait_for(asyncio.gather(*tasks), 90)
            for i, (_, raw) in enumerate(results):
                assert raw[-1] == b"[DONE]" and not any(b'"error"' in e for e in raw), raw[-3:]
                events = [orjson.loads(e) for e in raw[:-1]]
                assert text_of(events, i % 2 == 1) == expected[i][0], f"stream {i} differs"
                assert events[-1]["usage"]["completion_tokens"] == TOKENS
        metrics = gw.metrics.render().decode()
        for reason in ("engine_error", "broken"):
            assert f'reason="{reason}",route="Model/{MODEL}"' in metrics, reason
        # no stream failed to move (no sample of the failure counter)
        assert "llmplane_gateway_stream_migration_failures_total{" not in metrics
        counted = {
            reason: float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("llmplane_gateway_stream_migrations_total{")
            for reason in ("engine_error", "broken")
            if f'reason="{reason}"' in line
        }
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{gw.port}/console/api/fleet") as resp,
        ):
            assert resp.status == 200
            (shown,) = (await resp.json())["migrations"]
        assert shown["route"] == f"Model/{MODEL}" and shown["failed"] == 0
        assert shown["byReason"] == {k: int(v) for k, v in counted.items()}, (shown, counted)
        p50, p99 = shown["resumeMs"]
        assert 0 < p50 <= p99 < 10_000, shown
    finally:
        await gw.close()
        store.close()


def with_head_of(stream: bytes, other: bytes) -> bytes:
    """``stream`` with the ``id`` and ``created`` of ``other`` (both SSE bodies)."""
    heads = [orjson.loads(r.split(b"\n\n", 1)[0][6:]) for r in (stream, other)]
    for key in ("id", "created"):
        stream = stream.replace(
            b'"%s":%s' % (key.encode(), orjson.dumps(heads[0][key])),
            b'"%s":%s' % (key.encode(), orjson.dumps(heads[1][key])),
        )
    return stream


def gateway_over(*servers, **config) -> Awaitable:
    discovery = StaticDiscovery(
        [
            Endpoint(e.address, {MODEL_NAME_LABEL: MODEL}, MODEL, fixed_port=True, engine="sim")
            for e in servers
        ]
    )
    return start_gateway(None, discovery, config=GatewayConfig(**config))


async def test_a_stream_never_lost_is_the_engines_own_stream(engines):
    """Without a failure the client's stream through the gateway is the engine's own unasked
    stream, byte for byte (but its id and created): no token ids the gateway asked for, no
    chunk more or less, the same usage; with ids asked for by the client too."""
    gw = await gateway_over(engines[0])
    try:
        async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as s:
            for i, ids in ((0, False), (1, False), (2, True), (3, True)):
                path, body = request(i)
                body = {**body, "max_tokens": 40, "return_token_ids": ids}
                if i == 1:
                    del body["stream_options"]
                if not ids:
                    del body["return_token_ids"]
                raw = []
                for base in (f"http://127.0.0.1:{gw.port}", f"http://{engines[0].address}"):
                    async with s.post(base + path, data=orjson.dumps(body)) as resp:
                        assert resp.status == 200, await resp.text()
                        raw.append(await resp.read())
                through, direct = with_head_of(*raw), raw[1]
                assert through == direct, (i, through[:600], direct[:600])
                assert (b'"token_ids":[' in through) == ids
    finally:
        await gw.close()


async def running(session: aiohttp.ClientSession, address: str) -> float:
    async with session.get(f"http://{address}/metrics") as resp:
        text = await resp.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running")
    )


async def test_unary_requests_are_sent_again_within_one_timeout(engines):
    """A unary request whose replica is killed while it generates is sent again, whole, to the
    other replica; with every replica frozen the route's one timeout ends all the attempts
    (not a timeout each); with its only replica gone the client gets 503 and Retry-After."""
    body = {"model": MODEL, "prompt": "a long one", "max_tokens": TOKENS, "ignore_eos": True,
            "temperature": 0, "seed": 5}  # fmt: skip
    limit = aiohttp.ClientTimeout(total=60)  # (a gateway that never answers fails the test)
    async with aiohttp.ClientSession(
        headers={"Content-Type": "application/json"}, timeout=limit
    ) as s:
        async with s.post(f"http://{engines[2].address}/v1/completions", json=body) as resp:
            expected = (await resp.json())["choices"][0]["text"]
        gw = await gateway_over(engines[0], engines[1], default_timeout=30.0)
        try:
            url = f"http://127.0.0.1:{gw.port}/v1/completions"
            task = asyncio.create_task(post(s, url, body))
            by_address = {e.address: e for e in engines[:2]}
            busy = await eventually(
                lambda: next_busy(s, by_address), 20, what="the request runs on a replica"
            )
            os.kill(by_address[busy].proc.pid, signal.SIGKILL)
            status, headers, answer = await asyncio.wait_for(task, 30)
            assert status == 200, answer
            assert headers["x-llmplane-endpoint"] != busy
            assert answer["choices"][0]["text"] == expected
            assert answer["usage"]["completion_tokens"] == TOKENS
        finally:
            await gw.close()

        # the survivor frozen, with the third: 3 attempts, one timeout of 2 s in all
        survivor = next(e for e in engines[:2] if e.proc.poll() is None)
        frozen = [survivor, engines[2]]
        # (without flow control: replicas whose metrics went stale would hold it in a queue)
        gw = await gateway_over(*frozen, default_timeout=2.0, flow_control=False)
        for e in frozen:
            os.kill(e.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            status, _, doc = await post(s, f"http://127.0.0.1:{gw.port}/v1/completions", body)
            elapsed = time.monotonic() - t0
            assert status == 504, doc
            assert 1.9 <= elapsed < 3.5, f"{elapsed:.2f} s: not the route's one timeout of 2 s"
        finally:
            for e in frozen:
                os.kill(e.proc.pid, signal.SIGCONT)
            await gw.close()

        # its only replica killed mid-request: nowhere to send it again
        gw = await gateway_over(engines[2], default_timeout=30.0)
        try:
            task = asyncio.create_task(post(s, f"http://127.0.0.1:{gw.port}/v1/completions", body))
            await eventually(
                lambda: next_busy(s, {engines[2].address: engines[2]}), 20, what="it runs"
            )
            os.kill(engines[2].proc.pid, signal.SIGKILL)
            status, headers, doc = await asyncio.wait_for(task, 30)
            assert status == 503 and headers["Retry-After"] == "5", (status, headers, doc)
            assert doc["error"]["code"] == "replica_lost", doc
        finally:
            await gw.close()


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict, dict]:
    async with session.post(url, data=orjson.dumps(body)) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def next_busy(session: aiohttp.ClientSession, by_address: dict) -> str | None:
    for address in by_address:
        if await running(session, address) > 0:
            return address
    return None


async def test_a_stream_with_no_replica_left_ends_with_a_retry_hint(engines):
    """Its only replica killed mid-stream: an error event that says so and when to retry
    (the activator's Retry-After), then [DONE]."""
    gw = await gateway_over(engines[0], activator_retry_after=7.0)
    try:
        async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as s:
            path, body = request(0)
            async with s.post(f"http://127.0.0.1:{gw.port}{path}", json=body) as resp:
                assert resp.status == 200
                events = []
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        events.append(line[6:].strip())
                        if len(events) == 20:
                            os.kill(engines[0].proc.pid, signal.SIGKILL)
        assert events[-1] == b"[DONE]"
        error = orjson.loads(events[-2])["error"]
        assert error["code"] == "stream_lost" and error["retry_after"] == 7, error
        assert "no other replica" in error["message"] and "retry in 7 s" in error["message"]
        assert not any(b'"error"' in e for e in events[:-2])
    finally:
        await gw.close()
