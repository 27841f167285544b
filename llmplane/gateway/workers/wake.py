"""Flow-control wake-ups across workers: the room a waiting request needs is often freed by
another worker's completion, so a worker that finishes a request wakes each peer with requests
waiting (docs/gateway.md, "Workers": flow control), through the peer's ``eventfd``, written at
most once until read. A wake-up lost to the race between the two shared counts is caught by
flow control's periodic re-check."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

from llmplane.gateway.workers.shm import cells


class WakeTable:
    """Created by the supervisor before it forks: per worker two shared counts, each with one
    writer, and an eventfd."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.waiting = cells(workers)  # its requests in flow control (zeroed when it dies)
        self.poked = cells(workers)  # set by a waker, cleared by the worker before it pumps
        self.fds = [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(workers)]

    def clear(self, worker: int) -> None:
        """``worker`` died: its waiting requests with it."""
        self.waiting[worker] = 0

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def waker(self, index: int) -> Waker:
        return Waker(self, index)


class Waker:
    """Worker ``index``'s side: ``waiting`` counts its requests in flow control, ``wake_peers``
    after a completion, ``start`` pumps its own flow control when a peer wakes it."""

    def __init__(self, table: WakeTable, index: int) -> None:
        self.index = index
        self.waiting_counts, self.poked = table.waiting, table.poked
        self.fd = table.fds[index]
        self.peers = tuple((i, table.fds[i]) for i in range(table.workers) if i != index)
        self.woken = 0  # wake-ups read (tests, and to see it work)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pump: Callable[[], None] = lambda: None

    def start(self, pump: Callable[[], None]) -> None:
        """Call ``pump`` whenever a peer wakes this worker (from now on, in the running loop)."""
        self._pump = pump
        self.waiting_counts[self.index] = 0  # a replacement starts with nothing waiting
        self.poked[self.index] = 0
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.fd, self._woken)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.fd)
        self._loop = None

    def waiting(self, n: int) -> None:
        """``n`` more (or fewer) requests of this worker wait in flow control."""
        self.waiting_counts[self.index] += n

    def wake_peers(self) -> None:
        """After a request of this worker finished (its in-flight count released): wake every
        peer with requests waiting that is not already woken."""
        waiting, poked = self.waiting_counts, self.poked
        for peer, fd in self.peers:
            if waiting[peer] > 0 and not poked[peer]:
                poked[peer] = 1
                # (OSError: its counter full, never in practice: it is woken already.)
                with contextlib.suppress(OSError):
                    os.eventfd_write(fd, 1)

    def _woken(self) -> None:
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            return
        self.poked[self.index] = 0  # before pumping: a later completion wakes it again
        self.woken += 1
        self._pump()
