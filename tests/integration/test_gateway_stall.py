"""A frozen replica (SIGSTOP: the process and its sockets stay, nothing moves) under streaming
load: its streams end with an SSE error event within the stall timeout and are counted, the
replica is charged for them, and new requests go to the replica that still answers. Two real
``llmplane.sim`` engines behind an in-process gateway."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import anthropic
import orjson
import pytest

from llmplane.controlplane.plan import MODEL_NAME_LABEL
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import Endpoint, StaticDiscovery
from llmplane.gateway.server import start_gateway
from llmplane.testing.process import sim

MODEL = "m"
STALL = 1.0
STREAMS = 8


@pytest.fixture
def engines():
    servers = [sim(MODEL, "--time-scale", "1", "--max-num-seqs", "64") for _ in range(2)]
    yield servers
    for server in servers:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


async def read_stream(
    session, url, started: asyncio.Queue, streaming: set[str]
) -> tuple[str, list[bytes], float]:
    """(endpoint, SSE data payloads, seconds from the freeze to the stream's end)."""
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 400, "ignore_eos": True, "stream": True}
    async with session.post(
        url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 200
        endpoint = resp.headers["x-llmplane-endpoint"]
        events = []
        frozen_at = None
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
                if len(events) == 1:
                    streaming.add(endpoint)  # a byte reached the client: never retried now
                    frozen_at = await started.get()  # the test says when the freeze happened
                    started.put_nowait(frozen_at)
        return endpoint, events, time.monotonic() - frozen_at


async def test_streams_on_a_frozen_replica_end_with_an_error_and_traffic_moves(engines):
    by_address = {e.address: e for e in engines}
    discovery = StaticDiscovery(
        [Endpoint(e.address, {MODEL_NAME_LABEL: MODEL}, MODEL, fixed_port=True) for e in engines]
    )
    # Without stream migration (gateway/migration.py, tests/integration/test_gateway_migration.py):
    # what a stall does to a stream that cannot move.
    config = GatewayConfig(
        stream_stall_timeout=STALL, default_timeout=5.0, ejection_failures=2, migration_limit=0
    )
    gw = await start_gateway(None, discovery, config=config)
    url = f"http://127.0.0.1:{gw.port}/v1/completions"
    try:
        async with aiohttp.ClientSession() as session:
            frozen: asyncio.Queue[float] = asyncio.Queue()
            streaming: set[str] = set()
            tasks = [
                asyncio.create_task(read_stream(session, url, frozen, streaming))
                for _ in range(STREAMS)
            ]
            deadline = time.monotonic() + 30
            while streaming != set(by_address):
                assert time.monotonic() < deadline, "streams never spread over both replicas"
                await asyncio.sleep(0.05)
            victim = sorted(by_address)[0]
            os.kill(by_address[victim].proc.pid, signal.SIGSTOP)
            frozen.put_nowait(time.monotonic())
            results = await asyncio.wait_for(asyncio.gather(*tasks), 60)

            on_victim = [r for r in results if r[0] == victim]
            healthy = [r for r in results if r[0] != victim]
            assert on_victim and healthy
            for _, events, ended_after in on_victim:
                error = orjson.loads(events[-2])["error"]
                assert error["code"] == "upstream_stalled" and error["type"] == "timeout_error"
                assert events[-1] == b"[DONE]"
                # within the stall timeout plus the watchdog's sweep and some scheduling slack
                assert ended_after < STALL + 2.0, ended_after
            for _, events, _ in healthy:
                assert events[-1] == b"[DONE]" and b'"error"' not in b"".join(events)
                assert len(events) > 100

            metrics = gw.metrics.render().decode()
            assert (
                f'llmplane_gateway_stream_stalls_total{{route="Model/{MODEL}"}} {len(on_victim)}.0'
                in metrics
            )

            # New requests, streamed and not, go to the replica that answers.
            for stream in (False, True, False, True):
                body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "stream": stream}
                async with session.post(
                    url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
                ) as resp:
                    text = await resp.read()
                    assert resp.status == 200, text
                    assert resp.headers["x-llmplane-endpoint"] != victim
    finally:
        await gw.close()


async def test_a_frozen_messages_stream_ends_with_anthropics_error_event() -> None:
    """The Messages API's stream ends with its own ``error`` event, which the official
    ``anthropic`` client raises (chat's ``data: {"error": ...}`` would pass it silently)."""
    engine = sim(MODEL, "--time-scale", "1")
    discovery = StaticDiscovery(
        [Endpoint(engine.address, {MODEL_NAME_LABEL: MODEL}, MODEL, fixed_port=True)]
    )
    config = GatewayConfig(stream_stall_timeout=STALL, default_timeout=5.0)
    gw = await start_gateway(None, discovery, config=config)
    client = anthropic.AsyncAnthropic(
        base_url=f"http://127.0.0.1:{gw.port}", api_key="none", max_retries=0
    )
    try:
        stream = await client.messages.create(
            model=MODEL,
            max_tokens=400,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
        )
        kinds = []
        with pytest.raises(anthropic.APIStatusError) as ended:
            async for event in stream:
                kinds.append(event.type)
                if event.type == "content_block_delta" and kinds.count(event.type) == 1:
                    os.kill(engine.proc.pid, signal.SIGSTOP)
        assert kinds[0] == "message_start" and "message_stop" not in kinds
        assert ended.value.body["type"] == "error", ended.value.body
        assert "sent nothing" in ended.value.body["error"]["message"]
    finally:
        os.kill(engine.proc.pid, signal.SIGCONT)
        await client.close()
        await gw.close()
        engine.stop()
