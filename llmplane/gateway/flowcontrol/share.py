"""Fair shares of a backend's in-flight requests, for the flow-control reserve.

With ``flowControlReserve: N`` a request may go past the saturation rule, by at most N per
endpoint, when its flow (tenant) holds less than its fair share of the backend's requests in
flight: ``in flight x weight / sum of the weights of the active flows`` (a flow is active
with a request in flight or one waiting in a band the reserve serves: Critical or Default),
or nothing at all. Over-share flows and Sheddable requests wait. A tenant that sends little
then finds room at once even while a heavy tenant's backlog keeps every engine at its limit:
the idea of max-min fairness (a flow below its share goes first) and of Kubernetes API
Priority and Fairness' seats, applied to the moment of dispatch. What the reserve lends is paid back: the endpoint stays saturated for
everyone else until its load is below the rule again.

``Shares`` counts, per backend and flow, the requests that passed admission and have not
finished (only when the reserve is configured); a ``Seat`` is one of them.

Why a flow with only Sheddable requests waiting is no claimant: those are the requests
overload sheds and the reserve never serves, yet counted, every tenant of a backend with a
Sheddable backlog had its share cut (by a quarter with four tenants), and a small tenant with
a short burst in flight (4 of 15, over 15/4) was queued behind the heavy tenant's backlog:
the slowest small requests of the overload benchmark lost 0.2-0.9 s there
(docs/benchmarks.md, "Overload").
"""

from __future__ import annotations

from llmplane.gateway.flowcontrol.queue import BAND, FlowQueue

SERVED = BAND["Sheddable"]  # the bands before it are the ones the reserve serves


class _Backend:
    __slots__ = ("counts", "total", "weights")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}  # flow -> requests in flight (only flows with some)
        self.weights: dict[str, int] = {}  # flow -> its latest weight
        self.total = 0


class Seat:
    """One request in flight, counted for its flow until ``Shares.release``; ``under``: its
    flow held less than its fair share when it was admitted (``priority.py`` ranks it so)."""

    __slots__ = ("backend", "flow", "key", "under")

    def __init__(self, key: str, backend: _Backend, flow: str, under: bool = True) -> None:
        self.key = key
        self.backend = backend
        self.flow = flow
        self.under = under


class Shares:
    """Requests in flight per backend and flow (see the module docstring)."""

    def __init__(self) -> None:
        self.backends: dict[str, _Backend] = {}

    def take(self, key: str, flow: str, weight: int, under: bool = True) -> Seat:
        backend = self.backends.get(key)
        if backend is None:
            backend = self.backends[key] = _Backend()
        backend.counts[flow] = backend.counts.get(flow, 0) + 1
        backend.weights[flow] = weight
        backend.total += 1
        return Seat(key, backend, flow, under)

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
        requests in flight, counting the flows waiting in ``queue``'s Critical and Default
        bands as active."""
        backend = self.backends.get(key)
        mine = backend.counts.get(flow, 0) if backend is not None else 0
        if not mine:
            return True
        assert backend is not None
        weights = dict(backend.weights)
        if queue is not None:
            for band in queue.bands[:SERVED]:
                for name, waiting in band.flows.items():
                    weights.setdefault(name, waiting.weight)
        weights[flow] = weight
        return mine * sum(weights.values()) < backend.total * weight
