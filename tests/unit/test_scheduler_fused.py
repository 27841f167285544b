"""The fused scheduling path (scheduler/fused.py) against the general one: the same candidates,
bit-identical totals, the same prefix match handed to ``on_pick``, the same picks."""

from __future__ import annotations

import random

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplane.gateway.discovery import Endpoint
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.config import DEFAULT_CONFIG, build_scheduler
from llmplane.gateway.scheduler.framework import SchedulingContext
from llmplane.gateway.scheduler.prefix import PrefixCacheScorer, block_hashes

NOW = 1_000.0
PREFIXES = [bytes([65 + i]) * 64 * 3 for i in range(4)]  # 3 blocks each

row = st.tuples(
    st.sampled_from([None, frozenset({"m"}), frozenset({"other"}), frozenset({"m", "x"})]),
    st.sampled_from([None, True, False]),  # has_load_metrics
    st.sampled_from([0.0, NOW, NOW - 0.1, NOW - 0.2, NOW - 0.3]),  # scraped_at
    st.integers(0, 12),  # waiting
    st.integers(0, 12),  # inflight
    st.integers(0, 12),  # inflight_at_scrape
    st.sampled_from([-0.5, 0.0, 0.3, 0.7, 1.0, 1.5]),  # kv_usage
    st.booleans(),  # has_kv
    st.sampled_from([0.0, 0.0, 1.0, 2.5, 4.0, 9.0, 30.0]),  # room (registry.scraped_room)
)


def _states(rows: list[tuple]) -> list[EndpointState]:
    states = []
    for i, (served, load, scraped, waiting, inflight, at_scrape, kv, has_kv, *room) in enumerate(
        rows
    ):
        s = EndpointState(Endpoint(f"10.0.0.{i}:8000", {}, "m"))
        s.served_models, s.has_load_metrics, s.scraped_at = served, load, scraped
        s.waiting, s.inflight, s.inflight_at_scrape = float(waiting), inflight, at_scrape
        s.kv_usage, s.has_kv = kv, has_kv
        s.room = room[0] if room else 0.0
        states.append(s)
    return states


def _config(threshold: float, weights: tuple[float, float, float], filters: list[str]) -> dict:
    plugins = [dict(p) for p in DEFAULT_CONFIG["plugins"]]
    plugins[1] = {"type": "low-queue-filter", "parameters": {"threshold": threshold}}
    refs = [{"pluginRef": f} for f in filters] + [
        {"pluginRef": "prefix-cache-scorer", "weight": weights[0]},
        {"pluginRef": "least-request-scorer", "weight": weights[1]},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": weights[2]},
        {"pluginRef": "max-score-picker"},
    ]
    return {"plugins": plugins, "schedulingProfiles": [{"name": "default", "plugins": refs}]}


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(row, min_size=0, max_size=12),
    threshold=st.sampled_from([0, 1, 3, 5, 10]),
    weights=st.sampled_from([(3, 2, 1), (1, 1, 1), (0, 2, 0.5), (2.5, 0, 3)]),
    filters=st.sampled_from(
        [
            ["model-served-filter", "low-queue-filter"],
            ["low-queue-filter"],
            ["model-served-filter"],
            [],
        ]
    ),
    history=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 11), st.integers(0, 2))),
    prompt=st.tuples(st.integers(0, 4), st.binary(min_size=0, max_size=200)),
    seed=st.integers(0, 2**32),
)
def test_fused_path_equals_general_path(rows, threshold, weights, filters, history, prompt, seed):
    states = _states(rows)
    scheduler = build_scheduler(_config(threshold, weights, filters))
    profile = scheduler.profile(None)
    assert profile.fused is not None
    prefix = next(s for s, _ in profile.scorers if isinstance(s, PrefixCacheScorer))
    for k, i, blocks in history:  # the index learns some picks: partial and full matches
        if i < len(states):
            learned = SchedulingContext("m", PREFIXES[k][: 64 * (blocks + 1)], now=NOW)
            profile.on_pick(learned, states[i])
    head = PREFIXES[prompt[0]] if prompt[0] < len(PREFIXES) else b""
    general = SchedulingContext("m", head + prompt[1], now=NOW)
    fused = SchedulingContext("m", head + prompt[1], now=NOW)

    expected = profile.score(general, states)
    got = profile.fused.run(fused, states)
    if got is None:  # declined: a threshold <= 0, or some filter would be skipped
        conjunction = list(states)
        for f in profile.filters:
            conjunction = f.filter(general, conjunction)
        assert (threshold <= 0 and "low-queue-filter" in filters) or not conjunction
        return
    kept, totals = got
    assert [id(s) for s in kept] == [id(s) for s in expected[0]]
    assert totals == expected[1]  # exactly: the same floats in the same order
    assert fused.cache.get(prefix) == general.cache.get(prefix)  # what on_pick reads

    random.seed(seed)
    picked = profile.run(fused, states, 3)
    random.seed(seed)
    profile_general = build_scheduler(_config(threshold, weights, filters)).profile(None)
    profile_general.fused = None
    profile_general.scorers[0][0].index = prefix.index
    reference = profile_general.run(general, states, 3)
    assert [s.key for s in picked.endpoints] == [s.key for s in reference.endpoints]
    assert picked.scores == reference.scores


def test_fused_path_runs_for_the_default_profile_and_declines_when_a_filter_would_be_skipped():
    states = _states([(None, True, NOW, 1, 1, 0, 0.2, True), (None, True, NOW, 2, 0, 0, 0.9, True)])
    profile = build_scheduler().profile(None)
    ctx = SchedulingContext("m", b"", now=NOW)
    got = profile.fused.run(ctx, states)
    assert got is not None and len(got[0]) == 2
    # Everyone's queue is over the threshold (5): the general path skips that filter.
    for s in states:
        s.waiting = 9.0
    assert profile.fused.run(ctx, states) is None
    assert len(profile.run(ctx, states, 2).endpoints) == 2


def test_profiles_of_another_shape_are_not_fused():
    queue_first = {
        "plugins": [{"type": "queue-scorer"}, {"type": "prefix-cache-scorer"}],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": "prefix-cache-scorer"}],
            }
        ],
    }
    assert build_scheduler(queue_first).profile(None).fused is None
    reordered = _config(5, (3, 2, 1), ["low-queue-filter"])
    refs = reordered["schedulingProfiles"][0]["plugins"]
    refs[1], refs[2] = refs[2], refs[1]  # least-request before prefix: summed in another order
    assert build_scheduler(reordered).profile(None).fused is None


def test_block_hashes_are_the_xxh64_chain():
    prompt = bytes(range(256)) * 3 + b"tail"
    h = xxhash.xxh64_intdigest(b"m")
    chain = []
    for start in range(0, 768, 64):
        h = xxhash.xxh64(prompt[start : start + 64], seed=h).intdigest()
        chain.append(h)
    assert block_hashes(prompt, "m") == chain
    assert block_hashes(prompt, "m", max_blocks=5) == chain[:5]
