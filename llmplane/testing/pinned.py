"""Client connections to one chosen worker of a multi-worker gateway (tests, benchmarks).

Each worker accepts on its own ``SO_REUSEPORT`` socket and the kernel picks the socket by a
hash of the connection's addresses, so a client cannot ask for a worker. ``on_worker`` gives
an aiohttp session whose connector opens connections until one is accepted by the wanted
process (read from /proc: which of the workers holds the accepted socket) and closes the
others; each attempt lands there with probability about 1 / workers, and after 64 failed
attempts it gives up with an error. A connection no process accepts within a few seconds (its
worker is stopped, say) counts as a failed attempt."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

import aiohttp

from llmplane.testing.sockets import established

ATTEMPTS = 64
ACCEPT_TIMEOUT = 3.0


def accepted_by(client_port: int, server_port: int, among: Iterable[int]) -> int | None:
    """The process in ``among`` holding the server side of the connection from local port
    ``client_port`` to ``server_port`` (None while none has accepted it)."""
    for pid, held in established(among).items():
        if (server_port, client_port) in held.values():
            return pid
    return None


class WorkerConnector(aiohttp.TCPConnector):
    """A connector whose every connection is accepted by process ``pid`` (one of ``among``)."""

    def __init__(self, pid: int, among: Iterable[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pid = pid
        self.among = set(among) | {pid}

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        owners: list[int] = []
        for _ in range(ATTEMPTS):
            proto = await super()._create_connection(req, traces, timeout)
            local = proto.transport.get_extra_info("sockname")[1]
            remote = proto.transport.get_extra_info("peername")[1]
            deadline = time.monotonic() + ACCEPT_TIMEOUT
            while (owner := accepted_by(local, remote, self.among)) is None:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.005)
            if owner == self.pid:
                return proto
            owners.append(owner or 0)
            proto.close()
        raise AssertionError(
            f"{ATTEMPTS} connections, none accepted by {self.pid}: accepted by {owners} "
            f"(0: by none within {ACCEPT_TIMEOUT} s)"
        )


def on_worker(pid: int, among: Iterable[int], **kwargs: Any) -> aiohttp.ClientSession:
    """A session whose requests all reach worker process ``pid`` (``kwargs``: the
    connector's, e.g. ``force_close=True`` or ``limit=1``)."""
    return aiohttp.ClientSession(connector=WorkerConnector(pid, among, **kwargs))
