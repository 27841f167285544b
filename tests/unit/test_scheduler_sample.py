"""Past SAMPLE_ABOVE candidates a pick scores a sample: what each scorer favours plus a random
part (``framework.Profile.sample``). Nothing the full scan would have found is lost: prefix
holders, a session's replica, an adapter's replicas, round-robin turns and idle replicas."""

from __future__ import annotations

from collections.abc import Sequence

from llmplane.gateway.discovery import Endpoint
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.config import build_scheduler
from llmplane.gateway.scheduler.framework import (
    SAMPLE,
    SAMPLE_ABOVE,
    Profile,
    SchedulingContext,
)
from llmplane.gateway.scheduler.plugins import (
    LeastRequestScorer,
    LoraAffinityScorer,
    MaxScorePicker,
    ModelServedFilter,
    QueueMarginFilter,
    RoundRobinScorer,
    SessionAffinityScorer,
)
from llmplane.gateway.scheduler.prefix import PrefixCacheScorer

NOW = 1000.0
FLEET = 1000


def fleet(n: int = FLEET) -> list[EndpointState]:
    states = []
    for i in range(n):
        s = EndpointState(Endpoint(f"10.0.{i // 250}.{i % 250}:8000", {}, "m"))
        s.has_load_metrics, s.scraped_at = True, NOW
        states.append(s)
    return states


def ctx(**kw) -> SchedulingContext:
    kw.setdefault("now", NOW)
    return SchedulingContext(kw.pop("model", "m"), **kw)


class Counting:
    """A scorer that scores nothing and records how many candidates it was given."""

    name = "counting"

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        self.sizes.append(len(endpoints))
        return [0.0] * len(endpoints)


def profile(*scorers, filters=()) -> Profile:
    return Profile("p", list(filters), [(s, 1.0) for s in scorers], MaxScorePicker())


def test_a_large_fleet_is_scored_on_a_sample_a_small_one_whole() -> None:
    counting = Counting()
    p = profile(counting)
    p.run(ctx(), fleet(), 4)
    p.run(ctx(), fleet(SAMPLE_ABOVE), 4)
    assert SAMPLE <= counting.sizes[0] < 2 * SAMPLE, counting.sizes
    assert counting.sizes[1] == SAMPLE_ABOVE


def test_the_prefix_holder_among_1000_is_found() -> None:
    states = fleet()
    holder = states[737]
    prefix = PrefixCacheScorer()
    prompt = b"a system prompt that one replica holds " * 20
    prefix.on_pick(ctx(prompt=prompt), holder)
    p = profile(prefix, LeastRequestScorer())
    for i in range(30):
        assert p.run(ctx(prompt=prompt + b"q%d" % i), states, 4).endpoints[0] is holder


def test_a_tie_among_more_holders_than_the_sample_takes_is_cut_at_random() -> None:
    states = fleet()
    prefix = PrefixCacheScorer()
    prompt = b"a system prompt that every replica holds " * 20
    for s in states:
        prefix.on_pick(ctx(prompt=prompt), s)
    favoured = [
        {e.key for e in prefix.favoured(ctx(prompt=prompt), states, SAMPLE)} for _ in range(20)
    ]
    assert all(len(f) == SAMPLE for f in favoured)
    assert len(set().union(*favoured)) > 4 * SAMPLE  # not the same first 64 every time


def test_the_sessions_replica_among_1000_is_found() -> None:
    states = fleet()
    session = SessionAffinityScorer()
    headers = {"x-session-id": "s1"}
    session.on_pick(ctx(headers=headers), states[411])
    p = profile(session)
    assert all(
        p.run(ctx(headers=headers), states, 4).endpoints[0] is states[411] for _ in range(30)
    )


def test_an_adapters_replicas_among_1000_are_found() -> None:
    states = fleet()
    for s in states:
        s.max_lora = 1
        s.lora_running = frozenset({"other"})
    running = {states[5].key, states[905].key}
    states[5].lora_running = states[905].lora_running = frozenset({"sql"})
    p = profile(LoraAffinityScorer())
    picks = {p.run(ctx(model="sql", lora=True), states, 4).endpoints[0].key for _ in range(30)}
    assert picks <= running, picks


def test_filters_narrow_the_whole_fleet_before_the_sample() -> None:
    states = fleet()
    for s in states:
        s.served_models = frozenset({"m"})
    serving = {s.key for s in states[::200]}  # 5 of 1,000 serve the adapter
    for s in states[::200]:
        s.served_models = frozenset({"m", "sql"})
    p = profile(LeastRequestScorer(), filters=[ModelServedFilter()])
    picks = {p.run(ctx(model="sql"), states, 1).endpoints[0].key for _ in range(30)}
    assert picks <= serving, picks


def test_round_robin_takes_its_turn_over_the_whole_fleet() -> None:
    states = fleet(300)
    p = profile(RoundRobinScorer())
    picks = [p.run(ctx(), states, 1).endpoints[0] for _ in range(300)]
    assert len({e.key for e in picks}) == 300


def test_load_is_spread_to_idle_replicas_though_only_a_sample_is_scored() -> None:
    states = fleet()
    for i, s in enumerate(states):
        s.inflight = 0 if i % 7 == 3 else 10  # a seventh of the fleet is idle
    scheduler = build_scheduler()
    for i in range(50):
        pick = scheduler.pick(ctx(prompt=b"question %d" % i), states, 4)
        assert pick.endpoints[0].inflight == 0, pick.scores


class CountingMargin(QueueMarginFilter):
    """The queue-margin filter, recording how many candidates it was given."""

    def __init__(self) -> None:
        super().__init__(margin=8)
        self.sizes: list[int] = []

    def filter(self, ctx: SchedulingContext, endpoints: list[EndpointState]) -> list[EndpointState]:
        self.sizes.append(len(endpoints))
        return super().filter(ctx, endpoints)


def test_a_relative_filter_runs_on_the_sample_and_still_drops_a_long_queue() -> None:
    """The queue margin compares candidates with the best among them: in a large fleet it sees
    the sample (whose best is about the best of all), after the filters that keep endpoints by
    what they serve; the prefix holder, favoured into the sample, is still passed over when its
    queue is past the margin."""
    states = fleet()
    for s in states:
        s.served_models = frozenset({"m"})
    holder = states[737]
    prefix = PrefixCacheScorer()
    prompt = b"a system prompt that one replica holds " * 20
    prefix.on_pick(ctx(prompt=prompt), holder)
    margin = CountingMargin()
    p = profile(prefix, filters=[margin, ModelServedFilter()])
    assert p.run(ctx(prompt=prompt + b"q"), states, 4).endpoints[0] is holder
    holder.waiting = 20.0  # past the margin (8) over the idle replicas
    assert p.run(ctx(prompt=prompt + b"r"), states, 4).endpoints[0] is not holder
    assert all(SAMPLE <= n < 2 * SAMPLE for n in margin.sizes), margin.sizes
    margin.sizes.clear()
    p.run(ctx(prompt=prompt + b"s"), states[:SAMPLE_ABOVE], 4)
    assert margin.sizes == [SAMPLE_ABOVE]  # a small fleet: every candidate, in its order
