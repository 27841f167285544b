"""Garbage collection for long-running serving processes (``llmplane up``, ``llmplane gateway``).

CPython's full (generation 2) collection walks every tracked object. ``llmplane up`` in front of
200 sim replicas holds about 100,000 of them (store objects, plans, probes, endpoint states,
connections); with the idle fleet a full collection ran about every 50 s and took 60-160 ms
on a loaded 2-core machine, and every request that arrived meanwhile waited for it (the
maxima of single-request latencies through that fleet, docs/benchmarks.md). Almost all of
those objects live as long as the process.

``freeze_survivors`` moves whatever survived a full collection into the permanent generation
(``gc.freeze``) shortly after it, so the next full collections walk only objects that are
newer. Frozen objects that later become cyclic garbage are not collected while frozen, so
every ``refresh`` seconds the next full collection is let walk everything again
(``gc.unfreeze``) before the survivors are frozen anew: memory held that way is bounded by
what became cyclic garbage within one refresh period.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any


class _FullCollections:
    """Counts full collections (a ``gc.callbacks`` entry: called by whichever thread
    collects, so it only counts)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info.get("generation") == 2:
            self.count += 1


async def freeze_survivors(
    refresh: float = 600.0, check: float = 2.0, clock: Callable[[], float] = time.monotonic
) -> None:
    """Run for the life of the process (a background task); see the module docstring.

    After each full collection (looked for every ``check`` seconds) the young generations are
    collected (a few milliseconds) and everything left is frozen; after ``refresh`` seconds,
    everything is unfrozen instead, for one full collection."""
    full = _FullCollections()
    gc.callbacks.append(full)
    seen = 0
    thawed_at = clock()
    try:
        while True:
            await asyncio.sleep(check)
            if full.count == seen:
                continue
            seen = full.count
            now = clock()
            if now - thawed_at >= refresh:
                gc.unfreeze()  # the next full collection sees every object again
                thawed_at = now
            else:
                gc.collect(1)  # what died young is not frozen with the survivors
                gc.freeze()
    finally:
        gc.callbacks.remove(full)
        gc.unfreeze()
