"""The built-in default profile under load, with the approximate index and with the precise one:
the replica holding a request's 3,000-token prefix keeps it while its queue is a few requests
longer than the others, up to the margin of 64 requests (each of those is mostly a cache hit
there; a recompute elsewhere costs 3,000 tokens of prefill on that replica, slows its running
requests and evicts another group's prefix), and gives way once its queue is far beyond that
(bench/precise_routing.py: the old low-queue filter at 5 pushed requests off their prefix as
soon as every replica queued a little, and the fleet collapsed at 150 req/s; a margin of 16 did
so at 200 req/s)."""

from __future__ import annotations

import pytest

from llmplane.gateway.kvcache.events import Batch, Removed, Stored
from llmplane.gateway.kvcache.index import BlockIndex
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.config import build_scheduler
from llmplane.gateway.scheduler.framework import Scheduler, SchedulingContext
from llmplane.gateway.scheduler.precise_prefix import PrecisePrefixCacheScorer, use_in_default
from llmplane.runtime.endpoint import Endpoint
from tests.unit.token_source import Tokens

NOW = 1000.0
BS = 16
PREFIX, OWN = 3_000, 600  # tokens: the group's shared prompt and the user's own
REPLICAS = [f"10.0.0.{i}:8000" for i in range(1, 9)]
HOLDER = REPLICAS[0]


def fleet(holder_waiting: float) -> list[EndpointState]:
    """The holder busy (``holder_waiting`` queued, 30 running, KV nearly full), the seven
    others idle and cold, all freshly scraped."""
    states = []
    for address in REPLICAS:
        s = EndpointState(Endpoint(address, model_name="m", engine="sim"))
        s.has_load_metrics, s.scraped_at, s.has_kv = True, NOW, True
        if address == HOLDER:
            s.waiting, s.running, s.kv_usage = holder_waiting, 30.0, 0.95
            s.inflight = s.inflight_at_scrape = int(holder_waiting) + 30
            s.prefilling = int(holder_waiting)
        states.append(s)
    return states


def request(own: str) -> SchedulingContext:
    prompt = b"p" * (4 * PREFIX) + own.encode() * (4 * OWN // len(own))  # ~4 bytes a token
    return SchedulingContext("m", prompt, now=NOW)


def approximate() -> Scheduler:
    """The default without events: the approximate index learns the holder from a pick."""
    scheduler = build_scheduler()
    first = request("first user ")
    scheduler.profile(None).on_pick(first, fleet(0)[0])
    return scheduler


def precise() -> Scheduler:
    """The default while replicas publish: the holder reported the prefix's blocks."""
    scheduler = build_scheduler()
    index = BlockIndex()
    for address in REPLICAS:
        index.add_replica(address, "m")
    prompt = list(range(PREFIX + OWN))
    blocks = PREFIX // BS
    index.apply(HOLDER, Batch(0.0, [Stored(list(range(blocks)), None, prompt[:PREFIX], BS)]))
    scorer = PrecisePrefixCacheScorer()
    scorer.index, scorer.tokens = index, Tokens(prompt)
    use_in_default(scheduler, scorer, True)
    return scheduler


@pytest.mark.parametrize("make", [approximate, precise])
@pytest.mark.parametrize("waiting", [0, 6, 14, 30, 60])
def test_the_prefix_holder_keeps_its_requests_while_its_queue_is_a_few_longer(make, waiting):
    scheduler = make()
    for i in range(20):  # the picker breaks ties at random: never once elsewhere
        pick = scheduler.pick(request(f"user {i} "), fleet(waiting), 4)
        assert pick.endpoints[0].address == HOLDER, (waiting, pick.scores)


@pytest.mark.parametrize("make", [approximate, precise])
@pytest.mark.parametrize("waiting", [70, 100, 200])
def test_a_queue_far_beyond_the_cost_of_recomputing_sends_the_request_elsewhere(make, waiting):
    scheduler = make()
    for i in range(20):
        pick = scheduler.pick(request(f"user {i} "), fleet(waiting), 4)
        assert pick.endpoints[0].address != HOLDER, (waiting, pick.scores)


@pytest.mark.parametrize("make", [approximate, precise])
def test_under_even_load_the_margin_is_relative_to_the_shortest_queue(make):
    """Every replica queues (a saturated fleet): the holder keeps its requests at a queue of
    80 when the others have 20, and loses them at 90."""
    scheduler = make()
    for holder_waiting, kept in ((80, True), (90, False)):
        states = fleet(holder_waiting)
        for s in states[1:]:
            s.waiting, s.running, s.kv_usage, s.inflight, s.inflight_at_scrape = 20, 30, 0.9, 50, 50
        pick = scheduler.pick(request("another user "), states, 4)
        assert (pick.endpoints[0].address == HOLDER) is kept, (holder_waiting, pick.scores)


def test_a_group_evicted_everywhere_goes_back_where_it_was_sent() -> None:
    """With replicas publishing, a group whose blocks every replica has evicted goes back to
    the replica it was sent to (the approximate index's memory, the precise scorer's fallback),
    a few requests longer queue there notwithstanding: sent by load instead, each eviction
    would place the group again by the noise of the moment, and the fleet's groups drift
    together onto some replicas (bench/precise_routing.py --same-groups)."""
    scheduler = build_scheduler()
    index = BlockIndex()
    for address in REPLICAS:
        index.add_replica(address, "m")
    prompt = list(range(PREFIX + OWN))
    scorer = PrecisePrefixCacheScorer()
    scorer.index, scorer.tokens = index, Tokens(prompt)
    use_in_default(scheduler, scorer, True)
    first = request("first user ")
    chosen = scheduler.pick(first, fleet(0), 4).endpoints[0]
    scheduler.profile(None).on_pick(first, chosen)  # the gateway's part once it has sent it
    sent = chosen.address
    blocks = PREFIX // BS
    index.apply(sent, Batch(0.0, [Stored(list(range(blocks)), None, prompt[:PREFIX], BS)]))
    index.apply(sent, Batch(0.0, [Removed([0])]))  # the leading block: nothing held now
    for i in range(20):
        states = fleet(0)
        for s in states:
            if s.endpoint.address == sent:
                s.waiting, s.running, s.kv_usage, s.inflight = 4, 30, 0.9, 34
                s.inflight_at_scrape = s.prefilling = 34
        later = request(f"user {i} ")
        later.now = NOW + 1
        pick = scheduler.pick(later, states, 4)
        assert pick.endpoints[0].address == sent, (i, sent, pick.scores)
