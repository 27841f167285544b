"""KV-cache events over ZMQ, as vLLM publishes them (``--kv-events-config``).

The pool's record of blocks entering and leaving the prefix cache (``kvcache.BlockPool.events``)
is published after every engine step that changed it, as one batch: three frames (topic,
8-byte big-endian sequence number from 0, msgpack payload ``[ts, [events], dp_rank]``), with
consecutive blocks of one chain in one ``BlockStored`` (parent hash None for block 0, as vLLM).
The PUB socket binds when the endpoint is ``ipc://`` or ``inproc://`` or has a ``*``, else it
connects (vLLM's rule). With a ``replay_endpoint``, a ROUTER socket answers a request
``[b"", start sequence as 8 bytes]`` with every buffered batch from ``start`` on (``[b"",
topic, seq, payload]`` each, at most ``buffer_steps`` kept) and an end marker ``[b"", b"", -1
as 8 signed bytes, b""]``, as vLLM 0.32 does. ``wire="positional"`` sends each event as a
tagged array, as vLLM releases before 0.32 did.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from dataclasses import dataclass

import zmq
import zmq.asyncio

from llmplane.gateway.kvcache.events import Removed, Stored, encode_batch
from llmplane.sim.kvcache import STORED

log = logging.getLogger("llmplane.sim")
END_SEQ = (-1).to_bytes(8, "big", signed=True)
WIRES = ("map", "positional")


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's ``--kv-events-config`` keys the sim honours (others are accepted, ignored)."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    topic: str = ""

    @classmethod
    def parse(cls, text: str) -> KVEventsConfig:
        """From the flag's JSON; ValueError naming what is wrong."""
        try:
            raw = json.loads(text)
        except ValueError as err:
            raise ValueError(f"--kv-events-config: not JSON ({err})") from None
        if not isinstance(raw, dict):
            raise ValueError("--kv-events-config: must be a JSON object")
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        config = cls(**known)
        if config.publisher not in ("null", "zmq"):
            raise ValueError("--kv-events-config: publisher must be 'zmq' or 'null'")
        for key in ("endpoint", "replay_endpoint", "topic"):
            value = getattr(config, key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"--kv-events-config: {key} must be a string")
        for key in ("buffer_steps", "hwm"):
            value = getattr(config, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"--kv-events-config: {key} must be an integer >= 1")
        return config

    @property
    def enabled(self) -> bool:
        return bool(self.enable_kv_cache_events) and self.publisher == "zmq"


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def batch_events(records: list[tuple]) -> list[Stored | Removed]:
    """The pool's records as vLLM events: runs of one chain in one BlockStored, runs of
    removals in one BlockRemoved."""
    out: list[Stored | Removed] = []
    for record in records:
        last = out[-1] if out else None
        if record[0] == STORED:
            _, h, parent, tokens, lora = record
            if (
                isinstance(last, Stored)
                and parent is not None
                and last.hashes[-1] == parent
                and last.lora == lora
            ):
                last.hashes.append(h)
                last.token_ids.extend(tokens)
            else:
                out.append(Stored([h], parent, list(tokens), len(tokens), lora))
        elif isinstance(last, Removed):
            last.hashes.append(record[1])
        else:
            out.append(Removed([record[1]]))
    return out


class KVEventPublisher:
    """The PUB socket, the replay buffer and the ROUTER that serves it."""

    def __init__(self, config: KVEventsConfig, wire: str = "map") -> None:
        self.config = config
        self.positional = wire == "positional"
        self.topic = config.topic.encode()
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.set_hwm(config.hwm)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        try:
            (self.pub.bind if _binds(config.endpoint) else self.pub.connect)(config.endpoint)
            if config.replay_endpoint:
                self.replay = self.ctx.socket(zmq.ROUTER)
                self.replay.setsockopt(zmq.LINGER, 0)
                self.replay.bind(config.replay_endpoint)
        except zmq.ZMQError as err:
            self.close()
            raise OSError(f"--kv-events-config: {err}") from None

    def start(self) -> None:
        if self.replay is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    def publish(self, records: list[tuple], send: bool = True) -> None:
        """One batch of the pool's records (dropped, as vLLM's, when the socket is full;
        ``send`` False: only numbered and buffered, the fault ``kv_events_drop``)."""
        payload = encode_batch(time.time(), batch_events(records), self.positional)
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if not send:
            return
        with contextlib.suppress(zmq.Again):
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload), zmq.NOBLOCK)

    async def _serve_replay(self) -> None:
        assert self.replay is not None
        while True:
            frames = await self.replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue  # not a replay request
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    await self.replay.send_multipart(
                        (client, b"", self.topic, seq.to_bytes(8, "big"), payload)
                    )
            await self.replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.pub.close(0)
        if self.replay is not None:
            self.replay.close(0)
        self.ctx.term()
