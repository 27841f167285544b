"""Sims that publish KV-cache events over ZMQ (vLLM's ``--kv-events-config``), and a completion
sent to one."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from llmplane.testing import Processes

BLOCK = 16


VOCAB = 128_256


def events_flags(sockets: Path, name: str, replay: bool = True) -> tuple[list[str], str, str]:
    """(sim flags, events address, replay address) for a sim publishing under ``name``."""
    events = f"ipc://{sockets}/{name}.sock"
    replay_at = f"ipc://{sockets}/{name}-replay.sock" if replay else ""
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events, "topic": "kv"}
    if replay:
        config["replay_endpoint"] = replay_at
    return ["--kv-events-config", json.dumps(config)], events, replay_at


def start_sim(processes: Processes, flags: list[str], *more: str, blocks: int = 48):
    return processes.sim(
        "m", "--time-scale", "0", "--block-size", str(BLOCK), "--num-blocks", str(blocks),
        *flags, *more,
    )  # fmt: skip


async def complete(client: aiohttp.ClientSession, address: str, prompt: str) -> None:
    body = {"model": "m", "prompt": prompt, "max_tokens": 2}
    async with client.post(f"http://{address}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        await r.read()
