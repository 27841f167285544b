"""llmplane/gcpolicy.py: survivors of a full collection are frozen, and every refresh period
one full collection sees everything again."""

from __future__ import annotations

import asyncio
import gc

from llmplane.gcpolicy import freeze_survivors
from llmplane.testing import eventually


async def test_survivors_are_frozen_and_thawed_every_refresh_period() -> None:
    now = [0.0]
    gc.disable()  # only this test's collections: an automatic one could freeze or thaw early
    task = asyncio.create_task(freeze_survivors(refresh=100.0, check=0.01, clock=lambda: now[0]))
    try:
        await asyncio.sleep(0)
        assert gc.get_freeze_count() == 0
        kept = [{"live": i} for i in range(1000)]  # long-lived, tracked
        gc.collect()
        await eventually(lambda: gc.get_freeze_count() > 0, 5, what="a freeze after gc.collect()")
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        assert not any(o is kept for o in gc.get_objects())  # out of every collection's walk

        now[0] = 150.0  # the refresh period is over: the next full collection sees everything
        gc.collect()
        await eventually(lambda: gc.get_freeze_count() == 0, 5, what="an unfreeze")
        assert any(o is kept for o in gc.get_objects())
        gc.collect()  # and after that one, its survivors are frozen again
        await eventually(lambda: gc.get_freeze_count() > 0, 5, what="a freeze after the refresh")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        gc.enable()
    assert gc.get_freeze_count() == 0  # a stopped policy leaves nothing frozen
