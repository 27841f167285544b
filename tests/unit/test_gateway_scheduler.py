"""Scheduler plugins, the prefix index, configuration and engine-metric parsing (pure)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplane.gateway.discovery import Endpoint
from llmplane.gateway.registry import EndpointState, queue_estimates
from llmplane.gateway.scheduler.config import DEFAULT_CONFIG, ConfigError, build_scheduler
from llmplane.gateway.scheduler.framework import Profile, SchedulingContext
from llmplane.gateway.scheduler.plugins import (
    KVCacheScorer,
    LeastRequestScorer,
    LoraAffinityScorer,
    LowQueueFilter,
    MaxScorePicker,
    ModelServedFilter,
    QueueMarginFilter,
    QueueScorer,
    RoundRobinScorer,
    SessionAffinityScorer,
    WeightedRandomPicker,
)
from llmplane.gateway.scheduler.prefix import PrefixCacheScorer, PrefixIndex, block_hashes
from llmplane.gateway.scraper import parse_metrics

NOW = 1000.0


def state(i, **kw):
    s = EndpointState(Endpoint(f"10.0.0.{i}:8000", {}, "m"))
    s.has_load_metrics = True
    s.scraped_at = NOW
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def ctx(**kw):
    kw.setdefault("now", NOW)
    return SchedulingContext(kw.pop("model", "m"), **kw)


def test_queue_scorer_min_max_and_optimistic_accounting():
    a, b, c = state(1, waiting=0), state(2, waiting=4), state(3, waiting=8)
    assert QueueScorer().score(ctx(), [a, b, c]) == [1.0, 0.5, 0.0]
    a.inflight = 8  # sent since the scrape: counts as queued at once
    assert QueueScorer().score(ctx(), [a, b, c]) == [0.0, 1.0, 0.0]
    a.inflight = 0  # ... and stops counting when those requests have finished
    assert QueueScorer().score(ctx(), [a, b, c]) == [1.0, 0.5, 0.0]
    b.inflight_at_scrape = 4  # 4 requests b reported have finished since: its queue moved
    assert QueueScorer().score(ctx(), [a, b, c]) == [1.0, 1.0, 0.0]
    # Stale metrics: the gateway's own in-flight count.
    stale = state(4, waiting=0, scraped_at=NOW - 5, inflight=3)
    assert QueueScorer().score(ctx(), [stale, state(5, waiting=1)])[1] == 1.0
    assert QueueScorer().score(ctx(), [a, a]) == [1.0, 1.0]


def test_kv_and_least_request_scorers():
    a, b = state(1, kv_usage=0.2, has_kv=True), state(2, kv_usage=0.9, has_kv=True)
    assert KVCacheScorer().score(ctx(), [a, b]) == pytest.approx([0.8, 0.1])
    assert KVCacheScorer().score(ctx(), [state(3)]) == [0.5]  # no KV metric: neutral
    a.inflight, b.inflight = 2, 6
    assert LeastRequestScorer().score(ctx(), [a, b]) == [1.0, 0.0]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 12),  # waiting
            st.integers(0, 40),  # in flight
            st.integers(0, 12),  # in flight at the scrape
            st.sampled_from([NOW, NOW - 0.1, NOW - 5, 0.0]),  # scraped at (0: never)
            st.booleans(),  # has load metrics
        ),
        max_size=40,
    ),
    st.sampled_from([0.5, 1, 4, 10]),
)
def test_queue_filter_and_least_request_agree_with_their_definitions(rows, threshold):
    """The low-queue filter keeps exactly the endpoints whose ``queue_estimates`` value is
    below the threshold, the queue-margin filter those at most that far above the shortest,
    and the least-request scorer gives the min-max formula's scores."""
    states = []
    for i, (waiting, inflight, at_scrape, scraped_at, has_metrics) in enumerate(rows):
        states.append(
            state(i, waiting=float(waiting), inflight=inflight, inflight_at_scrape=at_scrape,
                  scraped_at=scraped_at, has_load_metrics=has_metrics)
        )  # fmt: skip
    queues = queue_estimates(states, 0.2, NOW)
    expected = [s for s, q in zip(states, queues, strict=True) if q < threshold]
    assert LowQueueFilter(threshold=threshold).filter(ctx(), states) == expected
    bound = min(queues, default=0.0) + threshold
    expected = [s for s, q in zip(states, queues, strict=True) if q <= bound]
    assert QueueMarginFilter(margin=threshold).filter(ctx(), states) == expected
    counts = [float(s.inflight) for s in states]
    lo, hi = min(counts, default=0.0), max(counts, default=0.0)
    formula = [1.0 if hi <= lo else (hi - v) / (hi - lo) for v in counts]
    assert LeastRequestScorer().score(ctx(), states) == pytest.approx(formula, abs=0)


def test_lora_affinity():
    active = state(1, lora_running=frozenset({"sql"}), max_lora=1)
    free = state(2, lora_running=frozenset(), max_lora=2)
    waiting = state(3, lora_running=frozenset({"x"}), lora_waiting=frozenset({"sql"}), max_lora=1)
    none = state(4, lora_running=frozenset({"x"}), max_lora=1)
    assert LoraAffinityScorer().score(ctx(model="sql"), [active, free, waiting, none]) == [
        1.0,
        0.8,
        0.6,
        0.0,
    ]


def test_model_served_filter():
    a = state(1, served_models=frozenset({"m", "sql"}))
    b = state(2, served_models=frozenset({"m"}))
    unknown = state(3)
    assert ModelServedFilter().filter(ctx(model="sql"), [a, b, unknown]) == [a, unknown]


def test_session_affinity_and_round_robin():
    a, b = state(1), state(2)
    s = SessionAffinityScorer()
    c = ctx(headers={"x-session-id": "abc"})
    assert s.score(c, [a, b]) == [0.0, 0.0]
    s.on_pick(c, b)
    assert s.score(c, [a, b]) == [0.0, 1.0]
    s.on_remove(b)
    assert s.score(c, [a, b]) == [0.0, 0.0]
    rr = RoundRobinScorer()
    picks = [rr.score(ctx(), [a, b]).index(1.0) for _ in range(4)]
    assert picks == [0, 1, 0, 1]


def test_pickers():
    a, b, c = state(1), state(2), state(3)
    assert MaxScorePicker().pick(ctx(), [a, b, c], [0.1, 0.9, 0.5], 2) == [b, c]
    ties = {MaxScorePicker().pick(ctx(), [a, b, c], [1.0, 1.0, 0.0], 1)[0].key for _ in range(100)}
    assert ties == {a.key, b.key}  # random tie-break
    firsts = [WeightedRandomPicker().pick(ctx(), [a, b], [1.0, 3.0], 2) for _ in range(4000)]
    assert all(len(f) == 2 for f in firsts)
    share = sum(f[0] is b for f in firsts) / len(firsts)
    assert 0.70 < share < 0.80
    assert all(WeightedRandomPicker().pick(ctx(), [a, b], [0.0, 1.0], 1) == [b] for _ in range(50))


def test_max_score_prefers_warm_among_ties_only():
    """Among equally scored endpoints, those ``prefer`` names come first (in random order);
    a higher score still wins over a warm connection; a large tie is only sampled."""
    picker = MaxScorePicker()
    warm = {3, 5}
    for _ in range(50):
        first, second = picker.order([1.0] * 8, 2, warm.__contains__)
        assert {first, second} == warm
    assert {picker.order([1.0] * 8, 1, warm.__contains__)[0] for _ in range(100)} == warm
    assert picker.order([1.0, 2.0, 1.0], 2, {0, 2}.__contains__)[0] == 1  # score first
    looked: list[int] = []
    picker.order([1.0] * 1000, 4, lambda i: looked.append(i) or False)
    assert len(looked) == 16  # WARM_LOOKS, not 1,000
    # Through a profile: the context's ``warm`` names addresses.
    a, b, c = state(1), state(2), state(3)
    scheduler = build_scheduler(None)
    warm_ctx = SchedulingContext("m", b"hi", now=NOW, warm={b.address}.__contains__)
    assert all(scheduler.pick(warm_ctx, [a, b, c], 1).endpoints == [b] for _ in range(30))


def test_block_hashes_chain_and_seed():
    prompt = b"a" * 64 * 3 + b"tail"
    h = block_hashes(prompt, "m")
    assert len(h) == 3 and len(set(h)) == 3  # chained: equal blocks, different hashes
    assert block_hashes(prompt, "other") != h  # seeded by the model
    assert block_hashes(b"b" * 64 + prompt[64:], "m")[1] != h[1]  # a hash names the whole prefix
    assert len(block_hashes(b"x" * 64 * 300, "m")) == 256
    assert block_hashes(b"short", "m") == []


def test_prefix_index_matches_consecutive_blocks_and_is_bounded():
    index = PrefixIndex(capacity=4)
    index.add("a", [1, 2, 3])
    index.add("b", [1, 9])
    assert index.matches([1, 2, 3, 4], {"a", "b", "c"}) == {"a": 3, "b": 1}
    assert index.matches([1, 2, 3], {"a"}) == {"a": 3}
    assert index.matches([7, 2, 3], {"a", "b"}) == {}  # stops at the first miss
    index.add("a", [5, 6])  # over capacity: the deepest block of the oldest chain goes first
    assert len(index.lrus["a"]) == 4
    assert index.matches([1, 2, 3], {"a", "b"}) == {"a": 2, "b": 1}
    index.add("a", [7, 8])  # then the rest of that chain, tail before head
    assert index.matches([1, 2, 3], {"a", "b"}) == {"b": 1}
    index.add("b", [1, 11, 12], held=1)  # the scorer's match: only block 1 is looked up
    assert list(index.lrus["b"]) == [9, 12, 11, 1]
    assert index.matches([1, 11, 12], {"b"}) == {"b": 3}
    index.remove("b")
    assert 1 not in index.holders and "b" not in index.lrus


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.lists(st.integers(0, 12), max_size=8)),
        max_size=30,
    ),
    st.lists(st.integers(0, 12), max_size=10),
    st.integers(1, 10),
)
def test_prefix_index_agrees_with_a_plain_lru(adds, query, capacity):
    """The bit-mask index (bulk LRU refresh, bisection over the running AND) against the
    obvious model: one ordered LRU per endpoint, count the leading blocks it holds."""
    index = PrefixIndex(capacity=capacity)
    model: dict[str, list[int]] = {}
    for endpoint, hashes in adds:
        index.add(endpoint, hashes)
        lru = model.setdefault(endpoint, [])
        for h in hashes:
            if h in lru:
                lru.remove(h)
        lru.extend(dict.fromkeys(reversed(hashes)))  # block 0 youngest
        del lru[: max(0, len(lru) - capacity)]
        assert list(index.lrus[endpoint]) == lru
    expected = {}
    for endpoint, lru in model.items():
        n = 0
        while n < len(query) and query[n] in lru:
            n += 1
        if n:
            expected[endpoint] = n
    assert index.matches(query, ["a", "b", "c", "d", "e"]) == expected


def test_prefix_scorer_learns_from_picks():
    scorer = PrefixCacheScorer(capacity=100)
    a, b = state(1), state(2)
    shared = b"system prompt " * 40  # 560 bytes: 8 blocks
    c1 = ctx(prompt=shared + b"question one")
    assert scorer.score(c1, [a, b]) == [0.0, 0.0]
    scorer.on_pick(c1, a)
    c2 = ctx(prompt=shared + b"question two, a longer one" * 10)
    scores = scorer.score(c2, [a, b])
    assert scores[1] == 0.0
    assert scores[0] == pytest.approx(8 / len(block_hashes(c2.prompt, "m")))
    # Lazy prompt: a callable is only called when a plugin needs it.
    calls = []
    lazy = SchedulingContext("m", lambda: calls.append(1) or b"x")
    QueueScorer().score(lazy, [a])
    assert calls == []
    assert lazy.prompt == b"x" and calls == [1]


def test_default_profile_prefers_prefix_holder_until_its_queue_is_far_longer():
    sched = build_scheduler()
    a, b = state(1), state(2)
    prompt = b"shared context " * 100
    pick = sched.pick(ctx(prompt=prompt), [a, b], 2)
    sched.profile(None).on_pick(ctx(prompt=prompt), pick.endpoints[0])
    holder, other = pick.endpoints
    for _ in range(20):
        assert sched.pick(ctx(prompt=prompt + b"q"), [a, b], 2).endpoints[0] is holder
    holder.kv_usage, holder.has_kv = 0.95, True
    other.kv_usage, other.has_kv = 0.0, True
    holder.waiting, other.waiting = 10, 0  # a few queued there: the prefix is worth the wait
    assert sched.pick(ctx(prompt=prompt + b"q"), [a, b], 2).endpoints[0] is holder
    holder.waiting = 100  # a queue far longer than the others': recomputing is sooner
    assert sched.pick(ctx(prompt=prompt + b"q"), [a, b], 2).endpoints[0] is other


def test_config_profiles_aliases_and_errors():
    config = {
        "plugins": [
            {"type": "queue"},
            {"type": "prefix-cache-scorer", "name": "pc", "parameters": {"blockSize": 16}},
            {"type": "random-picker"},
            {"type": "single-profile-handler"},
        ],
        "schedulingProfiles": [
            {"name": "fast", "plugins": [{"pluginRef": "queue", "weight": 1}]},
            {
                "name": "cache",
                "plugins": [{"pluginRef": "pc", "weight": 3}, {"pluginRef": "random-picker"}],
            },
        ],
    }
    sched = build_scheduler(config)
    assert sched.default == "fast"
    cache = sched.profile("cache")
    assert cache.scorers[0][0].block_size == 16 and cache.observers == [cache.scorers[0][0]]
    assert sched.profile("unknown") is sched.profile("fast")
    with pytest.raises(ConfigError, match="unknown plugin"):
        build_scheduler({"plugins": [{"type": "nope"}]})
    with pytest.raises(ConfigError, match="no plugin named"):
        build_scheduler(
            {"plugins": [], "schedulingProfiles": [{"name": "x", "plugins": [{"pluginRef": "y"}]}]}
        )


def test_filter_that_removes_everything_is_skipped():
    sched = build_scheduler()
    a = state(1, served_models=frozenset({"other"}))
    assert sched.pick(ctx(model="m"), [a], 1).endpoints == [a]


def test_a_profile_adds_its_scorers_scores_by_weight():
    a = state(1, kv_usage=0.2, has_kv=True, inflight=2)
    b = state(2, kv_usage=0.9, has_kv=True, inflight=6)
    c = state(3, kv_usage=0.5, has_kv=True, inflight=4)
    scorers = [(KVCacheScorer(), 2.0), (LeastRequestScorer(), 0.5), (QueueScorer(), 0.25)]
    profile = Profile("p", scorers=scorers, picker=MaxScorePicker())
    kept, totals = profile.score(ctx(), [a, b, c])
    want = [2.0 * 0.8 + 0.5 * 1.0 + 0.25 * 1.0, 2.0 * 0.1, 2.0 * 0.5 + 0.5 * 0.5 + 0.25 * 0.5]
    assert kept == [a, b, c] and totals == pytest.approx(want)
    pick = profile.run(ctx(), [a, b, c], 3)
    assert pick.endpoints == [a, c, b]
    assert pick.scores == {a.address: 2.35, c.address: 1.375, b.address: 0.2}


@pytest.mark.parametrize("profile", ["default", "least", "random"])
def test_one_candidate_is_picked_whether_a_filter_keeps_it_or_would_remove_it(profile):
    sched = build_scheduler(
        {
            "plugins": [
                *DEFAULT_CONFIG["plugins"],
                {"type": "random-picker"},
            ],
            "schedulingProfiles": [
                *DEFAULT_CONFIG["schedulingProfiles"],
                {
                    "name": "least",
                    "plugins": [
                        {"pluginRef": "least-request-scorer"},
                        {"pluginRef": "max-score-picker"},
                    ],
                },
                {"name": "random", "plugins": [{"pluginRef": "random-picker"}]},
            ],
        }
    )
    prof = sched.profile(profile)
    for kw in ({}, {"served_models": frozenset({"other"})}, {"waiting": 9, "inflight": 5}):
        a = state(1, **kw)
        pick = sched.pick(ctx(prompt=b"x" * 200), [a], 2, profile)
        assert pick.endpoints == [a] and pick.profile == profile
        assert pick.scores == {a.address: 0.0}
        kept, totals = prof.score(ctx(prompt=b"x" * 200), [a])
        assert kept == [a] and totals == [0.0]
        assert prof.picker.order(totals, 2) == [0]


VLLM_METRICS = b"""# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting_by_reason{reason="capacity"} 99.0
vllm:num_requests_running{model_name="m"} 7.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters=""} 100.0
vllm:lora_requests_info{max_lora="2",running_lora_adapters="c",waiting_lora_adapters="d"} 200.0
"""


def test_parse_vllm_metrics():
    m = parse_metrics(VLLM_METRICS, "vllm")
    assert (m.waiting, m.running, m.kv) == (5.0, 7.0, 0.25)  # summed; legacy KV name
    assert (m.lora_running, m.lora_waiting, m.max_lora) == ({"c"}, {"d"}, 2)  # newest line
    newer = VLLM_METRICS + b'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    assert parse_metrics(newer, "vllm").kv == 0.5


@pytest.mark.parametrize(
    ("engine", "text", "expected"),
    [
        (
            "sglang",
            b'sglang:num_queue_reqs{a="b"} 4\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\n',
            (4, 2, 0.5),
        ),
        (
            "llamacpp",
            b"llamacpp:requests_deferred 1\nllamacpp:requests_processing 3\nllamacpp:kv_cache_usage_ratio 0.1\n",
            (1, 3, 0.1),
        ),
        ("tgi", b"tgi_queue_size 6\ntgi_batch_current_size 9\n", (6, 9, None)),
        ("unknown-engine", b"tgi_queue_size 6\n", (6, None, None)),
    ],
)
def test_parse_other_engines(engine, text, expected):
    m = parse_metrics(text, engine)
    assert (m.waiting, m.running, m.kv) == expected
    assert m.any


def test_no_load_metrics():
    assert not parse_metrics(b"process_cpu_seconds_total 1\n", "vllm").any


def test_scheduling_is_fast_enough_to_measure_but_not_timed():
    # Not a timing assertion (never make speed a test): 64 endpoints and a 16k prompt run.
    sched = build_scheduler()
    states = [state(i, waiting=i % 5, kv_usage=0.1, has_kv=True) for i in range(64)]
    prompt = b"p" * 16_000
    c = ctx(prompt=prompt)
    pick = sched.pick(c, states, 4)
    sched.profile(None).on_pick(c, pick.endpoints[0])
    start = time.perf_counter()
    assert len(sched.pick(ctx(prompt=prompt), states, 4).endpoints) == 4
    assert time.perf_counter() - start >= 0


# llm-d's published EndpointPickerConfig (llm-d/llm-d-router deploy/config/epp-config.yaml).
LLM_D_EPP_CONFIG = """\
# Sample EPP configuration for running without P/D
#
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: decode-filter
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
"""


def test_llm_d_endpoint_picker_config_is_read(tmp_path) -> None:
    from llmplane.gateway.config import ConfigFileError, load_checked

    path = tmp_path / "epp-config.yaml"
    path.write_text(LLM_D_EPP_CONFIG)
    scheduler = build_scheduler(load_checked(path).scheduler)
    profile = scheduler.profiles["default"]
    assert [(type(s).__name__, w) for s, w in profile.scorers] == [("PrefixCacheScorer", 2.0)]
    assert type(profile.picker).__name__ == "MaxScorePicker"
    for wrong, where in (
        ("apiVersion: llm-d.ai/v1alpha1", "apiVersion: llm-d.ai/v2"),
        ("kind: EndpointPickerConfig", "kind: SchedulerConfig"),
    ):
        path.write_text(LLM_D_EPP_CONFIG.replace(wrong, where))
        with pytest.raises(ConfigFileError, match=where.split(":")[0]):
            load_checked(path)
