"""The single-limit fast path on local buckets (``ratelimit/local.py``) against the general
one (``reserve_local`` + ``rate_headers``, ``settle_deltas`` + ``adjust``): the same
admissions, levels and headers. Each test runs with both ways a plan takes and settles: the
loops of ``buckets.py`` (what a compiled gateway uses; run compiled and pure) and the
functions written out per bucket layout (what pure Python uses)."""

from __future__ import annotations

import contextlib
import random

import orjson
import pytest

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.hooks import header_pairs
from llmplane.gateway.ratelimit import local
from llmplane.gateway.ratelimit.buckets import (
    BucketState,
    HeaderLines,
    TokenBucket,
    rate_headers,
    reserve_levels,
    reserve_local,
    settle_deltas,
    take_levels,
)
from llmplane.gateway.ratelimit.limiter import RateLimiter
from llmplane.gateway.ratelimit.limits import BUDGET, INPUT, OUTPUT, REQUESTS
from llmplane.gateway.ratelimit.local import LocalPlan
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.workers.buckets import SharedTokenBucket

LIMITS = {REQUESTS: 5, INPUT: 300, OUTPUT: 120, BUDGET: 2000}
PERIOD = {REQUESTS: 60.0, INPUT: 60.0, OUTPUT: 1.0, BUDGET: 86400.0}


@pytest.fixture(autouse=True, params=["loops", "written-out"])
def loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Which way the plans of a test take and settle."""
    monkeypatch.setattr(local, "LOOPS", request.param == "loops")
    return bool(request.param == "loops")


def twins(directions: list[str]) -> tuple[dict[str, TokenBucket], dict[str, TokenBucket]]:
    def make() -> dict[str, TokenBucket]:
        return {d: TokenBucket(LIMITS[d] / PERIOD[d], LIMITS[d], 0.0) for d in directions}

    return make(), make()


def rendered(headers: dict[str, str]) -> bytes:
    """Header lines as the gateway writes a hook's ``response_headers``."""
    return "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()


def test_fast_path_admits_settles_and_reports_exactly_as_the_general_path(loops: bool):
    rng = random.Random(7)
    seen = {"admitted": 0, "refused": 0, "sub_second": 0, "longer": 0, "settled": 0}
    for directions in (
        [REQUESTS],
        [INPUT, OUTPUT],
        [REQUESTS, INPUT, OUTPUT],
        [REQUESTS, INPUT, OUTPUT, BUDGET],
    ):
        fast, general = twins(directions)
        plan = LocalPlan(fast)
        assert plan.directions == tuple(directions)
        assert (plan._straight is take_levels) == loops
        now = 0.0
        for _ in range(400):
            now += rng.choice((0.0, 0.01, 0.3, 2.0))
            amounts = [1 if d == REQUESTS else rng.randint(0, 90) for d in directions]
            pairs = list(zip(directions, amounts, strict=True))
            lines = plan.take(amounts, now)
            headers = header_pairs(lines) if lines is not None else None
            ok, states = reserve_local([(d, general[d], a) for d, a in pairs], now)
            assert (headers is not None) == ok
            if ok:
                seen["admitted"] += 1
                assert headers == rate_headers(states)
                assert lines == rendered(rate_headers(states))  # the same bytes, in order
                resets = [v for k, v in headers.items() if k.startswith("x-ratelimit-reset")]
                seen["sub_second"] += any(v.endswith("ms") for v in resets)
                seen["longer"] += any(not v.endswith("ms") for v in resets)
            else:
                seen["refused"] += 1
            for d in directions:
                assert fast[d].level == general[d].level
            if ok and rng.random() < 0.5:  # settle on usage (or on a status without it)
                now += rng.choice((0.0, 0.05))
                usage = rng.random() < 0.8
                prompt = rng.choice((0, rng.randint(1, 90))) if usage else None
                completion = rng.randint(0, 90) if usage else None
                status = rng.choice((200, 200, 429, 499, 500))
                plan.settle(amounts, prompt, completion, status, lambda t=now: t)
                deltas = settle_deltas(pairs, prompt, completion, status)
                seen["settled"] += bool(deltas)
                for d, delta in deltas:
                    general[d].adjust(delta, now)
                for d in directions:
                    assert fast[d].level == general[d].level
                    assert fast[d].stamp == general[d].stamp
    # The comparison covered both outcomes, both reset formats and settlements that moved.
    assert all(seen.values()), seen


def test_a_take_that_leaves_the_same_levels_reuses_the_lines_and_another_does_not():
    """Full buckets before each take (a tenant well inside its limits) and the same amounts:
    the same lines, made once; any other level after a take: lines of that level."""
    fast, general = twins([REQUESTS, INPUT, OUTPUT])
    plan = LocalPlan(fast)
    first = plan.take([1, 30, 12], 0.0)
    assert plan.take([1, 30, 12], 1000.0) is first  # refilled to the burst: the same levels
    for amounts, now in (([1, 31, 12], 2000.0), ([1, 31, 12], 2000.0), ([1, 30, 12], 3000.0)):
        pairs = list(zip(plan.directions, amounts, strict=True))
        lines = plan.take(amounts, now)
        ok, states = reserve_local([(d, general[d], a) for d, a in pairs], now)
        assert ok and lines == rendered(rate_headers(states))
    assert plan.take([1, 30, 12], 3000.0) != first  # not refilled: lower levels, new lines


def test_a_tie_between_token_buckets_reports_the_first_as_the_general_path_does():
    fast, general = twins([INPUT, OUTPUT, BUDGET])
    amounts = [(INPUT, 30), (OUTPUT, 12), (BUDGET, 200)]  # a tenth of each: equal shares
    headers = header_pairs(LocalPlan(fast).take([a for _, a in amounts], 0.0))
    ok, states = reserve_local([(d, general[d], a) for d, a in amounts], 0.0)
    assert ok and headers == rate_headers(states)
    assert headers["x-ratelimit-limit-tokens"] == "300"


class _Decision:
    model = "m"


def random_request(rng: random.Random, embeddings: bool) -> InferenceRequest:
    """A request whose amounts range from nothing to over every limit of ``LIMITS``."""
    doc: dict = {"model": "m"}
    text = "x" * rng.randint(0, 1400)
    if embeddings:
        doc["input"] = rng.choice((text, [text, "yz"], [1, 2, 3]))
    elif rng.random() < 0.5:
        doc["messages"] = [{"role": "user", "content": text}]
    else:
        doc["prompt"] = text
    if not embeddings:
        key = rng.choice(("max_tokens", "max_completion_tokens", None))
        if key is not None:
            doc[key] = rng.randint(1, 150)
        if rng.random() < 0.2:
            doc["n"] = 2
    path = "/v1/embeddings" if embeddings else "/v1/chat/completions"
    return InferenceRequest(path, {}, orjson.dumps(doc))


def test_the_one_call_reserve_takes_what_the_general_path_takes(loops: bool):
    """``LocalPlan.reserve`` (the amounts and the take made in one function per bucket
    layout) against ``RateLimiter._amounts`` + ``reserve_local`` + ``rate_headers``: the same
    amounts, refusals (too large for a limit, or not fitting now), levels and header bytes,
    for one to four buckets, completions and embeddings."""
    rng = random.Random(11)
    limiter = RateLimiter(GatewayConfig())
    seen = {"admitted": 0, "too_large": 0, "not_now": 0, "same_lines": 0}
    for directions in (
        [REQUESTS],
        [INPUT],
        [INPUT, OUTPUT],
        [REQUESTS, INPUT, OUTPUT],
        [REQUESTS, INPUT, OUTPUT, BUDGET],
        [OUTPUT, BUDGET],
    ):
        for embeddings in (False, True):
            kept = [d for d in directions if not (embeddings and d == OUTPUT)]
            fast, general = twins(kept)
            # The gateway's plan counts with ``estimate_tokens`` when no tokenizer is set
            # (count None), else with the limiter's counter: both ways, one each.
            count = limiter.counter.count if embeddings else None
            plan = LocalPlan(fast, embeddings, count, limiter.default_output)
            assert plan.reserve is not None
            assert (plan.reserve is reserve_levels) == loops
            now = 0.0
            for _ in range(300):
                now += rng.choice((0.0, 0.01, 0.5, 5.0))
                inference = random_request(rng, embeddings)
                counted: list[int] = []
                before = plan.lines
                amounts = plan.reserve(plan, inference.doc, "m", "m", now, counted)
                want, too_large = limiter._amounts(
                    inference,
                    _Decision(),  # type: ignore[arg-type]
                    plan.limits,
                    embeddings,
                    [],
                )
                if too_large is not None:
                    seen["too_large"] += 1
                    assert amounts is None
                else:
                    pairs = list(zip(kept, want, strict=True))
                    ok, states = reserve_local([(d, general[d], a) for d, a in pairs], now)
                    if ok:
                        seen["admitted"] += 1
                        seen["same_lines"] += plan.lines is before
                        assert amounts == want
                        assert plan.lines == rendered(rate_headers(states))
                    else:
                        seen["not_now"] += 1
                        assert amounts is None
                    if INPUT in kept or BUDGET in kept:  # the count, left for the general path
                        assert counted == [limiter.counter.count(inference.doc, "m")]
                for d in kept:
                    assert fast[d].level == general[d].level
                    assert fast[d].stamp == general[d].stamp
    assert all(seen.values()), seen


def reset_kind(value: str) -> str:
    """0s, ms, s (under a minute), m (minutes), h (hours): which format a reset has."""
    if value == "0s" or value.endswith("ms"):
        return "0s" if value == "0s" else "ms"
    return "h" if "h" in value else "m" if "m" in value else "s"


def test_the_lines_of_any_levels_are_the_general_paths_headers():
    """``LocalPlan``'s header lines (written out per bucket, ``duration`` inline for resets
    under a minute) against ``rate_headers`` for arbitrary levels: below zero, zero, full,
    and resets of milliseconds, seconds with three decimals, minutes and hours."""
    rng = random.Random(5)
    kinds = {"ms": 0, "s": 0, "m": 0, "h": 0, "0s": 0}
    for directions in ([REQUESTS], [INPUT, OUTPUT], [REQUESTS, INPUT, OUTPUT, BUDGET]):
        for _ in range(500):
            limits = {d: rng.choice((1, 7, 300, 4000, 90000)) for d in directions}
            rates = {d: limits[d] / rng.choice((0.5, 1.0, 60.0, 3600.0, 86400.0)) for d in limits}
            plan = LocalPlan({d: TokenBucket(rates[d], limits[d], 0.0) for d in directions})
            levels = [
                rng.choice((limits[d], 0.0, -rng.random() * 50, rng.random() * limits[d]))
                for d in directions
            ]
            plan._render(levels)
            states = [
                BucketState(d, limits[d], rates[d], level)
                for d, level in zip(directions, levels, strict=True)
            ]
            assert plan.lines == rendered(rate_headers(states))
            for line in plan.lines.decode().split("\r\n"):
                if line.startswith("x-ratelimit-reset"):
                    value = line.split(": ")[1]
                    kinds[reset_kind(value)] += 1
    assert all(kinds.values()), kinds


def test_the_loops_are_only_for_buckets_of_this_process():
    """A bucket whose level lives elsewhere (shared by workers, or any subclass) keeps the
    written-out path: compiled, the loops read ``TokenBucket``'s own C fields."""
    local.LOOPS = True  # (restored by the fixture)
    shared = SharedTokenBucket(1.0, 10, memoryview(bytearray(16)).cast("d"), 0, _Lock())
    plan = LocalPlan({REQUESTS: shared})
    assert plan.reserve is None and plan._straight is not take_levels
    assert LocalPlan({REQUESTS: TokenBucket(1.0, 10, 0.0)})._straight is take_levels


class _Lock(contextlib.AbstractContextManager):  # type: ignore[type-arg]
    def __exit__(self, *exc: object) -> None:
        return None


def test_a_shared_bucket_keeps_the_arithmetic_of_a_local_one():
    """``SharedTokenBucket`` (level and stamp in shared memory) refills, waits, adjusts and
    reports as a ``TokenBucket`` does, compiled too (where ``TokenBucket``'s methods read its
    C fields, which a shared bucket does not use)."""
    rng = random.Random(3)
    values = memoryview(bytearray(16)).cast("d")
    shared = SharedTokenBucket(2.0, 100, values, 0, _Lock())
    shared.level, shared.stamp = 100.0, 0.0
    mine = TokenBucket(2.0, 100, 0.0)
    now = 0.0
    for _ in range(300):
        now += rng.choice((0.0, 0.5, 3.0))
        amount = rng.randint(0, 60)
        for bucket in (shared, mine):
            bucket.refill(now)
        assert shared.wait(amount) == mine.wait(amount)
        if shared.wait(amount) == 0.0:
            shared.level -= amount
            mine.level -= amount
        delta = rng.randint(-40, 40)
        shared.adjust(delta, now)
        mine.adjust(delta, now)
        assert (values[0], values[1]) == (mine.level, mine.stamp)
        assert shared.state("requests") == mine.state("requests")
    assert values[0] < 0 < values[1]  # an overuse debit was covered too


# Resets (seconds) at the boundaries of each format: sub-second (rounded up to whole ms),
# seconds with three decimals (trailing zeros dropped), minutes, an hour and more (left to
# Python), and third decimals just beside a tie.
BOUNDARY_RESETS = [
    0.0,
    -0.0,
    -3.0,
    1e-12,
    0.0004,
    0.001,
    0.0010001,
    0.5,
    0.999,
    0.9994,
    0.9996,
    0.99999999,
    1.0,
    1.0004,
    1.0006,
    1.05,
    1.1,
    1.25,
    9.999,
    10.0,
    12.3456,
    59.999,
    59.9994,
    59.9996,
    59.99999,
    60.0,
    60.0004,
    60.0006,
    61.5,
    119.9996,
    754.125,
    3599.9994,
    3599.9996,
    3600.0,
    7384.5,
    1e9,
]


def test_header_lines_write_the_general_paths_bytes_across_every_unit_boundary():
    """``buckets.HeaderLines`` (what a compiled plan writes its lines with; run compiled and
    pure) against ``rate_headers``: remaining counts of nothing, fractions, whole tokens and
    large numbers, and every reset format at its boundaries; what it leaves to Python (an hour
    or more, a near tie) is None, and nothing else is."""
    rng = random.Random(13)
    rendered_here = left = 0
    for directions in ([REQUESTS], [INPUT, OUTPUT], [REQUESTS, INPUT, OUTPUT, BUDGET]):
        for limit in (1, 7, 4000, 18_000_000, 4_000_000_000, 9_000_000_000_000_000):
            for reset in BOUNDARY_RESETS:
                rates = {d: rng.choice((limit / 3600.0, limit / 1.0, 5000.0)) for d in directions}
                # The first bucket's level gives exactly ``reset``; the others' are random.
                levels = [limit - reset * rates[directions[0]]] + [
                    rng.choice((limit, 0.0, -rng.random() * 50, rng.random() * limit))
                    for _ in directions[1:]
                ]
                buckets = tuple(TokenBucket(rates[d], limit, 0.0) for d in directions)
                plan = LocalPlan(dict(zip(directions, buckets, strict=True)))
                lines = HeaderLines(plan.format, plan.limits).render(buckets, levels)
                states = [
                    BucketState(d, limit, rates[d], level)
                    for d, level in zip(directions, levels, strict=True)
                ]
                want = rendered(rate_headers(states))
                resets = [
                    (limit - level) / rates[d] for d, level in zip(directions, levels, strict=True)
                ]
                if lines is None:
                    left += 1
                    assert any(s >= 3600 or _near_tie(s) for s in resets), (levels, want)
                else:
                    rendered_here += 1
                    assert lines == want, (levels, rates)
    assert rendered_here > 300 and left > 50, (rendered_here, left)


def _near_tie(seconds: float) -> bool:
    """A reset whose thousandths (of its seconds within the minute) are within 1e-4 of .5."""
    part = (seconds % 60.0 if seconds >= 60 else seconds) * 1000.0
    return seconds >= 1 and abs(part - int(part) - 0.5) <= 1.01e-4


def test_header_lines_leave_a_near_tie_to_python_and_python_rounds_it_as_rate_headers():
    """A third decimal that is almost exactly a half: the integer arithmetic cannot tell
    which way the exact value rounds, so ``HeaderLines`` leaves it (None) and the plan's
    lines come from Python's formatting, as ``rate_headers`` renders them."""
    bucket = TokenBucket(1.0, 100, 0.0)
    plan = LocalPlan({INPUT: bucket})
    for reset in (1.0005, 2.0015, 59.9995, 60.0005, 754.0125):
        level = 100 - reset
        assert HeaderLines(plan.format, plan.limits).render((bucket,), [level]) is None
        plan._render([level])
        state = BucketState(INPUT, 100, 1.0, level)
        assert plan.lines == rendered(rate_headers([state]))


def test_with_the_loops_a_plan_writes_its_lines_with_header_lines(loops: bool):
    """With the loops (a compiled gateway's plans) the lines of ordinary levels never reach
    the Python renderer; its fallback (an hour or more) still does."""
    plan = LocalPlan({REQUESTS: TokenBucket(1.0, 10, 0.0), OUTPUT: TokenBucket(1.0, 90, 0.0)})
    assert (plan.header_lines is not None) == loops
    python = plan._renderer
    calls = []
    plan._renderer = lambda *args: calls.append(args) or python(*args)
    amounts = plan.reserve(plan, {"max_tokens": 5}, "m", "m", 3.0, [])
    assert amounts == [1, 5]
    assert plan.lines == rendered(
        rate_headers([BucketState(REQUESTS, 10, 1.0, 9.0), BucketState(OUTPUT, 90, 1.0, 85.0)])
    )
    assert len(calls) == (0 if loops else 1)
    plan._render([9.0, 90.0 - 4000.0])  # a reset of over an hour: Python's
    assert len(calls) == (1 if loops else 2)
    assert b"x-ratelimit-reset-tokens: 1h6m" in plan.lines


def test_the_limiters_fast_path_reserves_and_settles_as_its_general_path(loops: bool):
    """``RateLimiter.reserve_now`` / ``settle_now`` of a tenant's local limit (the fast path:
    with the loops the limiter calls ``reserve_levels`` / ``settle_levels`` itself and makes
    the reservation field by field) against the same limiter's general path
    (``_reserve_general``: ``Taken`` parts, ``rate_headers``, ``settle_deltas``) on a twin
    limiter: the same admissions, amounts, levels, stamps, header bytes and settlements, for
    completions and embeddings; an embedding under an output-only limit takes nothing."""
    from llmplane.gateway.hooks import Usage
    from llmplane.gateway.ratelimit.error import RateLimitError
    from tests.unit.test_ratelimit_math import Clock
    from tests.unit.test_tenant_limits import _Decision as TenantDecision
    from tests.unit.test_tenant_limits import tenant

    rng = random.Random(13)
    seen = {"admitted": 0, "refused": 0, "settled": 0, "embeddings": 0}
    spec = {
        "requestsPerUnit": 40,
        "inputTokensPerUnit": 3000,
        "outputTokensPerUnit": 900,
        "unit": "minute",
        "budget": {"tokens": 20000, "unit": "day"},
    }
    for rate_limit in (spec, {"outputTokensPerUnit": 900, "unit": "minute"}):
        clock = Clock()
        fast, general = (RateLimiter(GatewayConfig(), clock=clock) for _ in range(2))
        for limiter in (fast, general):
            limiter.update([tenant("a", rate_limit)])
        limit = fast.tenant_limits["a"]
        decision = TenantDecision("a")
        for _ in range(300):
            clock.now += rng.choice((0.0, 0.01, 0.5, 5.0))
            embeddings = rng.random() < 0.25
            inference = random_request(rng, embeddings)
            try:
                theirs = general._reserve_general(inference, decision, [limit], [])
            except RateLimitError:
                # The fast path leaves a refusal to the general path, which raises it.
                with pytest.raises(RateLimitError):
                    fast.reserve_now(inference, decision)
                seen["refused"] += 1
                theirs = mine = None
            else:
                mine = fast.reserve_now(inference, decision)
            if theirs is None:
                assert mine is None
            else:
                assert mine is not None and mine.plan is not None
                seen["admitted"] += 1
                seen["embeddings"] += embeddings
                assert mine.response_lines == rendered(theirs.response_headers)
                assert mine.response_headers == theirs.response_headers
                assert [(p.limit, p.mode, p.amounts) for p in mine.taken] == [
                    (p.limit, p.mode, p.amounts) for p in theirs.taken
                ]
                assert mine.stream_filter is None and theirs.stream_filter is None
                if rng.random() < 0.7:
                    clock.now += rng.choice((0.0, 0.05))
                    usage = Usage(rng.randint(0, 900), rng.randint(0, 300))
                    status = rng.choice((200, 200, 500))
                    reported = usage if rng.random() < 0.8 else None
                    fast.settle_now(inference, decision, mine, reported, status)
                    general.settle_now(inference, decision, theirs, reported, status)
                    seen["settled"] += 1
            assert fast.local.keys() == general.local.keys()
            for key, bucket in fast.local.items():
                assert bucket.level == general.local[key].level, key
                assert bucket.stamp == general.local[key].stamp, key
        # An embedding takes no output tokens: under an output-only limit, nothing at all.
        if len(limit.tokens) == 1:
            assert fast.reserve_now(random_request(rng, True), decision) is None
    assert all(seen.values()), seen
