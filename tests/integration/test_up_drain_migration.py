"""Draining hands streams over: ``llmplane up`` with a Playground of two sim replicas (grace
period 3 s), 20 long streams through its gateway, then the Playground scaled to one replica.
The drained replica keeps its streams for the grace period, then the gateway continues them
on the other replica: all 20 complete without an error with exactly their ``max_tokens``,
and the drained replica's process is gone within its grace period plus 5 s (without the
handover the sim's own shutdown would wait 10 s for its streams). With two gateway workers,
streams of both are handed over."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from llmplane.testing import Processes, eventually, wait_for
from tests.integration.upcli import alive, cli, sim_fleet, status

NAME = "tiny"
GRACE = 3
STREAMS = 20
TOKENS = 1000  # ~14 s at the sim's --time-scale 2: far longer than the grace period


def fleet(replicas: int) -> str:
    return (
        sim_fleet(NAME, replicas, time_scale="2", args=["--max-num-seqs", "64"])
        + f"  llmplane: {{terminationGracePeriodSeconds: {GRACE}}}\n"
    )


async def read(session: aiohttp.ClientSession, url: str, i: int, started: set[int]) -> dict:
    """One stream (completions and chat in turn): its endpoint, events and whether it ended."""
    chat = i % 2 == 1
    body: dict = {"model": NAME, "max_tokens": TOKENS, "ignore_eos": True, "temperature": 0,
                  "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    if chat:
        body["messages"] = [{"role": "user", "content": f"tell story {i}"}]
    else:
        body["prompt"] = f"once upon a time {i}"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with session.post(url + path, data=orjson.dumps(body)) as resp:
        assert resp.status == 200, await resp.text()
        events: list[bytes] = []
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
                if len(events) == 10:
                    started.add(i)
        return {"endpoint": resp.headers["x-llmplane-endpoint"], "events": events, "chat": chat}


@pytest.mark.parametrize("workers", [1, 2])
async def test_scale_down_hands_long_streams_over(
    tmp_path: Path, processes: Processes, workers: int
) -> None:
    """With ``--workers 2`` the streams of both gateway workers are handed over."""
    spec = tmp_path / "fleet.yaml"
    spec.write_text(fleet(2))
    up = processes.up(tmp_path / "state", str(spec), args=["--workers", str(workers)])
    state = up.state_dir
    wait_for(
        lambda: (
            status(state, "Playground", NAME).get("readyReplicas") == 2
            and len(up.engine_pids()) == 2
        ),
        90,
        what="two sim replicas ready",
    )
    before = up.engine_pids()
    started: set[int] = set()
    async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as session:
        tasks = [asyncio.create_task(read(session, up.url, i, started)) for i in range(STREAMS)]
        await eventually(
            lambda: len(started) == STREAMS or any(t.done() for t in tasks),
            60,
            what="every stream under way",
        )
        assert not any(t.done() for t in tasks), "a stream ended before the scale-down"

        spec.write_text(fleet(1))
        await asyncio.to_thread(cli, "apply", "-f", str(spec), state_dir=state)
        scaled = time.monotonic()  # stored: the controller scales down at once
        # the runtime forgets an engine's pid once its process has exited
        (pid,) = await eventually(
            lambda: before - up.engine_pids() or None, GRACE + 30, what="a replica stops"
        )
        stopped = time.monotonic() - scaled
        assert not alive(pid)
        assert stopped <= GRACE + 5, f"the drained replica stopped {stopped:.1f} s after the scale"
        assert stopped >= GRACE - 0.5, f"stopped after {stopped:.1f} s: its grace period was cut"
        assert not any(t.done() for t in tasks), "a stream ended before its replica stopped"
        results = await asyncio.wait_for(asyncio.gather(*tasks), 120)

        async with session.get(f"{up.url}/metrics") as resp:
            metrics = await resp.text()
    endpoints = {r["endpoint"] for r in results}
    assert len(endpoints) == 2, f"the streams never spread over both replicas: {endpoints}"
    for i, result in enumerate(results):
        raw = result["events"]
        assert raw[-1] == b"[DONE]", (i, raw[-3:])
        assert not any(b'"error"' in e for e in raw), [e for e in raw if b"error" in e]
        events = [orjson.loads(e) for e in raw[:-1]]
        assert len({e["id"] for e in events}) == 1, f"stream {i}: two ids"
        assert events[-1]["usage"]["completion_tokens"] == TOKENS, (i, events[-1])
        finals = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
        assert finals == ["length"], (i, finals)
    moved = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("llmplane_gateway_stream_migrations_total{")
        and 'reason="drained"' in line
    )
    assert moved >= 1, [m for m in metrics.splitlines() if "migration" in m]
