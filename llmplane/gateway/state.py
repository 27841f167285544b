"""What the gateway knows about each endpoint: engine load, its own in-flight count, health.

One ``EndpointState`` per discovered address lives as long as the endpoint does; routing tables
are rebuilt around the same objects, so counters survive a reload.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from llmplane.gateway.discovery import Endpoint


@dataclass(eq=False, slots=True)
class EndpointState:
    endpoint: Endpoint
    # Engine metrics (None until scraped; ``has_load_metrics`` False for engines without any).
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    has_kv: bool = False
    lora_running: frozenset[str] = frozenset()
    lora_waiting: frozenset[str] = frozenset()
    max_lora: int = 0
    scraped_at: float = 0.0  # monotonic time of the last good scrape; 0 = never
    has_load_metrics: bool | None = None  # None = not known yet
    scrape_ok: bool = True
    served_models: frozenset[str] | None = None  # from /v1/models; None = unknown
    # The gateway's own accounting.
    inflight: int = 0
    inflight_at_scrape: int = 0  # ``inflight`` when the last scrape was applied
    # Health.
    consecutive_failures: int = 0
    ejected_until: float = 0.0
    ejections: int = 0
    probation: bool = False
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.endpoint.address

    @property
    def key(self) -> str:
        return self.endpoint.address

    def metrics_fresh(self, staleness: float, now: float | None = None) -> bool:
        if not self.has_load_metrics or not self.scraped_at:
            return False
        return ((now if now is not None else time.monotonic()) - self.scraped_at) <= staleness

    def queue_estimate(self, staleness: float, now: float | None = None) -> float:
        """Waiting requests as the engine reported them, moved by the net change in this
        gateway's in-flight count since that report (optimistic accounting: a burst between
        two scrapes counts at once, and requests that already finished stop counting, so a
        fast replica is not taken for a loaded one); the in-flight count when metrics are
        missing or stale."""
        if self.metrics_fresh(staleness, now):
            return max(0.0, self.waiting + self.inflight - self.inflight_at_scrape)
        return float(self.inflight)

    def ejected(self, now: float) -> bool:
        return self.ejected_until > now


class EndpointRegistry:
    """Endpoint states by address, synchronised with a discovery's list."""

    def __init__(self) -> None:
        self.states: dict[str, EndpointState] = {}

    def sync(self, endpoints: list[Endpoint]) -> tuple[list[EndpointState], list[EndpointState]]:
        """Adopt the new list; returns (added, removed) states."""
        new: dict[str, EndpointState] = {}
        added: list[EndpointState] = []
        for endpoint in endpoints:
            state = self.states.get(endpoint.address)
            if state is None:
                state = EndpointState(endpoint)
                added.append(state)
            else:
                state.endpoint = endpoint  # labels may have changed
            new[endpoint.address] = state
        removed = [s for a, s in self.states.items() if a not in new]
        self.states = new
        return added, removed
