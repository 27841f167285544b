"""The benchmark's workload generators make what they claim; percentiles and report helpers.
In the suite (pyproject's testpaths): the published figures are only as right as these."""

from __future__ import annotations

import collections
import itertools
import os
import random

import orjson
import pytest

from bench import workloads as wl
from bench.common import parse_wrk, percentile, table, write_section


def test_text_length_is_four_chars_a_token() -> None:
    rng = random.Random(1)
    for n in (1, 7, 100, 3000):
        assert len(wl.text(rng, n)) == 4 * n


def test_shared_prefix_groups_and_prefix_lengths() -> None:
    reqs = wl.shared_prefix(
        random.Random(3),
        groups=5,
        per_group=7,
        system_tokens=300,
        question_tokens=20,
        output_tokens=9,
        salt="s",
    )
    assert len(reqs) == 35
    sizes = collections.Counter(r.group for r in reqs)
    assert sizes == {g: 7 for g in range(5)}
    by_group: dict[int, set[str]] = collections.defaultdict(set)
    for r in reqs:
        system, user = r.messages
        assert system["role"] == "system" and user["role"] == "user"
        by_group[r.group].add(system["content"])
        assert len(system["content"]) >= 4 * 300  # salt tag plus 300 tokens of text
        assert len(user["content"]) == 4 * 20
        assert r.max_tokens == 9
    assert all(len(s) == 1 for s in by_group.values())  # one shared prompt per group
    assert len({next(iter(s)) for s in by_group.values()}) == 5  # distinct between groups
    assert [r.group for r in reqs] != sorted(r.group for r in reqs)  # shuffled


def test_salt_changes_every_prompt() -> None:
    a = wl.shared_prefix(random.Random(3), groups=2, per_group=2, salt="a")
    b = wl.shared_prefix(random.Random(3), groups=2, per_group=2, salt="b")
    assert {r.messages[0]["content"] for r in a}.isdisjoint(r.messages[0]["content"] for r in b)


def test_multi_round_histories_grow_and_extend() -> None:
    reqs = wl.multi_round(
        random.Random(5), users=4, rounds=3, system_tokens=50, user_tokens=10, output_tokens=6
    )
    assert len(reqs) == 12
    # every round k of all users comes before any round k + 1
    assert [r.round for r in reqs] == sorted(r.round for r in reqs)
    for u in range(4):
        mine = [r for r in reqs if r.group == u]
        assert [r.round for r in mine] == [0, 1, 2]
        for k, r in enumerate(mine):
            assert len(r.messages) == 1 + 2 * k + 1  # system, (user, assistant) * k, user
            assert r.messages[-1]["role"] == "user"
        for prev, nxt in itertools.pairwise(mine):
            assert nxt.messages[: len(prev.messages)] == prev.messages  # prompt extends
            assert nxt.prompt_chars() == prev.prompt_chars() + 4 * (6 + 10)


def test_mixed_lengths_within_range_and_spread() -> None:
    reqs = wl.mixed(random.Random(9), n=400, prompt_range=(32, 3000), output_range=(8, 128))
    prompts = [r.meta["prompt_tokens"] for r in reqs]
    outputs = [r.max_tokens for r in reqs]
    assert min(prompts) >= 32 and max(prompts) <= 3000
    assert min(outputs) >= 8 and max(outputs) <= 128
    # log-uniform: about half below the geometric mean
    below = sum(p < (32 * 3000) ** 0.5 for p in prompts)
    assert 150 < below < 250


def test_lora_mix_follows_zipf_weights() -> None:
    names = [f"a{k}" for k in range(16)]
    w = wl.lora_weights(16)
    assert sum(w) == pytest.approx(1.0)
    assert w[0] / w[1] == pytest.approx(2.0) and w[0] / w[15] == pytest.approx(16.0)
    reqs = wl.lora_mix(random.Random(11), names, n=4000)
    counts = collections.Counter(r.model for r in reqs)
    assert set(counts) == set(names)
    for k, name in enumerate(names):
        expected = 4000 * w[k]
        assert abs(counts[name] - expected) < 5 * expected**0.5 + 5
    assert reqs[0].body("base")["model"] in names


def test_request_body_streams_with_usage() -> None:
    r = wl.Request([{"role": "user", "content": "hi"}], 5)
    body = r.body("m")
    assert body["model"] == "m" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "stream" not in r.body("m", stream=False)


def test_poisson_arrivals_rate_and_bursts() -> None:
    rng = random.Random(2)
    t = wl.poisson_arrivals(rng, 20000, rate=50.0)
    assert t == sorted(t)
    assert len(t) / t[-1] == pytest.approx(50.0, rel=0.05)
    b = wl.poisson_arrivals(random.Random(2), 20000, rate=10.0, burst=4.0, period=1.0)
    odd = sum(1 for x in b if int(x // 1.0) % 2 == 1)
    assert odd / (len(b) - odd) == pytest.approx(4.0, rel=0.15)


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([], 50) != percentile([], 50)  # NaN
    assert percentile([7], 99) == 7
    xs = [1, 2, 3, 4]
    assert percentile(xs, 0) == 1 and percentile(xs, 100) == 4
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert percentile([5, 1, 4, 2, 3], 50) == 3  # unsorted input
    rng = random.Random(4)
    data = [rng.random() for _ in range(1001)]
    assert percentile(data, 90) == sorted(data)[900]


def test_parse_wrk_output() -> None:
    out = """Running 5s test @ http://127.0.0.1:1/v1/completions
  Latency Distribution
     50%  412.00us
     75%    1.10ms
     90%    2.00ms
     99%   12.50ms
  24000 requests in 5.00s, 3.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:   4800.12
"""
    r = parse_wrk(out)
    assert r["rps"] == pytest.approx(4800.12) and r["requests"] == 24000
    assert r["p50"] == pytest.approx(0.412) and r["p99"] == pytest.approx(12.5)
    assert r["errors"] == 7


def test_write_section_replaces_in_place(tmp_path: os.PathLike[str]) -> None:
    path = tmp_path / "r.md"  # type: ignore[operator]
    path.write_text("# R\n\nintro\n")
    write_section("x", "one", path)
    write_section("y", "two", path)
    write_section("x", "three", path)
    text = path.read_text()
    assert "one" not in text and text.index("three") < text.index("two")
    assert text.startswith("# R\n\nintro")
    assert table(["a", "b"], [[1, 2]]) == "| a | b |\n|---|---:|\n| 1 | 2 |"


def test_overload_mixed_shape_lengths() -> None:
    import argparse
    import statistics

    from bench import overload

    mixed = argparse.Namespace(shape="mixed", prompt_tokens=400, max_tokens=10)
    drawn = [overload.lengths(random.Random(f"1-{i}"), mixed) for i in range(2000)]
    prompts, outputs = [d[0] for d in drawn], [d[1] for d in drawn]
    assert min(prompts) >= 50 and max(prompts) <= 1000 and len(set(prompts)) > 300
    assert min(outputs) >= 20 and max(outputs) <= 300 and len(set(outputs)) > 150
    assert 170 <= statistics.median(prompts) <= 230 and 65 <= statistics.median(outputs) <= 95
    # Seeded: an arrival's lengths are the same in every phase.
    assert overload.lengths(random.Random("x"), mixed) == overload.lengths(
        random.Random("x"), mixed
    )
    fixed = argparse.Namespace(shape="fixed", prompt_tokens=400, max_tokens=10)
    rng = random.Random(5)
    assert overload.lengths(rng, fixed) == (400, 10) and rng.random() == random.Random(5).random()
    body = orjson.loads(overload.request_body(random.Random(2), mixed, (120, 33)))
    assert body["max_tokens"] == 33 and len(body["prompt"]) == 4 * 120
