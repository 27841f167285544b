"""llmplane.aio.wait_event: an Event with a timeout that never loses a cancellation."""

from __future__ import annotations

import asyncio

from llmplane.aio import wait_event


async def test_wait_event_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, 5) is True
    assert await wait_event(event, 0) is True  # already set


async def test_a_cancellation_arriving_as_the_event_is_set_is_never_lost() -> None:
    # wait_for(event.wait(), t) on Python 3.11 returned normally when the cancellation landed
    # in the loop iterations that deliver the set(): a loop waiting that way never stopped.
    # Cancelling 0..5 iterations after set() covers the delivery.
    for k in range(6):
        event = asyncio.Event()
        waiting = asyncio.ensure_future(wait_event(event, 5))
        await asyncio.sleep(0)  # parked on the event
        event.set()
        for _ in range(k):
            await asyncio.sleep(0)
        requested = waiting.cancel()
        await asyncio.wait([waiting])
        assert waiting.cancelled() or not requested, f"cancellation lost {k} iterations after set"
