"""The ``prefill-cost`` scorer on constructed endpoint states: the replica holding the prefix
keeps the request until its queue costs more than recomputing the prefix elsewhere."""

from __future__ import annotations

import time

from llmplane.gateway.kvcache.events import Batch, Stored
from llmplane.gateway.kvcache.index import EXPECT_SECONDS, BlockIndex
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.framework import Profile, SchedulingContext
from llmplane.gateway.scheduler.plugins import MaxScorePicker
from llmplane.gateway.scheduler.precise_prefix import (
    PrecisePrefixCacheScorer,
    predicted_cached_tokens,
)
from llmplane.gateway.scheduler.prefill_cost import PENDING_PREFERENCE, PrefillCostScorer
from llmplane.gateway.scheduler.prefix import PrefixCacheScorer
from llmplane.gateway.scraper import apply_metrics, parse_metrics
from llmplane.runtime.endpoint import Endpoint
from tests.unit.token_source import Tokens

BS = 100
PROMPT = list(range(3_600))  # 36 blocks: a 3,000-token prefix and 600 of the user's own


def fleet(held_by_a: int = 3_000) -> tuple[PrefillCostScorer, list[EndpointState]]:
    index = BlockIndex()
    for r in ("a", "b"):
        index.add_replica(r, "m")
    blocks = held_by_a // BS
    index.apply("a", Batch(0.0, [Stored(list(range(blocks)), None, PROMPT[:held_by_a], BS)]))
    precise = PrecisePrefixCacheScorer()
    precise.index, precise.tokens = index, Tokens(PROMPT)
    states = [EndpointState(Endpoint(r, model_name="m", engine="sim")) for r in ("a", "b")]
    return PrefillCostScorer(prefix=precise), states


def loaded(state: EndpointState, waiting: float, now: float) -> None:
    """A fresh scrape that saw ``waiting`` requests queued."""
    state.waiting, state.running = waiting, 8.0
    state.has_load_metrics, state.scraped_at = True, now


def ctx(now: float) -> SchedulingContext:
    return SchedulingContext("m", b"", now=now)


def test_idle_replicas_score_by_what_they_must_compute() -> None:
    cost, (a, b) = fleet()
    assert cost.score(ctx(time.monotonic()), [a, b]) == [1.0, 600 / 3_600]


def test_affinity_holds_until_the_queue_costs_more_than_recomputing() -> None:
    cost, (a, b) = fleet()
    now = time.monotonic()
    first = ctx(now)
    cost.score(first, [a, b])
    cost.on_pick(first, a)  # requests sent to "a" compute 600 tokens each
    assert cost.per_request["a"] == 600
    now += EXPECT_SECONDS  # (the pick's own blocks no longer count as pending on "a")
    # 4 waiting on "a": 4 * 600 + 600 = 3,000 tokens of prefill ahead < 3,600 on idle "b".
    loaded(a, 4, now)
    assert cost.costs(ctx(now), [a, b]) == [3_000, 3_600]
    scores = cost.score(ctx(now), [a, b])
    assert scores[0] == 1.0 > scores[1]
    # 5 waiting: 3,600, a tie; 6 waiting: 4,200 > 3,600, "b" is sooner.
    loaded(a, 6, now)
    scores = cost.score(ctx(now), [a, b])
    assert scores[1] == 1.0 > scores[0]
    # The gateway's own streams awaiting their first token count when the scrape missed them.
    loaded(a, 0, now)
    a.prefilling = 6
    assert cost.costs(ctx(now), [a, b])[0] == 6 * 600 + 600


def test_without_token_ids_the_approximate_fractions_of_the_prompt_bytes_count() -> None:
    cost, (a, b) = fleet()
    cost.prefix.tokens = Tokens(None)
    fallback = PrefixCacheScorer(block_size=8)
    prompt = b"y" * 400  # 100 tokens at 4 bytes a token
    fallback.index.add("b", fallback.hashes(SchedulingContext("m", prompt)))
    cost.prefix.fallback = fallback
    scores = cost.score(SchedulingContext("m", prompt, now=time.monotonic()), [a, b])
    assert scores[1] == 1.0 > scores[0]


def test_the_scraper_reads_the_block_size() -> None:
    def body(block_size: str) -> bytes:
        return (
            "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\n"
            "vllm:prompt_tokens_total 5000\nvllm:prefix_cache_hits_total 1000\n"
            "vllm:request_prefill_time_seconds_sum 2.0\n"
            f'vllm:cache_config_info{{block_size="{block_size}",model_name="m"}} 1.0\n'
        ).encode()

    m = parse_metrics(body("128"), "vllm")
    assert (m.block_size, m.prefix_hits) == (128, 1000)
    state = EndpointState(Endpoint("a", model_name="m"))
    apply_metrics(state, m, time.monotonic())
    assert state.block_size == 128
    for hostile in ("0", "-16", "16.5", "1e9", "99999999", "x", ""):
        assert parse_metrics(body(hostile), "vllm").block_size == 0, hostile


def test_a_request_just_sent_is_pending_on_its_replica_until_its_events_or_the_time() -> None:
    cost, (a, b) = fleet(held_by_a=0)  # nothing reported anywhere yet
    now = time.monotonic()
    b.block_size = a.block_size = BS  # from the engines' metrics: keys before any event
    first = ctx(now)
    assert cost.score(first, [a, b]) == [1.0, 1.0]
    cost.on_pick(first, b)
    # The same prompt again before "b" reported it: predicted cached there (the access log),
    # not counted as cached by the cost (it may run beside the first and compute the blocks
    # too), but "b" is preferred among equal costs ...
    again = ctx(now + 1)
    assert cost.uncached(again, [a, b]) == [3_600, 3_600]
    assert predicted_cached_tokens(again, "b") == 3_500
    assert predicted_cached_tokens(again, "b", on_the_way=False) == 0
    assert cost.costs(again, [a, b]) == [3_600, 3_600 * (1 - PENDING_PREFERENCE * 3_500 / 3_600)]
    # ... and queued behind it there, the blocks will be cached by the time it runs.
    b.prefilling = 1
    behind = ctx(now + 1)
    assert cost.costs(behind, [a, b])[1] < 3_600
    assert predicted_cached_tokens(behind, "b") == 3_500
    expired = ctx(now + EXPECT_SECONDS + 1)
    assert cost.costs(expired, [a, b]) == [3_600, 3_600 + 3_600]
    cost.prefix.index.prune(now + EXPECT_SECONDS + 1)
    assert not cost.prefix.index.expected and not cost.prefix.index._expiries


def test_in_a_fleet_of_1000_the_replica_holding_the_prefix_is_found() -> None:
    # Past SAMPLE_ABOVE candidates only a sample is scored: the scorer's favourites (the
    # prefix's holders) must be in it, or a random 64 of 1,000 would miss "a" most times.
    cost, (a, _) = fleet()
    others = [f"r{i:03d}" for i in range(999)]
    for r in others:
        cost.prefix.index.add_replica(r, "m")
    states = [a, *(EndpointState(Endpoint(r, model_name="m", engine="sim")) for r in others)]
    profile = Profile("p", [], [(cost, 1.0)], MaxScorePicker())
    for _ in range(20):
        assert profile.run(ctx(time.monotonic()), states, 1).endpoints[0] is a
