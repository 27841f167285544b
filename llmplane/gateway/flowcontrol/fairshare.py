"""Fair shares of a backend's service, for the flow-control reserve and engine priority
(docs/gateway.md, "Reserve for flows under their fair share").

A flow (tenant) is under its share when its decayed count of dispatches (requests that passed
admission, each 1, decaying with time constant ``TAU``) is below ``the backend's decayed total
x weight / sum of the weights of the active flows``: least attained service, decided at the
moment of dispatch. Why dispatches and not seats (requests in flight): under load every request
lasts as long as the engine's queue makes it, so a tenant sending a tenth of another's rate
would hold its share of the seats after a burst of a few arrivals and then wait as "over its
share"; its dispatch rate stays a fraction of its share whatever its requests' length.

Why ``TAU`` = 5 s: long against a request's life under load (1-2 s) and the gaps between a
small flow's arrivals, so a burst of a few requests moves its count by little; short enough
that a flow that stops sending is forgotten within about ten seconds and one that starts a
backlog is over its share within a few.

The slot-hog guard: a flow with few but long requests has a low dispatch rate yet could hold
every slot the reserve lends, so it is also over when its requests in flight reach its
in-flight share plus ``slack`` (the reserve, at least 1). A flow with only Sheddable requests
waiting is no claimant: the reserve never serves those, and counted they would cut every other
tenant's share.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmplane.gateway.flowcontrol.queue import FlowQueue

TAU = 5.0  # seconds: the time constant of the decayed dispatch counts (see above)
FORGET = 0.1  # a flow with nothing in flight whose count decayed below this is forgotten


@dataclass(slots=True, eq=False)
class _Flow:
    weight: int  # its latest weight
    inflight: int = 0  # requests in flight
    served: float = 0.0  # decayed count of dispatches, as of ``at``
    at: float = 0.0


@dataclass(slots=True, eq=False)
class _Backend:
    flows: dict[str, _Flow] = field(default_factory=dict)
    total: int = 0  # requests in flight


@dataclass(slots=True, eq=False)
class FlowSeat:
    """One request in flight, counted for its flow until ``Shares.release``; ``under``: its
    flow was under its fair share when it was admitted (``priority.py`` ranks it so)."""

    backend: _Backend
    flow: str
    under: bool = True


class Shares:
    """Dispatches and requests in flight per backend and flow (see the module docstring)."""

    def __init__(
        self,
        slack: int = 1,
        tau: float = TAU,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backends: dict[str, _Backend] = {}
        self.slack = slack  # seats past its in-flight share a flow may hold (the guard)
        self.tau = tau
        self.clock = clock

    def take(self, key: str, flow: str, weight: int, under: bool = True) -> FlowSeat:
        """Count a dispatch of ``flow`` to backend ``key`` and its seat until ``release``."""
        now = self.clock()
        backend = self.backends.get(key)
        if backend is None:  # (and forget the backends no request goes to any more)
            for other_key, other in list(self.backends.items()):
                self._prune(other_key, other, now)
            backend = self.backends[key] = _Backend()
        state = backend.flows.get(flow)
        if state is None:
            state = backend.flows[flow] = _Flow(weight)
        state.served = self._decayed(state, now) + 1.0
        state.at = now
        state.weight = weight
        state.inflight += 1
        backend.total += 1
        return FlowSeat(backend, flow, under)

    def release(self, seat: FlowSeat) -> None:
        backend = seat.backend
        state = backend.flows.get(seat.flow)
        if state is None or state.inflight <= 0:
            return  # released twice: keep the counts right
        state.inflight -= 1
        backend.total -= 1

    def in_flight(self, key: str, flow: str) -> int:
        backend = self.backends.get(key)
        state = backend.flows.get(flow) if backend is not None else None
        return state.inflight if state is not None else 0

    def held(self) -> int:
        """Requests in flight over every backend (0 once every seat is released)."""
        return sum(backend.total for backend in self.backends.values())

    def served(self, key: str, flow: str) -> float:
        """``flow``'s decayed count of dispatches to ``key`` now."""
        backend = self.backends.get(key)
        state = backend.flows.get(flow) if backend is not None else None
        return self._decayed(state, self.clock()) if state is not None else 0.0

    def under(self, key: str, flow: str, weight: int, queue: FlowQueue | None) -> bool:
        """Whether ``flow`` (weight ``weight``) is under its fair share of ``key``'s recent
        dispatches and within its in-flight share plus the slack, counting the flows waiting
        in ``queue``'s Critical and Default bands as active."""
        backend = self.backends.get(key)
        if backend is None:
            return True
        served = self._prune(key, backend, self.clock())
        mine = backend.flows.get(flow)
        if mine is None:
            return True
        weights = {name: state.weight for name, state in backend.flows.items()}
        if queue is not None:
            for band in queue.served_bands():
                for name, waiting in band.flows.items():
                    weights.setdefault(name, waiting.weight)
        weights[flow] = weight
        total_weight = sum(weights.values())
        if served[flow] * total_weight >= sum(served.values()) * weight:
            return False
        # The slot-hog guard: in flight below its share of the seats plus the slack.
        return mine.inflight * total_weight < (backend.total * weight + self.slack * total_weight)

    def _decayed(self, state: _Flow, now: float) -> float:
        if now <= state.at:
            return state.served
        return state.served * math.exp((state.at - now) / self.tau)

    def _prune(self, key: str, backend: _Backend, now: float) -> dict[str, float]:
        """Forget the flows with nothing in flight whose count has decayed away; the decayed
        counts of the flows kept."""
        served: dict[str, float] = {}
        for name, state in list(backend.flows.items()):
            count = self._decayed(state, now)
            if state.inflight or count >= FORGET:
                served[name] = count
            else:
                del backend.flows[name]
        if not backend.flows and self.backends.get(key) is backend:
            del self.backends[key]
        return served
