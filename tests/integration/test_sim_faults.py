"""Fault injection and shutdown of real sim processes."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest

from llmplane.sim.process import SimProcess


@pytest.fixture
def sim():
    with SimProcess("--time-scale", "0.01", model="m") as p:
        yield p


async def set_faults(s: aiohttp.ClientSession, url: str, **faults) -> dict:
    async with s.post(f"{url}/admin/faults", json=faults) as r:
        assert r.status == 200, await r.text()
        return await r.json()


BODY = {"model": "m", "prompt": "hello", "max_tokens": 4, "ignore_eos": True}


async def test_error_rate_and_admin_endpoint(sim):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{sim.url}/admin/faults") as r:
            assert (await r.json())["error_rate"] == 0.0
        view = await set_faults(s, sim.url, error_rate=1.0, error_codes=[503])
        assert view["error_rate"] == 1.0 and view["error_codes"] == [503]
        async with s.post(f"{sim.url}/v1/completions", json=BODY) as r:
            assert r.status == 503
            err = await r.json()
            assert set(err) == {"error"} and err["error"]["type"] == "ServiceUnavailableError"
            assert err["error"]["code"] == 503
        async with s.post(f"{sim.url}/admin/faults", json={"error_rate": 2}) as r:
            assert r.status == 400 and "error_rate" in (await r.json())["error"]["message"]
        async with s.post(f"{sim.url}/admin/faults", json={"bogus": 1}) as r:
            assert r.status == 400
        await set_faults(s, sim.url, error_rate=0.0)
        async with s.post(f"{sim.url}/v1/completions", json=BODY) as r:
            assert r.status == 200


async def test_hang_accepts_and_never_answers(sim):
    async with aiohttp.ClientSession() as s:
        await set_faults(s, sim.url, hang_rate=1.0)
        with pytest.raises(asyncio.TimeoutError):
            async with s.post(
                f"{sim.url}/v1/completions", json=BODY, timeout=aiohttp.ClientTimeout(total=0.5)
            ) as r:
                await r.read()
        await set_faults(s, sim.url, hang_rate=0.0)
        async with s.post(f"{sim.url}/v1/completions", json=BODY) as r:
            assert r.status == 200


async def test_mid_stream_disconnect_after_k_chunks(sim):
    async with aiohttp.ClientSession() as s:
        await set_faults(s, sim.url, disconnect_after=3)
        body = {**BODY, "max_tokens": 20, "stream": True}
        received = []
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(f"{sim.url}/v1/completions", json=body) as r:
                assert r.status == 200
                async for line in r.content:
                    if line.startswith(b"data: "):
                        received.append(line)
        assert len(received) == 3
        await set_faults(s, sim.url, disconnect_after=None)
        async with s.post(f"{sim.url}/v1/completions", json=body) as r:
            assert (await r.read()).endswith(b"data: [DONE]\n\n")
        # the aborted request is counted like vLLM counts aborts
        async with s.get(f"{sim.url}/metrics") as r:
            assert 'finished_reason="abort",model_name="m"} 1.0' in await r.text()


async def test_slow_start_health():
    with SimProcess("--fault-slow-start", "0.6", model="m") as sim:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{sim.url}/health") as r:
                assert r.status == 503
            async with s.post(f"{sim.url}/v1/completions", json=BODY) as r:
                assert r.status == 503
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                async with s.get(f"{sim.url}/health") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("never became healthy")


async def test_crash_after_n_requests():
    sim = SimProcess("--time-scale", "0", "--fault-crash-after", "2", model="m")
    with sim:
        async with aiohttp.ClientSession() as s:
            for _ in range(2):
                async with s.post(f"{sim.url}/v1/completions", json=BODY) as r:
                    assert r.status == 200
            with pytest.raises(aiohttp.ClientError):
                async with s.post(f"{sim.url}/v1/completions", json=BODY) as r:
                    await r.read()
        assert sim.proc is not None
        assert sim.proc.wait(5) == 1
    assert sim.returncode == 1


async def test_sigterm_finishes_in_flight_requests_and_exits_zero():
    sim = SimProcess("--time-scale", "1", model="m")
    with sim:
        async with aiohttp.ClientSession() as s:
            body = {**BODY, "max_tokens": 40}  # ~0.3 s of decode
            task = asyncio.create_task(s.post(f"{sim.url}/v1/completions", json=body))
            await asyncio.sleep(0.1)
            sim.proc.send_signal(signal.SIGTERM)
            r = await task
            assert r.status == 200
            data = await r.json()
            assert data["usage"]["completion_tokens"] == 40
            r.release()
            assert await asyncio.to_thread(sim.proc.wait, 10) == 0
            with pytest.raises(aiohttp.ClientConnectionError):
                await s.get(f"{sim.url}/health")
