"""Fault injection and shutdown of real sim processes."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest

from llmplane.testing import eventually, sim_process


@pytest.fixture
def sim():
    with sim_process("m", "--time-scale", "0.01") as p:
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
    with sim_process("m", "--fault-slow-start", "0.6") as sim:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{sim.url}/health") as r:
                assert r.status == 503
            async with s.post(f"{sim.url}/v1/completions", json=BODY) as r:
                assert r.status == 503

            async def healthy() -> bool:
                async with s.get(f"{sim.url}/health") as r:
                    return r.status == 200

            await eventually(healthy, 5, what="healthy after the slow start", every=0.05)


async def test_crash_after_n_requests():
    sim = sim_process("m", "--time-scale", "0", "--fault-crash-after", "2")
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
    sim = sim_process("m", "--time-scale", "1")
    with sim:
        async with aiohttp.ClientSession() as s:
            body = {**BODY, "max_tokens": 40}  # ~0.3 s of decode
            task = asyncio.create_task(s.post(f"{sim.url}/v1/completions", json=body))

            async def running() -> bool:
                async with s.get(f"{sim.url}/metrics") as r:
                    text = await r.text()
                return any(
                    line.startswith("vllm:num_requests_running") and float(line.split()[-1]) >= 1
                    for line in text.splitlines()
                )

            await eventually(running, 10, what="the request running")
            sim.proc.send_signal(signal.SIGTERM)
            r = await task
            assert r.status == 200
            data = await r.json()
            assert data["usage"]["completion_tokens"] == 40
            r.release()
            assert await asyncio.to_thread(sim.proc.wait, 10) == 0
            with pytest.raises(aiohttp.ClientConnectionError):
                await s.get(f"{sim.url}/health")
