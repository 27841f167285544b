"""The index of the engines' real blocks and the precise prefix scorer reading it."""

from __future__ import annotations

import tracemalloc

from llmplane.gateway.kvcache.events import Batch, Cleared, Removed, Stored
from llmplane.gateway.kvcache.index import (
    BYTES_PER_BLOCK,
    EXPECT_SECONDS,
    BlockIndex,
    block_keys,
    root_key,
)
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.config import PluginHandle, build_scheduler
from llmplane.gateway.scheduler.framework import SchedulingContext
from llmplane.gateway.scheduler.precise_prefix import (
    PROMPT_TOKENS,
    PrecisePrefixCacheScorer,
    predicted_cached_tokens,
    use_in_default,
)
from llmplane.gateway.scheduler.prefix import PrefixCacheScorer
from llmplane.gateway.tokenization.prefix import LeadingIds
from llmplane.runtime.endpoint import Endpoint
from tests.unit.token_source import Tokens

BS = 4
PROMPT = list(range(100, 124))  # 6 blocks


def stored(hashes, tokens, parent=None, lora=None, extra=None) -> Batch:
    return Batch(0.0, [Stored(list(hashes), parent, list(tokens), BS, lora, extra)])


def held(index: BlockIndex, tokens=PROMPT, lora=None) -> dict[str, int]:
    return index.matches("m", BS, block_keys(tokens, BS, root_key(lora)))


def index_with(*replicas: str) -> BlockIndex:
    index = BlockIndex()
    for r in replicas:
        index.add_replica(r, "m")
    return index


def test_keys_come_from_tokens_whatever_the_engines_hashes() -> None:
    index = index_with("a", "b")
    # Two engines with different hash seeds: different hashes for the same blocks.
    index.apply("a", stored([1, 2, 3], PROMPT[:12]))
    index.apply("b", stored([901, 902], PROMPT[:8]))
    index.apply("b", stored([903, 904], PROMPT[8:16], parent=902))  # a chain continued
    assert held(index) == {"a": 3, "b": 4}
    assert held(index, [*PROMPT[:4], 0, 0, 0, 0]) == {"a": 1, "b": 1}
    assert held(index, [7, *PROMPT[1:]]) == {}


def test_removals_name_engine_hashes_and_cut_the_leading_run() -> None:
    index = index_with("a")
    index.apply("a", stored([1, 2, 3, 4], PROMPT[:16]))
    index.apply("a", Batch(0.0, [Removed([3, 99])]))
    assert held(index) == {"a": 2}
    assert index.held("a") == 3
    index.apply("a", Batch(0.0, [Removed([1])]))
    assert held(index) == {}


def test_unknown_parents_lora_and_extra_keys_never_match_a_plain_request() -> None:
    index = index_with("a")
    index.apply("a", stored([5], PROMPT[4:8], parent=77))  # parent never seen
    assert index.orphans == 1 and index.held("a") == 0
    index.apply("a", stored([1, 2], PROMPT[:8], lora="ad"))
    assert held(index) == {}
    assert held(index, lora="ad") == {"a": 2}
    index.apply("a", stored([8, 9], PROMPT[:8], extra=[["salt"], None]))
    assert held(index) == {}


def test_cleared_and_removed_replicas_forget_only_their_blocks() -> None:
    index = index_with("a", "b")
    index.apply("a", stored([1, 2], PROMPT[:8]))
    index.apply("b", stored([1, 2], PROMPT[:8]))
    index.apply("a", Batch(0.0, [Cleared()]))
    assert held(index) == {"b": 2}
    index.remove_replica("b")
    assert held(index) == {}
    assert index.partitions["m"][BS] == {}
    assert index.sizes["m"] == 0


def test_runs_among_hundreds_of_replicas_and_reused_bits() -> None:
    """Masks wider than a machine word, freed bits taken by new replicas: every holder is
    found at its own run length (the walk reads the masks' holders a run length at a time)."""
    names = [f"r{i}" for i in range(300)]
    index = index_with(*names)
    want = {}
    for i, r in enumerate(names):
        if i % 7:  # r0, r7, ... hold nothing
            index.apply(r, stored(range(i * 10, i * 10 + i % 7), PROMPT[: 4 * (i % 7)]))
            want[r] = i % 7
    assert held(index) == want
    for r in names[::3]:  # their bits freed, then reused by new replicas holding everything
        index.remove_replica(r)
        want.pop(r, None)
    for i in range(50):
        index.add_replica(f"new{i}", "m")
        index.apply(f"new{i}", stored(range(5000 + i * 10, 5006 + i * 10), PROMPT))
        want[f"new{i}"] = 6
    assert held(index) == want
    assert max(index.replicas[f"new{i}"].bit for i in range(50)) < 300  # bits were reused


def test_the_bound_takes_the_oldest_blocks_of_the_largest_replica() -> None:
    index = BlockIndex(max_blocks=10)
    for r in ("a", "b"):
        index.add_replica(r, "m")
    index.apply("a", stored([1, 2], PROMPT[:8]))
    flood = [list(range(1000 + 4 * i, 1004 + 4 * i)) for i in range(20)]
    for i, tokens in enumerate(flood):
        index.apply("b", stored([500 + i], tokens))
    assert index.sizes["m"] == 10 and index.held("a") == 2 and index.held("b") == 8
    assert index.evicted == 12
    assert held(index, flood[-1]) == {"b": 1}  # the newest kept
    assert held(index, flood[0]) == {}  # the oldest gone
    assert held(index) == {"a": 2}


def test_memory_per_block_is_within_the_stated_figure() -> None:
    index = index_with(*(f"r{i}" for i in range(8)))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    blocks = 0
    for r in range(8):
        for chain in range(250):
            tokens = [r * 1_000_000 + chain * 1000 + t for t in range(BS * 25)]
            hashes = [(r << 40) + chain * 100 + i for i in range(25)]
            index.apply(f"r{r}", stored(hashes, tokens))
            blocks += 25
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert index.sizes["m"] == blocks == 50_000
    assert used / blocks <= BYTES_PER_BLOCK, used / blocks


def states(*addresses: str) -> list[EndpointState]:
    return [EndpointState(Endpoint(a, model_name="m", engine="sim")) for a in addresses]


def test_scorer_scores_held_fraction_and_falls_back_for_silent_replicas() -> None:
    index = index_with("a", "b")
    index.apply("a", stored([1, 2, 3], PROMPT[:12]))
    fallback = PrefixCacheScorer(block_size=8)
    fallback.index.add("c", fallback.hashes(SchedulingContext("m", b"x" * 64)))
    scorer = PrecisePrefixCacheScorer(fallback=fallback)
    scorer.index, scorer.tokens = index, Tokens(PROMPT)
    ctx = SchedulingContext("m", b"x" * 64)
    assert scorer.score(ctx, states("a", "b")) == [0.5, 0.0]
    # "c" publishes nothing: the approximate index answers for it.
    assert scorer.score(SchedulingContext("m", b"x" * 64), states("a", "b", "c")) == [
        0.5,
        0.0,
        1.0,
    ]
    # Cannot tokenize: the approximate scores for all, publishing or not ("c" is held there).
    scorer.tokens = Tokens(None)
    fallback.index.add("a", fallback.hashes(SchedulingContext("m", b"x" * 64)))
    assert scorer.score(SchedulingContext("m", b"x" * 64), states("a", "b", "c")) == [
        1.0,
        0.0,
        1.0,
    ]


def test_token_ids_beyond_8_bytes_score_as_a_request_not_tokenized() -> None:
    """A completion's prompt of token ids is the client's: ids no engine has fall back to the
    approximate scores (here none) instead of failing the pick, and leave nothing on the way."""
    index = index_with("a")
    index.apply("a", stored([1, 2, 3], PROMPT[:12]))
    scorer = PrecisePrefixCacheScorer()
    scorer.index = index
    for ids in ([1 << 63] * 24, PROMPT + [1 << 64] * 8, [-(1 << 63) - 1] * 24, [1 << 200] * 4):
        scorer.tokens = Tokens(ids)
        ctx = SchedulingContext("m", b"x" * 64, now=100.0)
        fleet = states("a")
        fleet[0].block_size = BS
        assert scorer.score(ctx, fleet) == [0.0]
        assert predicted_cached_tokens(ctx, "a") is None
        scorer.on_pick(ctx, fleet[0])
        assert not index.expected
    # In range, the same prompt is scored (the ids, not the scorer, made the difference).
    scorer.tokens = Tokens(PROMPT)
    assert scorer.score(SchedulingContext("m", b"x" * 64), states("a")) == [0.5]


def test_blocks_sent_but_not_reported_score_and_predict_as_held_there_until_reported() -> None:
    """A group's second request follows its first before the engine reports the blocks (the
    approximate index learns at pick time too), and is predicted to find them there."""
    index = index_with("a", "b")
    scorer = PrecisePrefixCacheScorer()
    scorer.index, scorer.tokens = index, Tokens(PROMPT)
    fleet = states("a", "b")
    for state in fleet:
        state.block_size = BS  # scraped (vllm:cache_config_info) before any event
    first = SchedulingContext("m", b"x" * 64, now=100.0)
    assert scorer.score(first, fleet) == [0.0, 0.0]
    assert predicted_cached_tokens(first, "b") == 0
    scorer.on_pick(first, fleet[1])
    second = SchedulingContext("m", b"x" * 64, now=101.0)
    assert scorer.score(second, fleet) == [0.0, 1.0]
    # All its blocks but the one with the prompt's last token (the engine computes that).
    assert predicted_cached_tokens(second, "b") == len(PROMPT) - BS
    assert predicted_cached_tokens(second, "a") == 0
    assert predicted_cached_tokens(second, "b", on_the_way=False) == 0
    # Behind a queue there, the next request may be admitted with the first and compute the
    # blocks too: still scored as held, not predicted.
    fleet[1].waiting, fleet[1].has_load_metrics, fleet[1].scraped_at = 2, True, 101.0
    queued = SchedulingContext("m", b"x" * 64, now=101.0)
    assert scorer.score(queued, fleet) == [0.0, 1.0]
    assert predicted_cached_tokens(queued, "b") == 0
    fleet[1].waiting = 0
    # Past EXPECT_SECONDS without events: no longer on the way.
    late = SchedulingContext("m", b"x" * 64, now=100.0 + EXPECT_SECONDS + 1)
    assert scorer.score(late, fleet) == [0.0, 0.0]
    assert predicted_cached_tokens(late, "b") == 0


def test_reported_blocks_are_no_longer_on_the_way_so_their_eviction_counts_at_once() -> None:
    index = index_with("a", "b")
    scorer = PrecisePrefixCacheScorer()
    scorer.index, scorer.tokens = index, Tokens(PROMPT)
    fleet = states("a", "b")
    for state in fleet:
        state.block_size = BS
    first = SchedulingContext("m", b"x" * 64, now=100.0)
    scorer.score(first, fleet)
    scorer.on_pick(first, fleet[1])
    # "b" reports the first two blocks: the prediction keeps the other four on their way ...
    index.apply("b", stored([1, 2], PROMPT[:8]))
    second = SchedulingContext("m", b"x" * 64, now=101.0)
    scorer.score(second, fleet)
    assert predicted_cached_tokens(second, "b") == len(PROMPT) - BS
    # ... then all six, and evicts the first: nothing is left on the way to hide that.
    index.apply("b", stored([3, 4, 5, 6], PROMPT[8:], parent=2))
    assert not index.expected
    index.apply("b", Batch(0.0, [Removed([1])]))
    third = SchedulingContext("m", b"x" * 64, now=102.0)
    assert scorer.score(third, fleet) == [0.0, 0.0]
    assert predicted_cached_tokens(third, "b") == 0
    # A request to a replica holding part of its prompt expects only the rest there.
    index.apply("a", stored([11, 12, 13], PROMPT[:12]))
    fourth = SchedulingContext("m", b"x" * 64, now=103.0)
    assert scorer.score(fourth, fleet) == [0.5, 0.0]
    scorer.on_pick(fourth, fleet[0])
    assert sorted(k for k, to in index.expected.items() if "a" in to) == sorted(
        block_keys(PROMPT, BS)[3:]
    )
    # Its first blocks evicted before the rest arrive: the run it will hold is cut there.
    index.apply("a", Batch(0.0, [Removed([11])]))
    fifth = SchedulingContext("m", b"x" * 64, now=104.0)
    scorer.score(fifth, fleet)
    assert predicted_cached_tokens(fifth, "a") == 0


def test_a_cleared_or_removed_replica_has_nothing_on_the_way() -> None:
    index = index_with("a", "b")
    keys = block_keys(PROMPT, BS)
    index.expect("a", BS, keys, 100.0)
    index.expect("b", BS, keys, 100.0)
    assert index.expected_runs("m", BS, keys, {}, 101.0) == {"a": 6, "b": 6}
    index.apply("a", Batch(0.0, [Cleared()]))
    assert index.expected_runs("m", BS, keys, {}, 101.0) == {"b": 6}
    index.remove_replica("b")
    assert index.expected_runs("m", BS, keys, {}, 101.0) == {} and not index.expected
    # Expiry and pruning forget the sends (and the bookkeeping of those already cleared).
    index.add_replica("c", "m")
    index.expect("c", BS, keys[:3], 100.0)
    assert index.expected_runs("m", BS, keys, {}, 101.0) == {"c": 3}
    index.prune(100.0 + EXPECT_SECONDS)
    assert not index.expected and not index._expiries and index._expected_blocks == 0


def test_predicted_cached_tokens_are_the_leading_run_less_the_last_token() -> None:
    index = index_with("a", "b")
    index.apply("a", stored([1, 2, 3], PROMPT[:12]))
    scorer = PrecisePrefixCacheScorer()
    scorer.index, scorer.tokens = index, Tokens(PROMPT)
    ctx = SchedulingContext("m", b"x" * 64)
    assert scorer.score(ctx, states("a", "b")) == [0.5, 0.0]
    # The access log's prediction: the leading run's tokens, never the prompt's last token.
    assert predicted_cached_tokens(ctx, "a") == 12 and predicted_cached_tokens(ctx, "b") == 0
    assert predicted_cached_tokens(SchedulingContext("m"), "a") is None  # no prediction made
    # Without a precise prediction: the approximate index's matched bytes / 4.
    approximate = PrefixCacheScorer(block_size=8)
    guess = SchedulingContext("m", b"x" * 64)
    approximate.index.add("c", approximate.hashes(guess))
    assert approximate.score(guess, states("a", "c")) == [0.0, 1.0]
    assert predicted_cached_tokens(guess, "c") == 64 // 4
    assert predicted_cached_tokens(guess, "a") == 0
    index.apply("a", stored([4, 5, 6], PROMPT[12:], parent=3))
    whole = SchedulingContext("m", b"x" * 64)
    assert scorer.score(whole, states("a", "b")) == [1.0, 0.0]
    assert predicted_cached_tokens(whole, "a") == len(PROMPT) - BS


def test_leading_ids_count_fewer_held_blocks_never_others() -> None:
    """A request scored from the ids of its leading part (``LeadingIds``: a prefix of its
    ids, for a prompt of ``total`` tokens): each replica's run is at most the whole ids' run,
    a replica holding another continuation of the leading part counts only the shared
    blocks, and the fractions and the prompt's length are the whole prompt's."""
    index = index_with("a", "b", "c")
    index.apply("a", stored([1, 2, 3, 4, 5, 6], PROMPT))
    index.apply("b", stored([7, 8], PROMPT[:8]))
    index.apply("c", stored([9, 10, 11, 12], [*PROMPT[:8], 1, 2, 3, 4, 5, 6, 7, 8]))
    scorer = PrecisePrefixCacheScorer()
    scorer.index = index
    whole, part = SchedulingContext("m", b"x" * 64), SchedulingContext("m", b"x" * 64)
    scorer.tokens = Tokens(PROMPT)
    full = scorer.score(whole, states("a", "b", "c"))
    scorer.tokens = Tokens(LeadingIds(PROMPT[:12], len(PROMPT)))
    leading = scorer.score(part, states("a", "b", "c"))
    assert full == [1.0, 2 / 6, 2 / 6]
    assert leading == [3 / 6, 2 / 6, 2 / 6]  # of the whole prompt's 6 blocks
    for replica in ("a", "b", "c"):
        assert predicted_cached_tokens(part, replica) <= predicted_cached_tokens(whole, replica)
    assert predicted_cached_tokens(part, "a") == 12
    assert part.cache[PROMPT_TOKENS] == whole.cache[PROMPT_TOKENS] == len(PROMPT)


def test_the_default_profile_takes_the_precise_scorer_while_replicas_publish() -> None:
    scheduler = build_scheduler()
    profile = scheduler.profiles["default"]
    before = (list(profile.filters), list(profile.scorers), list(profile.observers))
    approximate, weight = profile.scorers[0]
    precise = PrecisePrefixCacheScorer()
    use_in_default(scheduler, precise, True)
    assert profile.scorers[0] == (precise, weight) and precise.fallback is approximate
    assert profile.filters == before[0] and precise in profile.observers
    use_in_default(scheduler, precise, False)
    assert (profile.filters, profile.scorers, profile.observers) == before
    assert (
        type(
            build_scheduler({"plugins": [{"type": "precise-prefix-cache"}]}).plugins[
                "precise-prefix-cache"
            ]
        )
        is PrecisePrefixCacheScorer
    )


def test_configured_precise_scorers_read_the_index_and_tokens_they_are_built_with() -> None:
    """Both a configured ``precise-prefix-cache`` scorer and the one inside ``prefill-cost``
    score by the gateway's index and token ids (``PluginHandle``), not by an empty one."""
    index = index_with("a")
    index.apply("a", stored([1, 2, 3, 4, 5, 6], PROMPT))
    config = {"plugins": [{"type": "precise-prefix-cache"}, {"type": "prefill-cost"}]}
    plugins = build_scheduler(config, PluginHandle(kv_index=index, tokens=Tokens(PROMPT))).plugins
    for scorer in (plugins["precise-prefix-cache"], plugins["prefill-cost"].prefix):
        ctx = SchedulingContext("m", b"x" * 64)
        assert scorer.scores(ctx, states("a")) == {"a": 1.0}, scorer


def test_in_a_fleet_of_1000_the_replica_holding_the_blocks_is_found() -> None:
    """Past ``SAMPLE_ABOVE`` candidates the default profile scores a sample: the precise
    scorer's holders are in it, and where some replica does not publish, the approximate
    index's holders too."""
    names = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(1000)]
    index = index_with(*names[:999])  # the last one publishes nothing
    index.apply(names[321], stored([1, 2, 3, 4, 5], PROMPT[:20]))
    scheduler = build_scheduler()
    profile = scheduler.profile(None)
    approximate = next(s for s, _ in profile.scorers if isinstance(s, PrefixCacheScorer))
    precise = PrecisePrefixCacheScorer(index=index, tokens=Tokens(PROMPT))
    use_in_default(scheduler, precise, True)
    fleet = states(*names)
    for s in fleet:
        s.has_load_metrics, s.scraped_at = True, 100.0
    for _ in range(20):
        ctx = SchedulingContext("m", b"x" * 64, now=100.0)
        assert scheduler.pick(ctx, fleet, 4).endpoints[0].key == names[321]
    # A longer prompt the silent replica probably holds (the approximate index says so).
    prompt = b"y" * 64 * 8
    approximate.index.add(names[999], approximate.hashes(SchedulingContext("m", prompt)))
    precise.tokens = Tokens(None)
    for _ in range(20):
        ctx = SchedulingContext("m", prompt, now=100.0)
        assert scheduler.pick(ctx, fleet, 4).endpoints[0].key == names[999]
