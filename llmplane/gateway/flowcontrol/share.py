"""Fair shares of a backend's in-flight requests, for the flow-control reserve.

With ``flowControlReserve: N`` a request may go past the saturation rule, by at most N per
endpoint, when its flow (tenant) holds less than its fair share of the backend's requests in
flight: ``in flight x weight / sum of the weights of the active flows`` (a flow is active
with a request in flight or waiting), or nothing at all. Over-share flows and Sheddable
requests wait. A tenant that sends little then finds room at once even while a heavy
tenant's backlog keeps every engine at its limit: the idea of max-min fairness (a flow below
its share goes first) and of Kubernetes API Priority and Fairness' seats, applied to the
moment of dispatch. What the reserve lends is paid back: the endpoint stays saturated for
everyone else until its load is below the rule again.

``Shares`` counts, per backend and flow, the requests that passed admission and have not
finished (only when the reserve is configured); a ``Seat`` is one of them.
"""

from __future__ import annotations

from llmplane.gateway.flowcontrol.queue import FlowQueue


class _Backend:
    __slots__ = ("counts", "total", "weights")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}  # flow -> requests in flight (only flows with some)
        self.weights: dict[str, int] = {}  # flow -> its latest weight
        self.total = 0


class Seat:
    """One request in flight, counted for its flow until ``Shares.release``."""

    __slots__ = ("backend", "flow", "key")

    def __init__(self, key: str, backend: _Backend, flow: str) -> None:
        self.key = key
        self.backend = backend
        self.flow = flow


class Shares:
    """Requests in flight per backend and flow (see the module docstring)."""

    def __init__(self) -> None:
        self.backends: dict[str, _Backend] = {}

    def take(self, key: str, flow: str, weight: int) -> Seat:
        backend = self.backends.get(key)
        if backend is None:
            backend = self.backends[key] = _Backend()
        backend.counts[flow] = backend.counts.get(flow, 0) + 1
        backend.weights[flow] = weight
        backend.total += 1
        return Seat(key, backend, flow)

    def release(self, seat: Seat) -> None:
        backend = seat.backend
        n = backend.counts.get(seat.flow, 0) - 1
        if n < 0:
            return  # released twice: keep the counts right
        backend.total -= 1
        if n:
            backend.counts[seat.flow] = n
        else:
            del backend.counts[seat.flow]
            del backend.weights[seat.flow]
            if not backend.total and self.backends.get(seat.key) is backend:
                del self.backends[seat.key]

    def in_flight(self, key: str, flow: str) -> int:
        backend = self.backends.get(key)
        return backend.counts.get(flow, 0) if backend is not None else 0

    def under(self, key: str, flow: str, weight: int, queue: FlowQueue | None) -> bool:
        """Whether ``flow`` (weight ``weight``) holds less than its fair share of ``key``'s
        requests in flight, counting the flows waiting in ``queue`` as active."""
        backend = self.backends.get(key)
        mine = backend.counts.get(flow, 0) if backend is not None else 0
        if not mine:
            return True
        assert backend is not None
        weights = dict(backend.weights)
        if queue is not None:
            for band in queue.bands:
                for name, waiting in band.flows.items():
                    weights.setdefault(name, waiting.weight)
        weights[flow] = weight
        return mine * sum(weights.values()) < backend.total * weight
