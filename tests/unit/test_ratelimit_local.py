"""A single limit's plan on local buckets (``ratelimit/local.py``: its buckets resolved once,
its header lines reused while the levels after a take repeat) against the general path
(``reserve_local`` + ``rate_headers``, ``settle_deltas`` + ``adjust``): the same admissions,
levels and headers."""

from __future__ import annotations

import contextlib
import random

import orjson
import pytest

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.hooks import header_pairs
from llmplane.gateway.ratelimit.buckets import TokenBucket, rate_headers, reserve_local
from llmplane.gateway.ratelimit.limiter import RateLimiter
from llmplane.gateway.ratelimit.limits import BUDGET, INPUT, OUTPUT, REQUESTS
from llmplane.gateway.ratelimit.local import LocalPlan
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.workers.buckets import SharedTokenBucket

LIMITS = {REQUESTS: 5, INPUT: 300, OUTPUT: 120, BUDGET: 2000}
PERIOD = {REQUESTS: 60.0, INPUT: 60.0, OUTPUT: 1.0, BUDGET: 86400.0}


def twins(directions: list[str]) -> tuple[dict[str, TokenBucket], dict[str, TokenBucket]]:
    def make() -> dict[str, TokenBucket]:
        return {d: TokenBucket(LIMITS[d] / PERIOD[d], LIMITS[d], 0.0) for d in directions}

    return make(), make()


def rendered(headers: dict[str, str]) -> bytes:
    """Header lines as the gateway writes a hook's ``response_headers``."""
    return "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()


def test_a_plan_admits_and_reports_exactly_as_the_general_path():
    rng = random.Random(7)
    seen = {"admitted": 0, "refused": 0, "sub_second": 0, "longer": 0}
    for directions in (
        [REQUESTS],
        [INPUT, OUTPUT],
        [REQUESTS, INPUT, OUTPUT],
        [REQUESTS, INPUT, OUTPUT, BUDGET],
    ):
        fast, general = twins(directions)
        plan = LocalPlan(fast)
        assert plan.directions == tuple(directions)
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
                assert fast[d].stamp == general[d].stamp
            if ok and rng.random() < 0.5:  # some of it back, as a settlement gives it
                now += rng.choice((0.0, 0.05))
                for d, a in pairs:
                    delta = rng.randint(-a, a)
                    fast[d].adjust(delta, now)
                    general[d].adjust(delta, now)
    # The comparison covered both outcomes and both reset formats.
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


class _Lock(contextlib.AbstractContextManager):  # type: ignore[type-arg]
    def __exit__(self, *exc: object) -> None:
        return None


def test_a_plan_over_shared_buckets_takes_as_one_over_local_buckets():
    """A bucket whose level lives elsewhere (shared by workers) goes through the same plan:
    the same admissions, levels and lines as a bucket of this process."""
    rng = random.Random(17)
    values = memoryview(bytearray(32)).cast("d")
    shared = {
        REQUESTS: SharedTokenBucket(LIMITS[REQUESTS] / 60.0, LIMITS[REQUESTS], values, 0, _Lock()),
        OUTPUT: SharedTokenBucket(LIMITS[OUTPUT] / 1.0, LIMITS[OUTPUT], values, 2, _Lock()),
    }
    for bucket in shared.values():
        bucket.level, bucket.stamp = float(bucket.burst), 0.0
    mine, theirs = LocalPlan(shared), LocalPlan(twins([REQUESTS, OUTPUT])[0])
    now, admitted = 0.0, 0
    for _ in range(200):
        now += rng.choice((0.0, 0.3, 20.0))
        amounts = [1, rng.randint(0, 90)]
        lines = mine.take(amounts, now)
        assert lines == theirs.take(amounts, now)
        admitted += lines is not None
        assert [b.level for b in mine.buckets] == [b.level for b in theirs.buckets]
    assert 0 < admitted < 200


def test_a_shared_bucket_keeps_the_arithmetic_of_a_local_one():
    """``SharedTokenBucket`` (level and stamp in shared memory) refills, waits, adjusts and
    reports as a ``TokenBucket`` does."""
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


async def test_the_limiters_plan_reserves_and_settles_as_its_general_path():
    """``RateLimiter.reserve`` / ``settle`` of a tenant's local limit (through its
    plan, the header lines reused while the levels repeat) against the same limiter's general
    path (``_reserve_general``: ``Taken`` parts, ``rate_headers``) on a twin limiter: the same
    admissions, amounts, levels, stamps, header bytes and settlements, for completions and
    embeddings; an embedding under an output-only limit takes nothing."""
    from llmplane.gateway.hooks import Usage
    from llmplane.gateway.ratelimit.error import RateLimitError
    from tests.ratelimit_requests import Clock, TenantDecision, hook_ctx, tenant

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
                # The plan leaves a refusal to the general path, which raises it.
                with pytest.raises(RateLimitError):
                    await fast.reserve(hook_ctx(inference, decision))
                seen["refused"] += 1
                theirs = mine = None
            else:
                mine = await fast.reserve(hook_ctx(inference, decision))
            if theirs is None:
                assert mine is None
            else:
                assert mine is not None and mine.response_lines is not None
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
                    fast.settle(hook_ctx(inference, decision, status), mine, reported)
                    general.settle(hook_ctx(inference, decision, status), theirs, reported)
                    seen["settled"] += 1
            assert fast.local.keys() == general.local.keys()
            for key, bucket in fast.local.items():
                assert bucket.level == general.local[key].level, key
                assert bucket.stamp == general.local[key].stamp, key
        # An embedding takes no output tokens: under an output-only limit, nothing at all.
        if len(limit.tokens) == 1:
            assert await fast.reserve(hook_ctx(random_request(rng, True), decision)) is None
    assert all(seen.values()), seen
