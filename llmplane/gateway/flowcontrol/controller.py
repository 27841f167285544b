"""Flow control in the gateway: requests wait here while every candidate is saturated
(docs/gateway.md, "Flow control": bands, fairness, bounds, TTL, dispatch, the reserve).

``admit`` is the gateway's one call (go on at once, or wait in the backend's ``FlowQueue``
until dispatched, or the 429) and ``done`` gives a request's seat back. One waiter per
backend is dispatched at a time, the next only once the dispatched request has taken its
endpoint (the saturation rule sees its in-flight count): a burst of completions never
releases more requests than there is room for. A reserved request goes where it starts
soonest (``soonest``), not to the scheduler's usual pick: what it waits for there is the
engine's step. State is per gateway process (each worker keeps its own queues).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import GaugeMetricFamily

from llmplane.gateway.errors import GatewayError, Overloaded
from llmplane.gateway.flowcontrol.fairshare import FlowSeat, Shares
from llmplane.gateway.flowcontrol.queue import (
    SHEDDABLE_BAND,
    FlowQueue,
    Full,
    Level,
    Limits,
    Waiter,
    band_name,
    band_of,
)
from llmplane.gateway.observability import Counter, Histogram
from llmplane.gateway.registry import EndpointState

if TYPE_CHECKING:
    from llmplane.gateway.routing import Backend

WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)
ANONYMOUS = ""  # the flow of requests without a tenant (authentication off)


def flow_of(tenant: str | None) -> str:
    """The flow a request is queued and counted in: its tenant's."""
    return tenant if tenant is not None else ANONYMOUS


class SaturationRule(Protocol):
    """What flow control asks of the saturation rule (``gateway/admission.py``)."""

    def admit(
        self, model: str, backend: Backend, now: float, level: Level, shed: bool
    ) -> Sequence[EndpointState]:
        """The backend's candidates a request may use now (503 none; 429 shed when ``shed``)."""

    def saturated(self, state: EndpointState, now: float, extra: int = 0) -> bool:
        """Whether ``state`` is saturated with ``extra`` more allowed past each count limit."""


class PeerWorkers(Protocol):
    """The other worker processes' flow control (``workers/wake.py``'s ``Waker``)."""

    def waiting(self, n: int) -> None: ...

    def wake_peers(self) -> None: ...


def soonest(candidates: Sequence[EndpointState]) -> Sequence[EndpointState]:
    """Of endpoints past the saturation rule (the reserve), those where a request sent now
    starts its prefill soonest: one with a sequence slot free (below its ``capacity``, when
    known) over one where it would wait for a running request to end, then the fewest streams
    before their first chunk (each is a prefill in the step under way or in the next one, the
    step this request joins), then the fewest requests in flight."""

    def start(state: EndpointState) -> tuple[bool, int, int]:
        full = bool(state.capacity) and state.inflight >= state.capacity
        return (full, state.prefilling, state.inflight)

    best = min(map(start, candidates))
    return [state for state in candidates if start(state) == best]


class FlowMetrics:
    """Flow control's metrics, and ``llmplane_gateway_flow_queue{band,tenant}`` (requests
    waiting now in ``queues``): one collector for the gateway's registry. Label values: band names and tenant names from the tenant table
    (never client text)."""

    def __init__(self, queues: dict[str, FlowQueue]) -> None:
        self.queues = queues
        self.wait = Histogram(
            "llmplane_gateway_flow_wait_seconds",
            "Time dispatched requests waited in the gateway's flow-control queue",
            ["band", "tenant"],
            buckets=WAIT_BUCKETS,
        )
        self.refused = Counter(
            "llmplane_gateway_flow_refused",
            "Queued or arriving requests answered 429: ttl, band_full, queue_full, evicted",
            ["band", "tenant", "reason"],
        )
        self.left = Counter(
            "llmplane_gateway_flow_left",
            "Requests whose client went away while they waited",
            ["band", "tenant"],
        )
        self.reserved = Counter(
            "llmplane_gateway_flow_reserved",
            "Requests of flows under their fair share sent past saturation (the reserve)",
            ["band", "tenant"],
        )

    def collect(self) -> list[Any]:
        family = GaugeMetricFamily(
            "llmplane_gateway_flow_queue",
            "Requests waiting now in the gateway's flow-control queue",
            labels=["band", "tenant"],
        )
        totals: dict[tuple[str, str], int] = {}
        for queue in list(self.queues.values()):
            for key, n in queue.lengths().items():
                totals[key] = totals.get(key, 0) + n
        for (band, tenant), n in sorted(totals.items()):
            family.add_metric([band, tenant], n)
        return [m.collect() for m in (self.wait, self.refused, self.left, self.reserved)] + [family]


class FlowControl:
    """Per-backend queues of requests waiting for room (see the module docstring)."""

    def __init__(
        self,
        admission: SaturationRule,
        *,
        enabled: bool = True,
        ttl: float = 30.0,
        limits: Limits | None = None,
        retry_after: float = 1.0,
        reserve: int = 0,
        recheck: float = 0.05,
        peers: PeerWorkers | None = None,
    ) -> None:
        self.admission = admission
        self.enabled = enabled
        # Per endpoint, requests of under-share flows allowed past the rule (0: no reserve;
        # nothing with flow control off).
        self.reserve = reserve if enabled else 0
        self.peers = peers  # one of several workers: they wake each other
        # Dispatches and seats per backend and flow (counted with a reserve or priority
        # engines); the slot-hog guard's slack is the reserve (at least one).
        self.shares = Shares(slack=max(1, self.reserve))
        self.ttl = ttl
        self.limits = limits or Limits()
        self.retry_after = retry_after
        self.recheck = recheck  # seconds between re-checks while anything waits (0: none)
        self._rechecking: asyncio.TimerHandle | None = None
        self.queues: dict[str, FlowQueue] = {}  # by backend; only while something waits
        self.metrics = FlowMetrics(self.queues)  # and the queue gauge

    async def admit(
        self, model: str, backend: Backend, level: Level, tenant: str | None, weight: int, size: int
    ) -> tuple[Sequence[EndpointState], FlowSeat | None, float | None, float]:
        """Admit a request for ``backend``, waiting while it must: (the candidates it may go
        to, its seat for ``done`` or None when not counted, the seconds it waited or None,
        when it was admitted). GatewayError when refused (503 none ready, 429)."""
        key, admission = backend.ref, self.admission
        now = time.monotonic()
        candidates = admission.admit(model, backend, now, level, not self.enabled)
        waited = None
        if (
            self.enabled
            and (key in self.queues or self._saturated(candidates, now))
            and not self._reserved(key, candidates, level, tenant, weight, now)
        ):
            if self.peers is not None:
                self.peers.waiting(1)  # the other workers' completions wake it too
            try:
                waited = await self.wait(key, candidates, level, tenant, weight, size)
            finally:
                if self.peers is not None:
                    self.peers.waiting(-1)
            now = time.monotonic()  # ejections may have changed while it waited
            candidates = admission.admit(model, backend, now, level, False)
        # Counted for its flow's fair share with a reserve, or when an engine orders its queue
        # by priority (``priority.py`` ranks a request by its share).
        if self.reserve or (
            self.enabled and any(state.endpoint.priority_scheduling for state in candidates)
        ):
            flow = flow_of(tenant)
            under = self.shares.under(key, flow, weight, self.queues.get(key))
            seat = self.shares.take(key, flow, weight, under)
            return self._room(candidates, now), seat, waited, now
        return candidates, None, waited, now

    def done(self, seat: FlowSeat | None) -> None:
        """A request ended: its seat back, and the slot it may have freed to the waiters here
        and in the other workers."""
        if seat is not None:
            self.shares.release(seat)
        self.pump()
        if self.peers is not None:
            self.peers.wake_peers()

    def _saturated(self, candidates: Sequence[EndpointState], now: float) -> bool:
        saturated = self.admission.saturated
        return all(saturated(state, now) for state in candidates)

    def _reserved(
        self,
        key: str,
        candidates: Sequence[EndpointState],
        level: Level,
        tenant: str | None,
        weight: int,
        now: float,
    ) -> bool:
        """Whether this request may go now past the saturation rule (a reserve, not
        Sheddable, its flow under its fair share, an endpoint with room within the reserve)."""
        if not self.reserve:
            return False
        band, flow = band_of(level), flow_of(tenant)
        if (
            band >= SHEDDABLE_BAND
            or not self.shares.under(key, flow, weight, self.queues.get(key))
            or not self._with_room(candidates, now, self.reserve)
        ):
            return False
        self.metrics.reserved.labels(band_name(band), flow).inc()
        return True

    def _with_room(
        self, candidates: Sequence[EndpointState], now: float, extra: int
    ) -> list[EndpointState]:
        """The candidates with room for ``extra`` more requests past the saturation rule."""
        saturated = self.admission.saturated
        return [state for state in candidates if not saturated(state, now, extra)]

    def _room(self, candidates: Sequence[EndpointState], now: float) -> Sequence[EndpointState]:
        """With a reserve, the candidates an admitted request should go to: those below the
        saturation rule, else those within the reserve (it was let through by the reserve),
        else all."""
        if not self.reserve:
            return candidates
        room = self._with_room(candidates, now, 0)
        if room:
            return room
        room = self._with_room(candidates, now, self.reserve)
        return soonest(room) if room else candidates

    async def wait(
        self,
        key: str,
        candidates: Sequence[EndpointState],
        level: Level,
        tenant: str | None,
        weight: int,
        size: int,
    ) -> float:
        """Wait for a dispatch; returns the seconds waited. GatewayError 429 when refused."""
        loop = asyncio.get_running_loop()
        band = band_of(level)
        flow = flow_of(tenant)
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = FlowQueue(self.limits)
        queue.candidates = candidates
        waiter = Waiter(band, flow, size, loop.time(), loop.create_future())
        try:
            evicted = queue.offer(waiter, weight)
        except Full as full:
            self._drop_if_idle(key, queue)
            raise self._refuse(waiter, full.code, full.reason) from None
        for victim in evicted:
            self._fail(
                victim, "evicted", "evicted from the gateway's queue by higher-priority requests"
            )
        waiter.timer = loop.call_later(self.ttl, self._expire, queue, waiter)
        if self._rechecking is None and self.recheck > 0:
            self._rechecking = loop.call_later(self.recheck, self._recheck)
        self._pump(key, queue)
        try:
            await waiter.future
            return loop.time() - waiter.queued_at
        except asyncio.CancelledError:
            if not waiter.granted and queue.remove(waiter):
                self.metrics.left.labels(band_name(band), flow).inc()
            raise
        finally:
            waiter.timer.cancel()
            if waiter.granted:
                # Dispatched: once this task has taken its endpoint (it runs on until its first
                # upstream I/O), the next waiter may go.
                loop.call_soon(self._taken, key, queue)
            else:
                self._drop_if_idle(key, queue)

    def pump(self) -> None:
        """Capacity may have freed (a request finished, a scrape, new endpoints): dispatch."""
        for key, queue in list(self.queues.items()):
            self._pump(key, queue)

    def _recheck(self) -> None:
        """While anything waits: capacity can free without an event this process sees
        (another worker's requests finishing, a dead worker's counts released)."""
        self._rechecking = None
        if not self.queues:
            return
        self.pump()
        if self.queues:
            loop = asyncio.get_running_loop()
            self._rechecking = loop.call_later(self.recheck, self._recheck)

    def _pump(self, key: str, queue: FlowQueue) -> None:
        if queue.granted or not queue.count:
            return
        now = time.monotonic()
        if not self._saturated(queue.candidates, now):
            waiter = queue.pop()
        elif self.reserve and self._with_room(queue.candidates, now, self.reserve):
            waiter = self._under_share(key, queue)  # the reserve: the first under-share waiter
            if waiter is None:
                return
            self.metrics.reserved.labels(band_name(waiter.band), waiter.flow).inc()
        else:
            return
        assert waiter is not None  # the queue has a count
        waiter.granted = True
        queue.granted = True
        waiter.future.set_result(None)
        waited = asyncio.get_running_loop().time() - waiter.queued_at
        self.metrics.wait.labels(band_name(waiter.band), waiter.flow).observe(waited)

    def _under_share(self, key: str, queue: FlowQueue) -> Waiter | None:
        """The first waiter, by band (not Sheddable), whose flow is under its fair share; taken
        out of the queue. (For priority engines, letting Critical waiters take the reserve
        whatever their share was tried and not adopted: `bench.overload`, in git's history
        of docs/benchmarks.md.)"""
        under = self.shares.under
        for band in queue.served_bands():
            for flow in band.flows.values():
                if under(key, flow.name, flow.weight, queue):
                    waiter = flow.waiters[0]
                    queue.remove(waiter)
                    return waiter
        return None

    def _taken(self, key: str, queue: FlowQueue) -> None:
        queue.granted = False
        if not self._drop_if_idle(key, queue):
            self._pump(key, queue)

    def _drop_if_idle(self, key: str, queue: FlowQueue) -> bool:
        if not queue.count and not queue.granted and self.queues.get(key) is queue:
            del self.queues[key]
            return True
        return False

    def _expire(self, queue: FlowQueue, waiter: Waiter) -> None:
        if queue.remove(waiter):
            self._fail(waiter, "ttl", f"waited {self.ttl:g} s in the gateway's queue")

    def _fail(self, waiter: Waiter, reason: str, detail: str) -> None:
        if not waiter.future.done():
            waiter.future.set_exception(self._refuse(waiter, reason, detail))

    def _refuse(self, waiter: Waiter, reason: str, detail: str) -> GatewayError:
        self.metrics.refused.labels(band_name(waiter.band), waiter.flow, reason).inc()
        return Overloaded(
            429,
            f"every endpoint is saturated and the request was not served: {detail}; retry later",
            retry_after=self.retry_after,
        )

    def waiting(self) -> int:
        return sum(q.count for q in self.queues.values())

    def queued_by_endpoint(self) -> dict[str, float]:
        """Waiting requests shared out evenly over the endpoints each waits for (the
        autoscaler's demand: ``gateway/signals.py``)."""
        out: dict[str, float] = {}
        for queue in list(self.queues.values()):
            candidates = queue.candidates
            if queue.count and candidates:
                share = queue.count / len(candidates)
                for state in candidates:
                    out[state.address] = out.get(state.address, 0.0) + share
        return out
