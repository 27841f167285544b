"""llmplane.aio: wait_event, an Event with a timeout that never loses a cancellation; call_on,
a call that runs in the given loop whichever thread asks."""

from __future__ import annotations

import asyncio
import threading

from llmplane.aio import call_on, cancel, wait_event


async def test_call_on_runs_in_the_loop_whichever_thread_asks() -> None:
    loop = asyncio.get_running_loop()
    calls: list[tuple[str, threading.Thread]] = []
    call_on(loop, lambda: calls.append(("loop", threading.current_thread())))
    assert calls == [("loop", threading.current_thread())]  # at once, from the loop itself
    done = asyncio.Event()

    def from_thread() -> None:
        calls.append(("thread", threading.current_thread()))
        done.set()

    worker = threading.Thread(target=call_on, args=(loop, from_thread))
    worker.start()
    await asyncio.to_thread(worker.join)
    assert await wait_event(done, 5), "the call from a thread never ran"
    assert calls[1] == ("thread", threading.current_thread())  # in the loop's thread
    call_on(None, lambda: calls.append(("none", threading.current_thread())))
    assert len(calls) == 2


def test_call_on_a_closed_loop_does_nothing() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    call_on(loop, lambda: (_ for _ in ()).throw(AssertionError("called")))


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


async def test_cancel_ends_the_task_and_keeps_its_cancellation_to_itself() -> None:
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(forever())
    await started.wait()
    await cancel(task)  # no CancelledError here
    assert task.cancelled()
    await cancel(None)  # nothing to do
