"""The request path's timeouts (``gateway/deadlines.py``): a passed deadline is a TimeoutError,
any other cancellation stays one, nested deadlines each raise their own, and blocks that end in
time leave nothing behind."""

from __future__ import annotations

import asyncio

import pytest

from llmplane.gateway.deadlines import Deadlines
from llmplane.testing import eventually


async def test_a_passed_deadline_raises_timeout_error() -> None:
    deadlines = Deadlines(asyncio.get_running_loop())
    never = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError), deadlines.after(0.02):
        await never
    assert not deadlines.pending


async def test_a_block_that_ends_in_time_is_forgotten() -> None:
    deadlines = Deadlines(asyncio.get_running_loop())
    for _ in range(100):
        with deadlines.after(0.05):
            await asyncio.sleep(0)
    assert not deadlines.pending
    # The timer still armed for the first deadline fires over an empty set: nothing happens.
    assert deadlines._timer is not None
    await eventually(lambda: deadlines._timer is None, what="the first deadline's timer fired")
    assert not deadlines.pending


async def test_none_is_no_limit() -> None:
    deadlines = Deadlines(asyncio.get_running_loop())
    with deadlines.after(None):
        await asyncio.sleep(0.01)
    assert not deadlines.pending


async def test_an_outside_cancellation_stays_a_cancellation() -> None:
    deadlines = Deadlines(asyncio.get_running_loop())
    entered = asyncio.Event()

    async def waits() -> None:
        with deadlines.after(10):
            entered.set()
            await asyncio.get_running_loop().create_future()

    task = asyncio.get_running_loop().create_task(waits())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not deadlines.pending


async def test_nested_deadlines_each_raise_their_own() -> None:
    deadlines = Deadlines(asyncio.get_running_loop())
    loop = asyncio.get_running_loop()
    # The inner one passes first: caught inside, the outer block carries on.
    with deadlines.after(5):
        with pytest.raises(TimeoutError), deadlines.after(0.02):
            await loop.create_future()
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    # The outer one passes first: the inner block sees a cancellation, the outer a timeout.
    inner_saw: list[type[BaseException]] = []
    with pytest.raises(TimeoutError), deadlines.after(0.02):
        try:
            with deadlines.after(5):
                await loop.create_future()
        except BaseException as err:
            inner_saw.append(type(err))
            raise
    assert inner_saw == [asyncio.CancelledError]
    assert not deadlines.pending


async def test_many_deadlines_expire_in_one_sweep_each_in_its_task() -> None:
    deadlines = Deadlines(asyncio.get_running_loop())
    loop = asyncio.get_running_loop()

    async def waits(seconds: float) -> str:
        try:
            with deadlines.after(seconds):
                await loop.create_future()
        except TimeoutError:
            return "timeout"
        return "done"

    short = [loop.create_task(waits(0.02)) for _ in range(20)]
    long = loop.create_task(waits(30))
    assert await asyncio.gather(*short) == ["timeout"] * 20
    assert not long.done()
    assert list(deadlines.pending.values()) and len(deadlines.pending) == 1
    long.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long
    deadlines.close()
