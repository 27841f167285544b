"""The endpoint list of one process published to its peer workers (``llmplane up --workers
N``: the platform process runs the local runtime, the other workers route to its replicas).

One document (the list as JSON) in shared memory behind a seqlock: the publisher makes the
sequence odd, writes the length and the bytes, makes it even; a reader copies and keeps the
copy only if the sequence was even and unchanged around it. ``BoardDiscovery`` polls the
sequence (one 8-byte read when nothing changed) and is a ``Discovery`` like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterable

import orjson

from llmplane.gateway.discovery import Subscribers
from llmplane.gateway.workers.shm import region
from llmplane.runtime.endpoint import Endpoint

log = logging.getLogger("llmplane.gateway")

BOARD_BYTES = 16 * 1024 * 1024  # about 50,000 endpoints; pages are touched only as written
_HEAD = 16  # sequence, length


class EndpointBoard:
    def __init__(self, size: int = BOARD_BYTES) -> None:
        self.size = size
        self.mem = region(size)
        self.words = memoryview(self.mem).cast("q")
        self._lock = threading.Lock()  # the runtime may report changes from its threads

    def publish(self, endpoints: Iterable[Endpoint]) -> None:
        data = orjson.dumps([dataclasses.asdict(e) for e in endpoints])
        if len(data) > self.size - _HEAD:
            log.error(
                "%d bytes of endpoints do not fit the workers' board: not published", len(data)
            )
            return
        with self._lock:
            words = self.words
            seq = words[0]
            begin = seq + 1 if seq % 2 == 0 else seq + 2
            words[0] = begin
            words[1] = len(data)
            self.mem[_HEAD : _HEAD + len(data)] = data
            words[0] = begin + 1

    def sequence(self) -> int:
        return self.words[0]

    def read(self, seen: int) -> tuple[int, list[Endpoint]] | None:
        """(sequence, endpoints) if the list changed since ``seen``; None otherwise or while
        it is being written."""
        words = self.words
        seq = words[0]
        if seq == seen or seq % 2:
            return None
        length = min(max(words[1], 0), self.size - _HEAD)
        data = self.mem[_HEAD : _HEAD + length]
        if words[0] != seq:
            return None
        return seq, [Endpoint(**doc) for doc in orjson.loads(data)]


class BoardDiscovery(Subscribers):
    """The endpoints a peer publishes on ``board``, looked at every ``interval`` seconds."""

    def __init__(self, board: EndpointBoard, interval: float = 0.05) -> None:
        super().__init__()
        self.board = board
        self.interval = interval
        self._endpoints: list[Endpoint] = []
        self._seen = 0
        self._task: asyncio.Task[None] | None = None
        self.poll()

    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    def poll(self) -> bool:
        got = self.board.read(self._seen)
        if got is None:
            return False
        self._seen, self._endpoints = got
        return True

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="endpoint board")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                if self.poll():
                    self._changed()
            except Exception:
                log.exception("reading the endpoint board failed")
            await asyncio.sleep(self.interval)
