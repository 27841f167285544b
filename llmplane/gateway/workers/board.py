"""``llmplane up --workers N``: the platform's endpoint list published to workers 1 .. N-1 as one
JSON ``shm.Document`` (docs/gateway.md, "``llmplane up --workers N``": endpoints)."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable

import orjson

from llmplane.aio import Periodic
from llmplane.gateway.discovery import Subscribers
from llmplane.gateway.workers.shm import Document
from llmplane.runtime.endpoint import Endpoint

log = logging.getLogger("llmplane.gateway")

BOARD_BYTES = 16 * 1024 * 1024  # about 50,000 endpoints; pages are touched only as written


class EndpointBoard:
    def __init__(self, size: int = BOARD_BYTES) -> None:
        self.document = Document(size)
        self._lock = threading.Lock()  # the runtime may report changes from its threads

    def publish(self, endpoints: Iterable[Endpoint]) -> None:
        data = orjson.dumps([dataclasses.asdict(e) for e in endpoints])
        with self._lock:
            if not self.document.write(data):
                log.error(
                    "%d bytes of endpoints do not fit the workers' board: not published", len(data)
                )


class BoardDiscovery(Subscribers):
    """The endpoints published on ``board``, looked at every ``interval`` seconds (one 8-byte
    read when nothing changed): a ``Discovery`` like any other."""

    def __init__(self, board: EndpointBoard, interval: float = 0.05) -> None:
        super().__init__()
        self.board = board
        self._endpoints: list[Endpoint] = []
        self._seen = 0
        self._ticker = Periodic(self._step, interval, "reading the endpoint board")
        self.poll()

    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    def poll(self) -> bool:
        """Take the list if it changed since the last look (and is not being written)."""
        got = self.board.document.read(self._seen)
        if got is None:
            return False
        self._seen = got[0]
        self._endpoints = [Endpoint(**doc) for doc in orjson.loads(got[1])]
        return True

    def _step(self) -> None:
        if self.poll():
            self._changed()

    async def start(self) -> None:
        self._ticker.start()

    async def close(self) -> None:
        await self._ticker.close()
