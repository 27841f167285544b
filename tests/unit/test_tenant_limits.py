"""Tenant rate limits on local buckets (fake clock): requests per unit, input/output tokens,
the token budget, a tenant's and a route's limit taken together or not at all, the headers
and the 429s; validation of the Tenant's rateLimit."""

from __future__ import annotations

import orjson
import pytest

from llmplane.api.documents import InvalidResources, parse_document
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.hooks import Usage
from llmplane.gateway.ratelimit import RateLimiter, RateLimitError
from llmplane.gateway.ratelimit.limits import tenant_limits
from llmplane.gateway.request import InferenceRequest
from tests.ratelimit_requests import Clock, TenantDecision, chat, hook_ctx, route, tenant


def limiter_with(*objects: dict, **config) -> tuple[RateLimiter, Clock]:
    clock = Clock()
    limiter = RateLimiter(GatewayConfig(**config), clock=clock)
    limiter.update(list(objects))
    return limiter, clock


async def test_requests_per_unit_refuse_with_retry_after_and_request_headers():
    limiter, clock = limiter_with(tenant("a", {"requestsPerUnit": 3, "unit": "minute"}))
    d = TenantDecision("a")
    for left in (2, 1, 0):
        res = await limiter.reserve(hook_ctx(chat("hi"), d))
        assert res.response_headers["x-ratelimit-limit-requests"] == "3"
        assert res.response_headers["x-ratelimit-remaining-requests"] == str(left)
        assert "x-ratelimit-limit-tokens" not in res.response_headers
    with pytest.raises(RateLimitError) as err:
        await limiter.reserve(hook_ctx(chat("hi"), d))
    e = err.value
    assert e.type == "requests" and e.code == "rate_limit_exceeded"
    assert e.retry_after == 20  # one request every 20 s
    assert "requests per minute (Tenant/a): Limit 3, Used 3, Requested 1" in e.message
    resp = e.response()
    assert resp.status == 429 and resp.headers["Retry-After"] == "20"
    assert resp.headers["x-ratelimit-remaining-requests"] == "0"
    assert orjson.loads(resp.body)["error"]["type"] == "requests"
    # Other tenants and callers without a tenant are not held by a's limit.
    assert await limiter.reserve(hook_ctx(chat("hi"), TenantDecision("b"))) is None
    assert await limiter.reserve(hook_ctx(chat("hi"), TenantDecision(None))) is None
    clock.now += 20
    assert await limiter.reserve(hook_ctx(chat("hi"), d)) is not None


async def test_a_request_counts_even_when_it_used_nothing_but_a_failed_one_does_not():
    limiter, _ = limiter_with(tenant("a", {"requestsPerUnit": 1, "unit": "hour"}))
    d = TenantDecision("a")
    req = chat("hi")
    res = await limiter.reserve(hook_ctx(req, d))
    limiter.settle(hook_ctx(req, d, 503), res, None)  # failed: the request comes back
    req = chat("hi")
    res = await limiter.reserve(hook_ctx(req, d))
    limiter.settle(hook_ctx(req, d, 200), res, Usage(1, 0))  # served: it stays counted
    with pytest.raises(RateLimitError):
        await limiter.reserve(hook_ctx(chat("hi"), d))


async def test_tenant_token_limits_settle_on_usage():
    limiter, _ = limiter_with(
        tenant("a", {"inputTokensPerUnit": 100, "outputTokensPerUnit": 50, "unit": "minute"})
    )
    d = TenantDecision("a")
    req = chat("x" * 156, max_tokens=40)  # 40 in, 40 out
    res = await limiter.reserve(hook_ctx(req, d))
    assert res.response_headers["x-ratelimit-remaining-tokens-output"] == "10"
    with pytest.raises(RateLimitError) as err:
        await limiter.reserve(hook_ctx(chat("x" * 156, max_tokens=40), d))
    assert err.value.type == "tokens" and "output tokens per minute (Tenant/a)" in err.value.message
    limiter.settle(hook_ctx(req, d, 200), res, Usage(40, 5))  # 35 output tokens back
    res = await limiter.reserve(hook_ctx(chat("x" * 156, max_tokens=40), d))
    assert res.response_headers["x-ratelimit-remaining-tokens-output"] == "5"


async def test_a_refused_request_is_counted_once():
    """The input count made for the limit's plan is reused by the general path that builds
    the 429 (a model's tokenizer is the dearest step of a reservation, and refusals come in
    floods). A tokenizer is configured (for another model): the limiter's counter, which the
    test watches, then counts every request."""
    limiter, _ = limiter_with(
        tenant("a", {"inputTokensPerUnit": 100, "unit": "minute"}),
        rate_limit_tokenizers={"another-model": "/nonexistent/tokenizer.json"},
    )
    calls = []
    count = limiter.counter.count
    limiter.counter.count = lambda *args: calls.append(args) or count(*args)
    d = TenantDecision("a")
    assert await limiter.reserve(hook_ctx(chat("x" * 156), d)) is not None  # 40 of 100
    assert len(calls) == 1
    await limiter.reserve(hook_ctx(chat("x" * 156), d))  # 80 of 100
    with pytest.raises(RateLimitError):
        await limiter.reserve(hook_ctx(chat("x" * 156), d))
    assert len(calls) == 3
    with pytest.raises(RateLimitError):  # too large for the bucket: never fits
        await limiter.reserve(hook_ctx(chat("x" * 500), d))
    assert len(calls) == 4


async def test_budget_counts_input_plus_output_over_its_own_unit():
    limiter, clock = limiter_with(
        tenant("a", {"requestsPerUnit": 1000, "budget": {"tokens": 100, "unit": "day"}})
    )
    d = TenantDecision("a")
    req = chat("x" * 156, max_tokens=40)  # 40 in + 40 out reserved
    res = await limiter.reserve(hook_ctx(req, d))
    assert [a for part in res.taken for a in part.amounts] == [("requests", 1), ("budget", 80)]
    assert res.response_headers["x-ratelimit-remaining-tokens-budget"] == "20"
    limiter.settle(hook_ctx(req, d, 200), res, Usage(40, 10))  # used 50: 30 back -> 50 left
    with pytest.raises(RateLimitError) as err:
        await limiter.reserve(hook_ctx(chat("x" * 156, max_tokens=40), d))  # wants 80 of 50
    # 30 missing at 100 a day: 25,920 s; the request per second limit is not what blocks.
    assert err.value.retry_after == 25920
    assert "token budget" in err.value.message and "per day" in err.value.message
    with pytest.raises(RateLimitError) as err:
        await limiter.reserve(hook_ctx(chat("x", max_tokens=200), d))  # can never fit in 100
    assert err.value.retry_after is None and "Request too large" in err.value.message
    clock.now += 86400
    assert await limiter.reserve(hook_ctx(chat("x" * 156, max_tokens=40), d)) is not None


async def test_tenant_and_route_limits_are_taken_together_or_not_at_all():
    limiter, _ = limiter_with(
        tenant("a", {"inputTokensPerUnit": 1000, "requestsPerUnit": 10, "unit": "minute"}),
        route("r", {"inputTokensPerUnit": 60, "unit": "minute"}),
    )
    d = TenantDecision("a", "ModelRoute/default/r#0")
    res = await limiter.reserve(hook_ctx(chat("x" * 156), d))  # 40 tokens from both
    assert [p.limit.ref for p in res.taken] == ["Tenant/a", "ModelRoute/default/r"]
    # The headers report the scarcer of the two input buckets (the route's: 20 left).
    assert res.response_headers["x-ratelimit-remaining-tokens-input"] == "20"
    assert res.response_headers["x-ratelimit-remaining-requests"] == "9"
    with pytest.raises(RateLimitError) as err:
        await limiter.reserve(hook_ctx(chat("x" * 156), d))  # the route refuses
    assert "ModelRoute/default/r" in err.value.message
    # ... and the tenant's request and tokens went back: 9 requests and 960 tokens left.
    tenant_buckets = {k[1]: b for k, b in limiter.local.items() if k[0] == "tenant/default/a"}
    assert tenant_buckets["requests"].level == 9
    assert tenant_buckets["input"].level == 960


async def test_streams_get_usage_only_when_tokens_are_limited():
    limiter, _ = limiter_with(
        tenant("a", {"requestsPerUnit": 10}), tenant("b", {"outputTokensPerUnit": 1000})
    )
    req = chat("hi", stream=True)
    await limiter.reserve(hook_ctx(req, TenantDecision("a")))
    assert not req.dirty  # a request count needs no usage: the body is relayed untouched
    req = chat("hi", stream=True)
    res = await limiter.reserve(hook_ctx(req, TenantDecision("b")))
    assert req.dirty and res.stream_filter is not None


async def test_embeddings_take_input_and_budget_but_no_output():
    limiter, _ = limiter_with(tenant("a", {"outputTokensPerUnit": 5, "budget": {"tokens": 50}}))
    doc = {"model": "m", "input": "x" * 40}
    req = InferenceRequest("/v1/embeddings", {}, orjson.dumps(doc))
    res = await limiter.reserve(hook_ctx(req, TenantDecision("a")))
    assert res.taken[0].amounts == [("budget", 10)]


async def test_changed_limit_keeps_the_level_and_removed_tenant_frees_its_buckets():
    limiter, _ = limiter_with(tenant("a", {"requestsPerUnit": 5, "unit": "hour"}))
    d = TenantDecision("a")
    for _ in range(4):
        await limiter.reserve(hook_ctx(chat("hi"), d))
    limiter.update([tenant("a", {"requestsPerUnit": 2, "unit": "hour"})])
    await limiter.reserve(hook_ctx(chat("hi"), d))  # 1 was left (not a fresh bucket of 2)
    with pytest.raises(RateLimitError):
        await limiter.reserve(hook_ctx(chat("hi"), d))
    limiter.update([])
    assert limiter.local == {} and await limiter.reserve(hook_ctx(chat("hi"), d)) is None


def test_tenant_limits_names_and_invalid_ones():
    limits = tenant_limits(
        [
            tenant("a", {"requestsPerUnit": 5}),
            tenant("b", {"requestsPerUnit": 5}, "team"),
            tenant("c", None),
            tenant("d", {"requestsPerUnit": 0}),  # hand-written, invalid: ignored
            route("r", {"inputTokensPerUnit": 5}),
        ]
    )
    assert sorted(limits) == ["a", "team/b"]
    assert limits["team/b"].ref == "Tenant/team/b" and limits["team/b"].key == "tenant/team/b"


@pytest.mark.parametrize(
    ("rate_limit", "path", "message"),
    [
        ({"unit": "minute"}, "spec.rateLimit", "set requestsPerUnit, inputTokensPerUnit"),
        ({"requestsPerUnit": 0}, "spec.rateLimit.requestsPerUnit", "greater than or equal to 1"),
        ({"requestsPerUnit": 1, "unit": "week"}, "spec.rateLimit.unit", "'second', 'minute'"),
        ({"budget": {"tokens": 10, "unit": "year"}}, "spec.rateLimit.budget.unit", "'day'"),
        ({"budget": {"unit": "day"}}, "spec.rateLimit.budget.tokens", "required"),
        (
            {"requestsPerUnit": 1, "global": {"redis": {"address": "redis"}}},
            "spec.rateLimit.global.redis.address",
            "host:port",
        ),
        ({"requestsPerUnit": 1, "burst": 5}, "spec.rateLimit.burst", "unknown field"),
    ],
)
def test_validation_names_the_field(rate_limit, path, message):
    with pytest.raises(InvalidResources) as err:
        parse_document(tenant("a", rate_limit))
    text = str(err.value)
    assert path in text and message in text, text


def test_valid_rate_limit_round_trips_with_defaults():
    resource, _ = parse_document(
        tenant("a", {"requestsPerUnit": 60, "budget": {"tokens": 1_000_000}})
    )
    assert resource.to_dict()["spec"]["rateLimit"] == {
        "requestsPerUnit": 60,
        "unit": "second",
        "budget": {"tokens": 1_000_000, "unit": "day"},
    }
