"""CPU and memory of the local runtime's replicas, for Resource metrics of a scale trigger.

``ProcessSignals.replica_signals(workload)`` gives, per ready replica's address, ``cpu`` (cores
used since the previous call, over the engine's whole process group) and ``memory`` (resident
bytes). Read from /proc; a replica whose process is gone (or a machine without /proc) has none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from llmplane.controlplane.autoscaling import CPU, MEMORY
from llmplane.runtime.processes import group_usage
from llmplane.runtime.status import READY


class ProcessSignals:
    def __init__(self, runtime: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.runtime = runtime
        self.clock = clock
        # workload -> pid -> (time, CPU seconds) at the previous call
        self._last: dict[str, dict[int, tuple[float, float]]] = {}

    def replica_signals(self, workload: str) -> Mapping[str, Mapping[str, float]]:
        status = self.runtime.status(workload)
        out: dict[str, dict[str, float]] = {}
        before = self._last.pop(workload, {})
        if status is None:
            return out
        now = self.clock()
        seen: dict[int, tuple[float, float]] = {}
        for item in status.items:
            if item.phase != READY or item.pid is None or item.address is None:
                continue
            usage = group_usage(item.pid)  # engines lead their own process group
            if usage is None:
                continue
            cpu_seconds, rss = usage
            values = {MEMORY: float(rss)}
            last = before.get(item.pid)
            if last is not None and now > last[0]:
                values[CPU] = max(0.0, (cpu_seconds - last[1]) / (now - last[0]))
            seen[item.pid] = (now, cpu_seconds)
            out[item.address] = values
        self._last[workload] = seen
        return out
