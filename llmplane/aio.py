"""Small asyncio helpers shared across the package (a leaf module: imports nothing of ours)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("llmplane")


def run(coro: Coroutine[Any, Any, object]) -> None:
    """Run ``coro`` to the end on uvloop (asyncio if it is missing); Ctrl-C ends it quietly.

    The one way a gateway process (single, supervised worker, or up's worker) runs its loop.
    """
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(coro)


async def cancel(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing) and wait until it has ended; its cancellation is not an
    error of the caller's."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def call_on(loop: asyncio.AbstractEventLoop | None, fn: Callable[[], object]) -> None:
    """Call ``fn`` in ``loop``: at once when called from that loop, else soon, in it (a
    thread, e.g. the local runtime's, told us something); nothing without a loop or once it
    is closed."""
    if loop is None or loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        fn()
    else:
        loop.call_soon_threadsafe(fn)


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; True if it is set.

    ``asyncio.timeout``, not ``wait_for``: Python 3.11's ``wait_for`` returns normally when a
    cancellation arrives as the event is set, so a loop waiting this way may never stop.
    """
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        pass
    return event.is_set()


class BodyTooLarge(ValueError):
    """A response body longer than its reader allows (a hostile or broken server)."""


# Bytes of a page an engine serves the gateway or the runtime (/metrics, /v1/models): vLLM's
# /metrics is about 100 KB; a server sending more is broken or hostile and is not read on.
PAGE_MAX_BYTES = 8 << 20


async def read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """``resp``'s body, or ``BodyTooLarge`` as soon as more than ``limit`` bytes arrive."""
    if (resp.content_length or 0) > limit:
        raise BodyTooLarge(f"a body of {resp.content_length} bytes (at most {limit})")
    chunks = []
    size = 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"a body of more than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class Periodic:
    """``step()`` every ``interval`` seconds in a background task, from ``start()`` until
    ``close()``; a step that raises is logged (as ``what`` failing) and the next one runs."""

    def __init__(self, step: Callable[[], object], interval: float, what: str) -> None:
        self.step = step
        self.interval = interval
        self.what = what
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.what)

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel(task)

    async def _run(self) -> None:
        while True:
            try:
                self.step()
            except Exception:
                log.exception("%s failed", self.what)
            await asyncio.sleep(self.interval)
