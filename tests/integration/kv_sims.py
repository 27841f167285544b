"""Sims that publish KV-cache events over ZMQ (vLLM's ``--kv-events-config``), and a completion
sent to one."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from llmplane.gateway.kvcache.subscriber import KVEventSubscriber
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


async def sim_cache(client: aiohttp.ClientSession, address: str) -> set[int]:
    """The block hashes a sim holds (its ``/admin/kv-cache``)."""
    async with client.get(f"http://{address}/admin/kv-cache") as r:
        return {int(h) for h in (await r.json())["hashes"]}


def indexed(sub: KVEventSubscriber, replica: str) -> set[int]:
    """The blocks the subscriber's index holds for ``replica``."""
    state = sub.index.replicas.get(replica)
    return set(state.blocks) if state is not None else set()
