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

    def __post_init__(self) -> None:
        self.capacity = float(self.endpoint.max_num_seqs)  # configured, else learned

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
    before reported requests waiting too; ``configured``: the engine's ``max_num_seqs`` if
    known (0: not known).

    The capacity is the concurrency the engine was seen to hold without queueing: with
    requests waiting, what it runs (its ``max_num_seqs``, or less when its KV cache is the
    limit: the estimate follows it down); with none waiting, at least what it runs and every
    request this gateway had in flight (none of them waits), so it grows by what admission
    lets through beyond the last figure until the engine queues. vLLM and the sim count a
    request as waiting until their next step schedules it, so one scrape's waiting requests
    may have just arrived while slots are free: the capacity goes down to what the engine
    runs only when requests still wait at the next scrape too, and never below
    ``configured`` (an engine whose KV cache is the limit is caught by the KV rule). The room
    is the capacity minus what the engine holds now (0 while anything waits): the requests
    sent after this scrape that it starts at once. Unknown (0) capacity leaves no room,
    which is the estimate without it: a burst onto an engine not yet seen busy counts as
    waiting."""
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
    report, summed over scrapes in a row (any request reported running or waiting ends the
    run), capped at ``UNSEEN_LOAD``. From ``UNSEEN_LOAD`` on the engine is scheduled as one
    without load metrics (``has_load_metrics`` False: the queue estimate is the in-flight
    count, saturated at ``saturation_inflight``) until a scrape reports a request.

    An OpenAI-compatible server whose ``/metrics`` has vLLM's gauges at 0 whatever it serves
    (a proxy, a stand-in, nginx answering a fixed completion) would otherwise look like an
    engine that never queues and never holds more than this gateway had in flight at a
    scrape: ``scraped_room`` learns its capacity only from that, so a closed loop of clients
    kept it saturated and most requests waited in flow control. A real engine reports what it
    runs: a request it has not received yet (in transit, being tokenized) or has finished but
    not yet answered is missing from its gauges for a few milliseconds, which a scrape may
    catch for one or two requests, never for 32 over consecutive scrapes while it is loaded
    (and a loaded engine reports running requests at almost every scrape)."""
    if running > 0 or waiting > 0:
        return 0
    unseen += sent
    return unseen if unseen < UNSEEN_LOAD else UNSEEN_LOAD


def queue_estimates(states: Sequence[EndpointState], staleness: float, now: float) -> list[float]:
    """Each endpoint's queue: the waiting requests its engine last reported, moved by the net
    change in this gateway's in-flight count since that report beyond the room the engine
    had then (``scraped_room``), never below 0 (optimistic accounting: a burst between two
    scrapes counts at once once the room is used, and requests that already finished stop
    counting, so a fast replica is not taken for a loaded one). With metrics missing or older
    than ``staleness`` seconds, the in-flight count. One list comprehension over the fields
    (no method call per endpoint): the scheduler's hottest loop."""
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
