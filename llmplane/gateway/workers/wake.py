"""Flow-control wake-ups across workers: the room a waiting request needs is often freed by
another worker's completion, so a worker that finishes a request wakes each peer with requests
waiting (docs/gateway.md, "Workers": flow control). Per worker two int64 words, each with one
writer: ``waiting`` (its own count; the supervisor zeroes a dead worker's) and ``poked`` (set
by a waker, cleared by the worker before it pumps), and an ``eventfd`` written at most once
until read. A wake-up lost to the race between the words is caught by flow control's periodic
re-check."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

from llmplane.gateway.workers.shm import cells


class WakeTable:
    """Created by the supervisor before it forks: the words and one eventfd per worker."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.words = cells(2 * workers)
        self.fds = [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(workers)]

    def clear(self, worker: int) -> None:
        """``worker`` died: its waiting requests with it."""
        self.words[2 * worker] = 0

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
        self.words = table.words
        self.fd = table.fds[index]
        self.mine = 2 * index
        # (waiting word, poked word, eventfd) of every peer.
        self.peers = tuple(
            (2 * i, 2 * i + 1, table.fds[i]) for i in range(table.workers) if i != index
        )
        self.woken = 0  # wake-ups read (tests, and to see it work)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pump: Callable[[], None] = lambda: None

    def start(self, pump: Callable[[], None]) -> None:
        """Call ``pump`` whenever a peer wakes this worker (from now on, in the running loop)."""
        self._pump = pump
        self.words[self.mine] = 0  # a replacement starts with nothing waiting
        self.words[self.mine + 1] = 0
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.fd, self._woken)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.fd)
        self._loop = None

    def waiting(self, n: int) -> None:
        """``n`` more (or fewer) requests of this worker wait in flow control."""
        self.words[self.mine] += n

    def wake_peers(self) -> None:
        """After a request of this worker finished (its in-flight count released): wake every
        peer with requests waiting that is not already woken."""
        words = self.words
        for waiting, poked, fd in self.peers:
            if words[waiting] > 0 and not words[poked]:
                words[poked] = 1
                # (OSError: its counter full, never in practice: it is woken already.)
                with contextlib.suppress(OSError):
                    os.eventfd_write(fd, 1)

    def _woken(self) -> None:
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            return
        self.words[self.mine + 1] = 0  # before pumping: a later completion wakes it again
        self.woken += 1
        self._pump()
