"""Waiting on a condition in tests: poll until it holds, fail with a message when it does not.

``wait_for`` blocks (plain tests, threads); ``eventually`` is the same for coroutines and also
takes async predicates. Both return the first truthy value, so a test can wait for and use a
result in one step, and both raise ``AssertionError`` naming what was awaited and the last value
seen - never fall through silently, never a fixed sleep standing in for the condition.
``always`` / ``keeps`` are the converse, for what must not happen during a time window.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _Polls:
    """The deadline and the last value seen: one message for both helpers."""

    def __init__(self, predicate: Callable[[], Any], timeout: float, what: str) -> None:
        self.predicate = predicate
        self.timeout = timeout
        self.what = what
        self.deadline = time.monotonic() + timeout
        self.last: Any = None
        self.error: BaseException | None = None

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def failure(self) -> AssertionError:
        what = self.what or getattr(self.predicate, "__qualname__", repr(self.predicate))
        detail = f"last error {self.error!r}" if self.error is not None else f"last {self.last!r}"
        return AssertionError(f"timed out after {self.timeout:g} s waiting for {what}: {detail}")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    every: float = 0.02,
    what: str = "",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` until it returns something truthy and return that; exceptions of the
    ``ignore`` types count as "not yet" (a server still starting)."""
    polls = _Polls(predicate, timeout, what)
    while True:
        try:
            polls.last = predicate()
            if polls.last:
                return polls.last
        except ignore as err:
            polls.error = err
        if polls.expired():
            raise polls.failure()
        time.sleep(every)


async def eventually(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float = 10.0,
    every: float = 0.02,
    what: str = "",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """``wait_for`` for coroutines: ``predicate`` may be sync or async; the loop keeps running
    between polls."""
    polls = _Polls(predicate, timeout, what)
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            polls.last = value
            if value:
                return value  # type: ignore[return-value]
        except ignore as err:
            polls.error = err
        if polls.expired():
            raise polls.failure()
        await asyncio.sleep(every)


def always(
    predicate: Callable[[], Any], duration: float, every: float = 0.02, what: str = ""
) -> None:
    """The converse: ``predicate`` holds at every poll for ``duration`` seconds (something must
    NOT happen, e.g. no restart); fails at the first poll where it does not."""
    polls = _Polls(predicate, duration, what)
    while not polls.expired():
        polls.last = predicate()
        if not polls.last:
            name = what or getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(f"{name} stopped holding: {polls.last!r}")
        time.sleep(every)


async def keeps(
    predicate: Callable[[], Any], duration: float, every: float = 0.02, what: str = ""
) -> None:
    """``always`` for coroutines: the loop keeps running between polls (a request in flight
    meanwhile)."""
    polls = _Polls(predicate, duration, what)
    while not polls.expired():
        polls.last = predicate()
        if not polls.last:
            name = what or getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(f"{name} stopped holding: {polls.last!r}")
        await asyncio.sleep(every)
