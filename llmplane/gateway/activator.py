"""The activator: requests for a model with no ready replica wait here instead of failing
(docs/gateway.md; the settings ``activator*``).

A Playground's model without a ready endpoint (scaled to zero, starting) is *activatable* in
the routing table. Its requests are held in a per-model FIFO (a flow-control ``Band`` of one
flow) bounded by count and bytes, and ``wake(workload)`` is called at once so the autoscaler
scales from zero without waiting for its next pass. A routing table in which the model is no
longer activatable (a replica became ready, the Playground is gone or failing) releases them
in arrival order to resolve again; past the hold timeout a held request gets a 503 with
``Retry-After``. Only the error path of routing reaches this module.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.flowcontrol.queue import Band, Waiter
from llmplane.gateway.observability import Counter, Histogram

COLD_START_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


@dataclass(slots=True, eq=False)
class _Held(Band):
    """One model's held requests, in arrival order (one flow)."""

    workload: str = ""  # the autoscaling signals count held requests per workload
    since: float = 0.0  # monotonic time the first request of this cold start was held


class ActivatorMetrics:
    """The activator's metrics, and ``llmplane_gateway_activator_queue`` (requests held now
    in ``queues``, per model): one collector for the gateway's registry."""

    def __init__(self, queues: dict[str, _Held]) -> None:
        self.queues = queues
        self.held = Counter(
            "llmplane_gateway_activator_held",
            "Requests held for a model without a ready replica",
            ["model"],
        )
        self.refused = Counter(
            "llmplane_gateway_activator_refused",
            "Held requests answered 503: hold timeout, or queue full",
            ["model", "reason"],
        )
        self.cold_start = Histogram(
            "llmplane_gateway_activator_cold_start_seconds",
            "From the first held request to the model's first ready replica",
            ["model"],
            buckets=COLD_START_BUCKETS,
        )
        self.hold = Histogram(
            "llmplane_gateway_activator_hold_seconds",
            "How long released requests were held",
            ["model"],
            buckets=COLD_START_BUCKETS,
        )

    def collect(self) -> list[Any]:
        family = GaugeMetricFamily(
            "llmplane_gateway_activator_queue",
            "Requests held now for a model without a ready replica",
            labels=["model"],
        )
        for model, queue in list(self.queues.items()):
            family.add_metric([model], queue.count)
        return [m.collect() for m in (self.held, self.refused, self.cold_start, self.hold)] + [
            family
        ]


class Activator:
    """Per-model queues of held requests (see the module docstring)."""

    def __init__(self, config: GatewayConfig, wake: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.queues: dict[str, _Held] = {}
        self.metrics = ActivatorMetrics(self.queues)
        # Called with the workload (``namespace/name``) when a request starts waiting for it:
        # what scales it from zero (the embedded autoscaler, the Kubernetes API).
        self.wake = wake

    def held(self, model: str) -> int:
        queue = self.queues.get(model)
        return queue.count if queue else 0

    def held_by_workload(self) -> dict[str, int]:
        """Requests held now, by workload (``namespace/name``): what the autoscaling signals
        count."""
        held: dict[str, int] = {}
        for queue in list(self.queues.values()):
            held[queue.workload] = held.get(queue.workload, 0) + queue.count
        return held

    async def hold(self, model: str, workload: str, size: int) -> None:
        """Wait until ``model`` may be resolved again; GatewayError 503 when it may not."""
        c = self.config
        if c.activator_hold_timeout <= 0:
            raise self._refuse(model, "disabled", "its Playground is starting or scaled to zero")
        start = time.monotonic()
        queue = self.queues.get(model) or _Held(workload=workload, since=start)
        full = None
        if queue.count >= c.activator_max_queue:
            full = f"{queue.count} requests"
        elif queue.bytes + size > c.activator_max_queue_bytes:
            full = f"{queue.bytes} bytes of requests"
        if full is not None:
            raise self._refuse(model, "queue_full", f"{full} already wait for a replica")
        self.queues[model] = queue
        waiter = Waiter(0, model, size, start, asyncio.get_running_loop().create_future())
        queue.push(waiter, 1)
        self.metrics.held.labels(model).inc()
        if self.wake is not None:
            self.wake(workload)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), c.activator_hold_timeout)
        except TimeoutError:
            raise self._refuse(
                model,
                "timeout",
                f"no replica became ready within {_seconds(c.activator_hold_timeout)}",
            ) from None
        finally:
            if not waiter.future.done():  # timed out or the client went away
                waiter.future.cancel()
                if queue.remove(waiter) and not queue.count and self.queues.get(model) is queue:
                    del self.queues[model]
        self.metrics.hold.labels(model).observe(time.monotonic() - start)

    def _refuse(self, model: str, reason: str, detail: str) -> GatewayError:
        self.metrics.refused.labels(model, reason).inc()
        return GatewayError(
            503,
            f"model {model!r} has no ready endpoint: {detail}; retry later",
            ErrorCode.NO_READY_ENDPOINT,
            retry_after=self.config.activator_retry_after,
        )

    def release(self, still_waiting: Callable[[str], bool]) -> None:
        """After a routing-table change: release, oldest first, every queue whose model
        ``still_waiting(model)`` says no longer needs to wait."""
        if not self.queues:
            return
        now = time.monotonic()
        for model in [m for m in self.queues if not still_waiting(m)]:
            queue = self.queues.pop(model)
            self.metrics.cold_start.labels(model).observe(now - queue.since)
            while queue.count:  # futures resume their awaiters in this order
                waiter = queue.pop()
                if not waiter.future.done():
                    waiter.future.set_result(None)


def _seconds(value: float) -> str:
    return f"{value:g} s" if value < 60 or not math.isfinite(value) else f"{value / 60:g} min"
