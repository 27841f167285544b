"""The supervisor of ``llmplane gateway --workers N`` (and of ``llmplane up``'s workers 1 ..
N-1): it holds the listening sockets and the shared memory, forks the workers, replaces one
that dies and on SIGTERM / SIGINT waits while they drain (docs/gateway.md, "Workers"). It runs
no event loop and imports nothing after the fork: a plain ``select`` on a signal wake-up pipe
and a pipe the workers write their index to once they serve."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from types import FrameType

from llmplane.gateway.workers.share import Seat, Share
from llmplane.runtime.processes import pdeathsig_preexec

log = logging.getLogger("llmplane.gateway")

QUICK_DEATH = 1.0  # a worker that dies sooner after its start is restarted after a back-off
MAX_BACKOFF = 5.0

# (the worker's seat, call once serving) -> exit code; runs in the forked child.
WorkerMain = Callable[[Seat, Callable[[], None]], int]


def fork(child: Callable[[], int]) -> int:
    """Fork a process that runs ``child`` and exits with its code; its pid. On Linux the child
    gets SIGTERM (it drains) when this process dies, even by SIGKILL (``pdeathsig_preexec``);
    a gateway worker also checks its parent pid once a second."""
    die_with_parent = pdeathsig_preexec()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        if die_with_parent is not None:
            die_with_parent()
        code = child()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def restart_delay(backoff: dict[int, float], index: int, lived: float) -> float:
    """How long to wait before starting worker ``index`` again after it lived ``lived``
    seconds: at once after a long life (which also forgets its back-off), else twice the last
    wait (0.1 s first, ``MAX_BACKOFF`` at most), so a crash loop does not spin."""
    if lived >= QUICK_DEATH:
        backoff.pop(index, None)
        return 0.0
    delay = backoff[index] = min(MAX_BACKOFF, backoff.get(index, 0.05) * 2)
    return delay


class Supervisor:
    def __init__(
        self,
        share: Share,
        worker_main: WorkerMain,
        grace: float,
        indices: Iterable[int] | None = None,
    ) -> None:
        self.share = share
        self.worker_main = worker_main
        self.grace = grace
        # The workers this supervisor runs: all of them, or (``llmplane up``, whose own
        # process is worker 0) the others.
        self.indices = list(range(share.workers) if indices is None else indices)
        self.pids: dict[int, int] = {}  # pid -> worker index
        self.started: dict[int, float] = {}  # worker index -> monotonic start
        self.backoff: dict[int, float] = {}
        self.pending: dict[int, float] = {}  # worker index -> when to start it again
        self.stopping = False
        self._wake_r, self._wake_w = os.pipe()
        self._ready_r, self._ready_w = os.pipe()

    def _spawn(self, index: int) -> None:
        def worker() -> int:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            for fd in (self._wake_r, self._wake_w, self._ready_r):
                os.close(fd)
            self.share.keep_only(index)
            return self.worker_main(
                self.share.seat(index), lambda: os.write(self._ready_w, bytes([index]))
            )

        self.pids[fork(worker)] = index
        self.started[index] = time.monotonic()

    def _reap(self, serving: bool) -> int | None:
        """Collect dead workers; schedule their replacement. Returns an exit code when the
        gateway must stop (a worker failed before all of them served: a startup error)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == 0:
                return None
            index = self.pids.pop(pid, None)
            if index is None:
                continue
            self.share.reaped(index)
            code = os.waitstatus_to_exitcode(status)
            if self.stopping:
                continue
            if not serving:
                return code if code > 0 else 1
            now = time.monotonic()
            delay = restart_delay(self.backoff, index, now - self.started[index])
            log.warning(
                "gateway worker %d (pid %d) exited (%s); starting a new one%s",
                index,
                pid,
                f"code {code}" if code >= 0 else f"signal {-code}",
                f" in {delay:.1f} s" if delay else "",
            )
            self.pending[index] = now + delay

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.stopping = True

    def run(self, on_serving: Callable[[], None]) -> int:
        """Start the workers, call ``on_serving`` once all serve, run until signalled; the
        exit code."""
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        signal.set_wakeup_fd(self._wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, self._on_signal)
        for index in self.indices:
            self._spawn(index)
        ready: set[int] = set()
        serving = False
        code = 0
        try:
            while not self.stopping:
                timeout = 1.0
                if self.pending:
                    timeout = max(0.0, min(min(self.pending.values()) - time.monotonic(), 1.0))
                try:
                    readable, _, _ = select.select([self._wake_r, self._ready_r], [], [], timeout)
                except InterruptedError:
                    readable = []
                if self._wake_r in readable:
                    os.read(self._wake_r, 4096)
                if self._ready_r in readable:
                    ready.update(os.read(self._ready_r, 4096))
                    if not serving and ready.issuperset(self.indices):
                        serving = True
                        on_serving()
                if self.stopping:
                    break
                failed = self._reap(serving)
                if failed is not None:
                    code = failed
                    break
                now = time.monotonic()
                for index, when in list(self.pending.items()):
                    if when <= now:
                        del self.pending[index]
                        self._spawn(index)
        finally:
            self.stopping = True
            self._stop_all()
            signal.set_wakeup_fd(-1)
        return code

    def _stop_all(self) -> None:
        """SIGTERM to every worker, wait while they drain (the gateway's shutdown grace plus
        a margin), then SIGKILL whatever is left."""
        for pid in list(self.pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace + 10.0
        while self.pids and time.monotonic() < deadline:
            self._reap(True)
            if self.pids:
                with contextlib.suppress(InterruptedError):
                    select.select([self._wake_r], [], [], 0.2)
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
        for pid in list(self.pids):
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.pids.pop(pid, None)
