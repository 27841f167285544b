"""The flow-control queue as a data structure: priority bands, fair flows, bounds, eviction
(the rules: docs/gateway.md, "Flow control").

No I/O and no clock of its own: ``FlowQueue`` holds ``Waiter`` objects (whatever the caller
hangs on them) and answers three questions: may this one wait (``offer``: it may, and these
lower-band waiters are evicted for it; or it may not), which one goes next (``pop``), and take
this one out (``remove``: a TTL, a client that left).

A band is an InferenceObjective's integer priority, higher first, numbered ``1 - priority`` so
that the criticalities Critical (1), Default (0) and Sheddable (-1) are bands 0, 1 and 2, lower
served first; any negative priority is sheddable, as in llm-d. Inside a band, flows (tenants)
take turns by smooth weighted round-robin; inside a flow, arrival order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

BANDS = ("Critical", "Default", "Sheddable")  # highest priority first
BAND = {name: index for index, name in enumerate(BANDS)}
BAND["Standard"] = BAND["Default"]  # upstream's name for the middle band
DEFAULT_BAND = BAND["Default"]
SHEDDABLE_BAND = BAND["Sheddable"]  # this band and those after it are sheddable (priority < 0)

# A request's level: a criticality name, or an InferenceObjective's integer priority.
Level = str | int


def band_of(level: Level) -> int:
    """The band of a criticality (unknown names: Default) or an integer priority."""
    if isinstance(level, str):
        return BAND.get(level, DEFAULT_BAND)
    return 1 - level


def band_name(band: int) -> str:
    """The band's metric label: its criticality's name, else ``priority:<n>``."""
    return BANDS[band] if 0 <= band < len(BANDS) else f"priority:{1 - band}"


@dataclass(slots=True, eq=False)
class Waiter:
    """One request waiting: its band, flow (tenant), body size and arrival time."""

    band: int
    flow: str
    size: int
    queued_at: float
    future: Any = None  # what the caller resumes the request with
    timer: Any = None  # its TTL timer handle (the caller's)
    granted: bool = False  # popped for dispatch


@dataclass(slots=True, eq=False)
class Flow:
    """One tenant's waiters inside a band, and its smooth-weighted-round-robin credit."""

    name: str
    weight: int
    current: int = 0
    waiters: deque[Waiter] = field(default_factory=deque)


@dataclass(slots=True, eq=False)
class Band:
    flows: dict[str, Flow] = field(default_factory=dict)  # only flows with waiters
    count: int = 0
    bytes: int = 0

    def push(self, waiter: Waiter, weight: int) -> None:
        flow = self.flows.get(waiter.flow)
        if flow is None:
            flow = self.flows[waiter.flow] = Flow(waiter.flow, weight)
        else:
            flow.weight = weight  # the tenant's latest weight
        flow.waiters.append(waiter)
        self.count += 1
        self.bytes += waiter.size

    def pop(self) -> Waiter:
        """The next waiter by smooth weighted round-robin between flows (nginx's: each flow
        gains its weight, the richest goes and pays the total)."""
        total = 0
        flow: Flow | None = None
        for f in self.flows.values():
            f.current += f.weight
            total += f.weight
            if (
                flow is None
                or f.current > flow.current
                or (f.current == flow.current and len(f.waiters) < len(flow.waiters))
            ):
                flow = f  # a tie goes to the flow with fewer waiting: the smaller caller
        assert flow is not None
        flow.current -= total
        waiter = flow.waiters.popleft()
        self._took(flow, waiter)
        return waiter

    def remove(self, waiter: Waiter) -> bool:
        flow = self.flows.get(waiter.flow)
        if flow is None:
            return False
        try:
            flow.waiters.remove(waiter)
        except ValueError:
            return False
        self._took(flow, waiter)
        return True

    def victim(self) -> Waiter:
        """The waiter to evict: the newest of the flow with the most waiters."""
        flow = max(self.flows.values(), key=lambda f: len(f.waiters))
        waiter = flow.waiters.pop()
        self._took(flow, waiter)
        return waiter

    def _took(self, flow: Flow, waiter: Waiter) -> None:
        self.count -= 1
        self.bytes -= waiter.size
        if not flow.waiters:  # a flow that comes back starts a fresh round
            del self.flows[flow.name]
            # So do the others: a flow that leaves takes its credit or debt with it, instead
            # of the flows left keeping the other side (the flow that was just served would
            # otherwise come back behind one more turn of a backlogged flow, every time).
            for other in self.flows.values():
                other.current = 0


@dataclass(frozen=True, slots=True)
class Limits:
    band_requests: int = 1000
    band_bytes: int = 64 * 1024 * 1024
    total_requests: int = 2000
    total_bytes: int = 128 * 1024 * 1024


class Full(Exception):
    """The newcomer may not wait; ``reason`` says which bound, ``code`` is the metric's
    reason label (``band_full`` or ``queue_full``)."""

    def __init__(self, reason: str, code: str = "queue_full") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class FlowQueue:
    """Waiters of one backend, in bands (see the module docstring)."""

    __slots__ = ("bands", "candidates", "granted", "limits")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        # Band number -> its waiters, highest priority (lowest number) first; bands once used
        # stay. The counts live in the bands; the queue's are their sums.
        self.bands: dict[int, Band] = {}
        self.granted = False  # a popped waiter has not taken its endpoint yet (caller's)
        self.candidates: Any = ()  # the endpoints the waiters wait for (caller's)

    @property
    def count(self) -> int:
        return sum(band.count for band in self.bands.values())

    @property
    def bytes(self) -> int:
        return sum(band.bytes for band in self.bands.values())

    def offer(self, waiter: Waiter, weight: int = 1) -> list[Waiter]:
        """Queue ``waiter`` (flow weight ``weight``); returns the waiters evicted for it.
        Raises ``Full`` (and changes nothing) when it may not wait."""
        lim = self.limits
        band = self.bands.get(waiter.band) or Band()
        if band.count >= lim.band_requests or band.bytes + waiter.size > lim.band_bytes:
            raise Full(f"the {band_name(waiter.band)} band is full", "band_full")
        if waiter.size > lim.total_bytes:
            raise Full("the request is larger than the whole queue")
        # What has to go from lower bands; refuse before evicting anything.
        lower = [b for n, b in self.bands.items() if n > waiter.band]
        if (
            sum(b.count for b in lower) < self.count + 1 - lim.total_requests
            or sum(b.bytes for b in lower) < self.bytes + waiter.size - lim.total_bytes
        ):
            raise Full("the queue is full")
        if waiter.band not in self.bands:
            self.bands = dict(sorted({**self.bands, waiter.band: band}.items()))
        evicted: list[Waiter] = []
        for b in reversed(lower):
            while b.count and (
                self.count + 1 > lim.total_requests or self.bytes + waiter.size > lim.total_bytes
            ):
                evicted.append(b.victim())
        band.push(waiter, weight)
        return evicted

    def pop(self) -> Waiter | None:
        """The next waiter to dispatch, or None."""
        for band in self.bands.values():
            if band.count:
                return band.pop()
        return None

    def remove(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out (TTL, client gone); False if it is no longer queued."""
        band = self.bands.get(waiter.band)
        return band is not None and band.remove(waiter)

    def lengths(self) -> dict[tuple[str, str], int]:
        """(band, flow) -> waiters, for the queue gauge."""
        return {
            (band_name(number), flow.name): len(flow.waiters)
            for number, band in self.bands.items()
            for flow in band.flows.values()
        }

    def served_bands(self) -> list[Band]:
        """The bands a reserve serves (not sheddable), highest first."""
        return [band for number, band in self.bands.items() if number < SHEDDABLE_BAND]
