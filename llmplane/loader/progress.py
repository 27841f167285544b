"""Bytes done / bytes total, summed over every file of a model and over download threads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int | None], None]
"""``progress(done, total)``: bytes present so far and bytes in the model (None while unknown)."""


class Progress:
    """Thread-safe counter that calls ``callback`` at most every ``interval`` seconds.

    The first report, a change of total and the final state (done == total) are always reported.
    """

    def __init__(self, callback: ProgressFn | None, interval: float = 0.1) -> None:
        self._callback = callback
        self._interval = interval
        self._lock = threading.Lock()
        self._last_report = 0.0
        self._reported: tuple[int, int | None] | None = None
        self.done = 0
        self.total: int | None = None

    def add_total(self, n: int) -> None:
        with self._lock:
            self.total = (self.total or 0) + n
        self._report(force=True)

    def set_total(self, total: int | None) -> None:
        with self._lock:
            self.total = total
        self._report(force=True)

    def advance(self, n: int, *, now: bool = False) -> None:
        """``n`` more bytes are present; ``now`` reports without waiting for the interval."""
        if not n:
            return
        with self._lock:
            self.done += n
        self._report(force=now)

    def finish(self) -> None:
        """Report the final state once more (a model whose size was never known ends at done/done)."""
        with self._lock:
            if self.total is None or self.total < self.done:
                self.total = self.done
        self._report(force=True)

    def _report(self, force: bool = False) -> None:
        if self._callback is None:
            return
        with self._lock:
            state = (self.done, self.total)
            now = time.monotonic()
            complete = state[1] is not None and state[0] >= state[1]
            if state == self._reported:
                return
            if not (force or complete or now - self._last_report >= self._interval):
                return
            self._reported = state
            self._last_report = now
        try:
            self._callback(*state)
        except Exception:  # a broken progress display must not break the download
            log.exception("progress callback failed; no more progress reports")
            self._callback = None
