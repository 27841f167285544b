"""Request timeouts on one lazily armed timer, in place of ``asyncio.timeout`` on the hot path,
which costs per use three ``get_running_loop()`` calls (each a ``getpid()`` on Python 3.11), an
object and a timer armed and cancelled: about 7 % of a proxied request's CPU, for a timeout
that almost never fires. Here a deadline is a dict entry, and one timer stands at the earliest,
re-armed only when a shorter one arrives or when it fires. A deadline that passes cancels its
task; the ``with`` block turns that into ``TimeoutError``, as ``asyncio.timeout`` does (a
cancellation from elsewhere stays a cancellation)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from contextlib import AbstractContextManager
from types import TracebackType

_NO_DEADLINE: AbstractContextManager[None] = contextlib.nullcontext()


class Deadlines:
    """The deadlines of one event loop's requests: ``with deadlines.after(seconds): ...``."""

    # A re-armed timer waits at least this long: many deadlines passing close together are
    # handled by one sweep, not one timer each (timeouts fire up to this much late).
    SLACK = 0.005

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[Deadline, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def after(self, seconds: float | None) -> AbstractContextManager[object]:
        """A ``with`` block that raises ``TimeoutError`` once ``seconds`` have passed (None:
        no limit), counted from this call. The block must run in a task of this loop."""
        if seconds is None:
            return _NO_DEADLINE
        # With the loop given, current_task does not ask for the running loop (no getpid).
        task = asyncio.current_task(self.loop)
        if task is None:
            raise RuntimeError("a deadline must be used inside a task")
        deadline = Deadline(self.pending, task)
        at = self.loop.time() + seconds
        self.pending[deadline] = at
        if at < self._timer_at:
            self._arm(at)
        return deadline

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        now = self.loop.time()
        earliest = math.inf
        expired = []
        for deadline, at in self.pending.items():
            if at <= now:
                expired.append(deadline)
            elif at < earliest:
                earliest = at
        for deadline in expired:
            del self.pending[deadline]
            deadline.expire()
        if earliest < math.inf:
            self._arm(max(earliest, now + self.SLACK))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf


class Deadline:
    """One ``with`` block's deadline (``Deadlines.after``): when it passes it cancels the task,
    and the block turns that cancellation into ``TimeoutError``."""

    __slots__ = ("_cancelling", "_pending", "_task", "expired")

    def __init__(self, pending: dict[Deadline, float], task: asyncio.Task[object]) -> None:
        self._pending = pending
        self._task = task
        self._cancelling = task.cancelling()
        self.expired = False

    def __enter__(self) -> Deadline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.expired:
            self._pending.pop(self, None)
        elif self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    def expire(self) -> None:
        self.expired = True
        self._task.cancel()
