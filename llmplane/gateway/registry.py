"""What the gateway knows about each endpoint: engine load, its own in-flight count, health.

One ``EndpointState`` per discovered address lives as long as the endpoint does; routing tables
are rebuilt around the same objects, so counters survive a reload.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llmplane.runtime.endpoint import Endpoint


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
    # None = not known yet; False also for an engine whose gauges do not show this gateway's
    # load (``unseen_load``).
    has_load_metrics: bool | None = None
    # Requests this gateway had in flight, summed over the last scrapes in a row whose engine
    # reported none running or waiting (``unseen_load``).
    unseen: int = 0
    scrape_ok: bool = True
    served_models: frozenset[str] | None = None  # from /v1/models; None = unknown
    # The engine's prefix-cache counters in prompt tokens (console and /metrics only).
    prefix_hits: float = 0.0
    prefix_queries: float = 0.0
    # The engine's KV block size in tokens (0 = not reported).
    block_size: int = 0
    # Prompt tokens whose KV the engine took over its KV connector (-1: not reported).
    kv_received: float = -1.0
    # The engine's time to first token, seconds (-1: not reported; ``observe_ttft``), and its
    # histogram's (sum, count) at the last scrape.
    ttft: float = -1.0
    ttft_seen: tuple[float, float] = (-1.0, -1.0)
    # The gateway's own accounting.
    inflight: int = 0
    inflight_at_scrape: int = 0  # ``inflight`` when the last applied scrape was sent
    # How many requests the engine holds at once without queueing (0 = not known yet: the
    # endpoint's configured ``max_num_seqs``, then learned from scrapes, ``scraped_room``) and
    # how many more it had room for at the last scrape.
    capacity: float = 0.0
    room: float = 0.0
    # Streams this gateway sent that have not yet answered their first chunk: in the engine's
    # queue or in prefill (``saturation_max_prefilling``); every worker's sum, as ``inflight``.
    prefilling: int = 0
    # Prompt tokens (estimated) of the requests this gateway sent that have not answered their
    # first byte: the prefill work it has queued there (every worker's sum, as ``inflight``).
    prefill_tokens: int = 0
    # Health.
    consecutive_failures: int = 0
    ejected_until: float = 0.0
    ejections: int = 0
    probation: bool = False
    extra: dict[str, object] = field(default_factory=dict)
    # ``endpoint.address``, the registry's key for this state (so it never changes): a plain
    # field, read for every candidate in every pick.
    address: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.capacity = float(self.endpoint.max_num_seqs)  # configured, else learned
        self.address = self.endpoint.address

    @property
    def key(self) -> str:
        """The name scorers keep per endpoint: its address."""
        return self.address

    def metrics_fresh(self, staleness: float, now: float | None = None) -> bool:
        if not self.has_load_metrics or not self.scraped_at:
            return False
        return ((now if now is not None else time.monotonic()) - self.scraped_at) <= staleness

    def queue_estimate(self, staleness: float, now: float | None = None) -> float:
        """See ``queue_estimates``."""
        return queue_estimates((self,), staleness, time.monotonic() if now is None else now)[0]

    def kv_estimate(self) -> float:
        """KV use now: the last scrape's, less the share of the requests that finished since
        then beyond those the engine had waiting (they take the freed blocks first). A finished
        request's blocks are free in the engine at once; without this the saturation rule held
        a waiting request until the next scrape although the gateway saw a slot free (optimistic
        accounting, as ``queue_estimates``: requests sent since then count there)."""
        freed = self.inflight_at_scrape - self.inflight - self.waiting
        running = self.running
        if freed <= 0 or running <= 0:
            return self.kv_usage
        return self.kv_usage * (running - freed) / running if freed < running else 0.0

    def observe_ttft(self, total: float, count: float, busy: bool) -> None:
        """The engine's time-to-first-token histogram (``_sum``, ``_count``) at a scrape: the
        mean of the first tokens since the last scrape; none since then, the last mean is held
        while the engine is ``busy`` and 0 once it is idle (so a reading never lingers to block
        scale-down); counters that went back (a restart) start again from 0."""
        last_total, last_count = self.ttft_seen
        self.ttft_seen = (total, count)
        if 0 <= last_count < count and total >= last_total:
            self.ttft = (total - last_total) / (count - last_count)
        elif not busy or self.ttft < 0 or count < last_count:
            self.ttft = 0.0

    def keep_fresh(self, now: float) -> bool:
        """Take the last scrape's figures as read at ``now`` if nothing was sent to the engine
        since (it is as idle as it was): the idle tickers' rule, in the scraping worker and
        its followers. True if they were."""
        if self.inflight != self.inflight_at_scrape or not 0 < self.scraped_at < now:
            return False
        self.scraped_at = now
        return True

    def ejected(self, now: float) -> bool:
        return self.ejected_until > now

    def add_inflight(self, n: int) -> None:
        """Count ``n`` more (or fewer) requests in flight to the endpoint: the one way to move
        ``inflight`` (with several workers it is every worker's sum, see
        ``llmplane/gateway/workers/inflight.py``)."""
        self.inflight += n

    def add_prefilling(self, n: int) -> None:
        """Count ``n`` more (or fewer) streams waiting for their first chunk (shared by the
        workers like ``add_inflight``)."""
        self.prefilling += n

    def add_prefill_tokens(self, n: int) -> None:
        """Count ``n`` more (or fewer) prompt tokens waiting for their first byte (shared by
        the workers like ``add_inflight``)."""
        self.prefill_tokens += n


def scraped_room(
    capacity: float,
    waiting: float,
    running: float,
    sent: int,
    waited: bool = False,
    configured: float = 0.0,
) -> tuple[float, float]:
    """(capacity, room) after a scrape that reported ``waiting`` and ``running``, sent while
    this gateway had ``sent`` requests in flight to the endpoint; ``waited``: the scrape
    before reported requests waiting too; ``configured``: the engine's ``max_num_seqs`` (0:
    not known). The capacity is the concurrency the engine was seen to hold without queueing
    (vLLM does not report its ``max_num_seqs``); one scrape's waiting requests may have just
    arrived while slots are free, so it goes down only when requests still wait at the next
    scrape, never below ``configured``. The room is the capacity minus what the engine holds
    (0 while anything waits). Why and how: docs/gateway.md, "Queue estimate"."""
    held = running if running > sent else float(sent)
    if waiting > 0:
        seen = running if running > configured else configured
        if waited or seen > capacity:
            capacity = seen
        return capacity, 0.0
    capacity = capacity if capacity > held else held
    return capacity, capacity - held


# ``unseen`` from which an engine's gauges are taken not to show this gateway's load.
UNSEEN_LOAD = 32


def unseen_load(unseen: int, waiting: float, running: float, sent: int) -> int:
    """``unseen`` after a scrape that reported ``waiting`` and ``running``, sent while this
    gateway had ``sent`` requests in flight to the endpoint: the requests the engine did not
    report, summed over scrapes in a row (a request reported ends the run), capped at
    ``UNSEEN_LOAD``, from which the engine is scheduled as one without load metrics until a
    scrape reports a request. A server whose gauges stay at 0 whatever it serves (a proxy, a
    stand-in) would otherwise look like an engine that never queues; a real one misses a
    request or two for milliseconds, never 32 in a row while loaded (docs/gateway.md, "Gauges
    that do not show the load")."""
    if running > 0 or waiting > 0:
        return 0
    unseen += sent
    return unseen if unseen < UNSEEN_LOAD else UNSEEN_LOAD


def queue_estimates(states: Sequence[EndpointState], staleness: float, now: float) -> list[float]:
    """Each endpoint's queue: the waiting requests its engine last reported, moved by the net
    change in this gateway's in-flight count since that report beyond the room the engine
    had then (``scraped_room``), never below 0 (docs/gateway.md, "Queue estimate"); with
    metrics missing or older than ``staleness`` seconds, the in-flight count."""
    oldest = now - staleness
    return [
        (q if (q := s.waiting - s.room + s.inflight - s.inflight_at_scrape) > 0 else 0.0)
        if s.has_load_metrics and s.scraped_at and s.scraped_at >= oldest
        else float(s.inflight)
        for s in states
    ]


class EndpointRegistry:
    """Endpoint states by address, synchronised with a discovery's list."""

    def __init__(self, make_state: Callable[[Endpoint], EndpointState] = EndpointState) -> None:
        self.states: dict[str, EndpointState] = {}
        self.make_state = make_state  # shared in-flight counts with several workers

    def sync(self, endpoints: list[Endpoint]) -> tuple[list[EndpointState], list[EndpointState]]:
        """Adopt the new list; returns (added, removed) states."""
        new: dict[str, EndpointState] = {}
        added: list[EndpointState] = []
        for endpoint in endpoints:
            state = self.states.get(endpoint.address)
            if state is None:
                state = self.make_state(endpoint)
                added.append(state)
            else:
                state.endpoint = endpoint  # labels may have changed
            new[endpoint.address] = state
        removed = [s for a, s in self.states.items() if a not in new]
        self.states = new
        return added, removed
