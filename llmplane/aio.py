"""Small asyncio helpers shared across the package (a leaf module: imports nothing of ours)."""

from __future__ import annotations

import asyncio


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
