"""Token rate limits: bucket math, settlement, Retry-After and headers, the estimate rule,
the usage-chunk filter and the limiter hook on local buckets (fake clock)."""

from __future__ import annotations

import math

import orjson
import pytest

from llmplane.gateway.config import GatewayConfig, config_from_dict
from llmplane.gateway.hooks import Usage
from llmplane.gateway.ratelimit import RateLimiter, RateLimitError
from llmplane.gateway.ratelimit.buckets import (
    BucketState,
    TokenBucket,
    duration,
    rate_headers,
    reserve_local,
    retry_after,
    settle_deltas,
)
from llmplane.gateway.ratelimit.limits import output_reservation, route_limits
from llmplane.gateway.ratelimit.usage_filter import UsageChunkFilter, inject_include_usage
from llmplane.gateway.tokens import TokenCounter, estimate_tokens
from tests.ratelimit_requests import Clock, chat, hook_ctx, route

# --- the bucket ---------------------------------------------------------------------------------


def test_bucket_starts_full_and_refills_at_rate_up_to_burst():
    b = TokenBucket(rate=10.0, burst=100, now=0.0)
    assert b.level == 100
    ok, _ = reserve_local([("input", b, 100)], 0.0)
    assert ok and b.level == 0
    b.refill(2.5)
    assert b.level == pytest.approx(25)
    b.refill(1000.0)
    assert b.level == 100  # never above the burst


def test_reservation_that_does_not_fit_takes_nothing_and_reports_the_wait():
    b = TokenBucket(10.0, 100, 0.0)
    reserve_local([("input", b, 70)], 0.0)
    ok, states = reserve_local([("input", b, 50)], 0.0)
    assert not ok and b.level == 30
    assert states[0].wait == pytest.approx(2.0)  # 20 missing at 10/s
    assert retry_after(states) == 2


def test_both_directions_are_taken_together_or_not_at_all():
    i = TokenBucket(10.0, 100, 0.0)
    o = TokenBucket(1.0, 10, 0.0)
    ok, states = reserve_local([("input", i, 50), ("output", o, 20)], 0.0)
    assert not ok
    assert i.level == 100 and o.level == 10  # the input was not taken either
    assert [s.direction for s in states if s.wait] == ["output"]
    assert retry_after(states) == 10


def test_settle_refunds_unused_up_to_burst_and_debits_overuse_below_zero():
    b = TokenBucket(1.0, 100, 0.0)
    reserve_local([("output", b, 80)], 0.0)
    b.adjust(+60, 0.0)  # reserved 80, used 20
    assert b.level == 80
    b.adjust(+1000, 0.0)
    assert b.level == 100  # a refund never exceeds the burst
    reserve_local([("output", b, 100)], 0.0)
    b.adjust(-50, 0.0)  # used 150 of 100 reserved
    assert b.level == -50
    ok, states = reserve_local([("output", b, 10)], 0.0)
    assert not ok and states[0].wait == pytest.approx(60.0)  # -50 -> 10 at 1/s


def test_month_unit_is_thirty_days():
    limits = route_limits([route("r", {"outputTokensPerUnit": 2_592_000, "unit": "month"})])
    limit = limits["ModelRoute/default/r"]
    assert limit.period == 30 * 86400
    assert limit.limit("output") / limit.period == pytest.approx(1.0)  # one token a second
    assert limit.limit("input") is None


def test_lowered_limit_caps_the_level():
    b = TokenBucket(10.0, 100, 0.0)
    b.burst = 40
    b.refill(0.0)
    assert b.level == 40


def test_settle_deltas():
    amounts = [("input", 100), ("output", 50)]
    assert settle_deltas(amounts, 90, 20, 200) == [("input", 10), ("output", 30)]
    assert settle_deltas(amounts, 120, 80, 200) == [("input", -20), ("output", -30)]
    assert settle_deltas(amounts, 100, 50, 200) == []
    # no prompt count: the input estimate stands
    assert settle_deltas(amounts, 0, 10, 200) == [("output", 40)]
    # failed without usage: everything back; success or client gone without usage: kept
    assert settle_deltas(amounts, None, None, 502) == amounts
    assert settle_deltas(amounts, None, None, 429) == amounts
    assert settle_deltas(amounts, None, None, 200) == []
    assert settle_deltas(amounts, None, None, 499) == []


# --- Retry-After and headers ----------------------------------------------------------------------


def test_retry_after_is_whole_seconds_rounded_up_at_least_one():
    def st(wait):
        return BucketState("input", 10, 1.0, 0, wait)

    assert retry_after([st(0.2)]) == 1
    assert retry_after([st(1.0)]) == 1
    assert retry_after([st(1.01)]) == 2
    assert retry_after([st(0.5), st(7.3)]) == 8


def test_duration_is_openai_style():
    assert duration(0) == "0s"
    assert duration(0.0123) == "13ms"
    assert duration(1) == "1s"
    assert duration(1.5) == "1.5s"
    assert duration(0.0004) == "1ms"  # rounded up to whole milliseconds, at least 1
    assert duration(0.999) == "999ms"
    assert duration(12.3456) == "12.346s"  # three decimals, trailing zeros dropped
    assert duration(1.05) == "1.05s"
    assert duration(754.125) == "12m34.125s"
    assert duration(7384.5) == "2h3m4.5s"
    assert duration(360) == "6m0s"
    assert duration(3723) == "1h2m3s"
    assert duration(30 * 86400) == "720h0m0s"


def test_rate_headers_main_is_the_scarcer_direction():
    i = BucketState("input", 1000, 1.0, 900.7)
    o = BucketState("output", 100, 0.5, 10)
    h = rate_headers([i, o])
    assert h["x-ratelimit-limit-tokens"] == "100"
    assert h["x-ratelimit-remaining-tokens"] == "10"
    assert h["x-ratelimit-reset-tokens"] == "3m0s"  # 90 tokens at 0.5/s
    assert h["x-ratelimit-remaining-tokens-input"] == "900"
    assert h["x-ratelimit-reset-tokens-input"] == "1m39.3s"
    assert h["x-ratelimit-limit-tokens-output"] == "100"
    neg = rate_headers([BucketState("output", 100, 1.0, -5)])
    assert neg["x-ratelimit-remaining-tokens"] == "0"


# --- what is reserved ---------------------------------------------------------------------------


def test_estimate_counts_every_message_with_roles():
    doc = {
        "messages": [
            {"role": "system", "content": "be brief"},  # 6 + 8
            {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url"}]},
            {"role": "assistant", "name": "bot", "content": None},  # 9 + 3
        ]
    }
    assert estimate_tokens(doc) == math.ceil((6 + 8 + 4 + 5 + 9 + 3) / 4)
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert estimate_tokens({**doc, "tools": tools}) == math.ceil(
        (35 + len(orjson.dumps(tools))) / 4
    )


def test_estimate_prompts_and_token_ids():
    assert estimate_tokens({"prompt": "x" * 9}) == 3
    assert estimate_tokens({"prompt": ["abcd", "abcd"]}) == 2
    assert estimate_tokens({"prompt": [1, 2, 3]}) == 3  # token ids are exact
    assert estimate_tokens({"prompt": [[1, 2], [3]]}) == 3
    assert estimate_tokens({"input": "abcdefgh"}) == 2
    assert estimate_tokens({}) == 0


def test_token_counter_without_tokenizers_estimates(tmp_path):
    counter = TokenCounter({"m": str(tmp_path / "missing")})
    assert counter.count({"prompt": "x" * 8}, "m") == 2


def test_output_reservation():
    assert output_reservation({"max_tokens": 50}, 256, 1000) == 50
    assert output_reservation({"max_completion_tokens": 30, "max_tokens": 50}, 256, 1000) == 30
    assert output_reservation({"max_tokens": 50, "n": 3}, 256, 1000) == 150
    assert output_reservation({}, 256, 1000) == 256
    assert output_reservation({}, 256, 100) == 100  # the default never exceeds the bucket
    assert output_reservation({"max_tokens": 5000}, 256, 100) == 5000  # asked: may not fit
    # Every prompt and every choice the engine generates, by the field it honours on its API.
    prompts = {"prompt": ["a", "b", "c"], "max_tokens": 10}
    assert output_reservation(prompts, 256, 1000) == 30
    assert output_reservation({**prompts, "prompt": [[1, 2], [3]]}, 256, 1000) == 20
    assert output_reservation({**prompts, "prompt": [1, 2, 3]}, 256, 1000) == 10  # one prompt
    assert output_reservation({**prompts, "n": 2, "best_of": 4}, 256, 1000) == 120
    assert output_reservation({"prompt": ["a"] * 5}, 256, 100) == 500  # the default per prompt
    completions = {"prompt": "a", "max_completion_tokens": 1, "max_tokens": 5000}
    assert output_reservation(completions, 256, 100) == 5000  # completions honour max_tokens
    chat = {"messages": [], "max_completion_tokens": 1, "max_tokens": 5000}
    assert output_reservation(chat, 256, 100) == 1  # chat honours max_completion_tokens
    assert output_reservation({**chat, "prompt": ["a", "b"]}, 256, 100) == 10000  # either API


def test_inject_include_usage():
    doc: dict = {"stream": True}
    assert inject_include_usage(doc) and doc["stream_options"] == {"include_usage": True}
    doc = {"stream_options": {"include_usage": False, "continuous_usage_stats": False}}
    assert inject_include_usage(doc)
    assert doc["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
    doc = {"stream_options": {"include_usage": True}}
    assert not inject_include_usage(doc)


# --- the usage-chunk filter ---------------------------------------------------------------------

CHUNK = b'data: {"id":"1","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
USAGE = b'data: {"id":"1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
DONE = b"data: [DONE]\n\n"


def test_filter_drops_only_the_usage_only_chunk():
    f = UsageChunkFilter()
    assert f.feed(CHUNK) == CHUNK
    assert f.feed(USAGE + DONE) == DONE
    assert f.flush() == b""
    assert f.dropped == 1


def test_filter_keeps_usage_on_chunks_with_choices_and_other_bytes_exactly():
    with_usage = b'data: {"choices":[{"index":0}],"usage":{"prompt_tokens":1}}\n\n'
    comment = b": keep-alive\n\n"
    f = UsageChunkFilter()
    assert f.feed(comment + with_usage) == comment + with_usage


def test_filter_reassembles_events_split_across_reads():
    stream = CHUNK + CHUNK + USAGE + DONE
    for size in (1, 3, 7, 50):
        f = UsageChunkFilter()
        out = b"".join(f.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        out += f.flush()
        assert out == CHUNK + CHUNK + DONE, size


def test_filter_handles_crlf_events_and_flushes_a_truncated_tail():
    crlf = USAGE.replace(b"\n\n", b"\r\n\r\n")
    f = UsageChunkFilter()
    assert f.feed(crlf + b"data: {partial") == b""
    assert f.flush() == b"data: {partial"


# --- the hook, local buckets ----------------------------------------------------------------------


class _Decision:
    def __init__(self, route, model="m"):
        self.route = route
        self.model = model


async def test_limiter_admits_refuses_settles_and_refills():
    clock = Clock()
    limiter = RateLimiter(GatewayConfig(), clock=clock)
    limiter.update([route("r", {"inputTokensPerUnit": 100, "outputTokensPerUnit": 60})])
    d = _Decision("ModelRoute/default/r#0")
    req = chat("x" * 156, max_tokens=40)  # ("user" + 156 chars) / 4 = 40 input tokens
    res = await limiter.reserve(hook_ctx(req, d))
    assert res.taken[0].amounts == [("input", 40), ("output", 40)]
    assert res.response_headers["x-ratelimit-remaining-tokens-input"] == "60"
    assert res.response_headers["x-ratelimit-remaining-tokens-output"] == "20"
    with pytest.raises(RateLimitError) as err:
        await limiter.reserve(hook_ctx(chat("x" * 156, max_tokens=40), d))
    e = err.value
    assert e.status == 429 and e.code == "rate_limit_exceeded" and e.type == "tokens"
    # output 20 left, 40 wanted, 60 per second -> 1/3 s -> Retry-After 1
    assert e.retry_after == 1
    assert e.headers["x-ratelimit-remaining-tokens"] == "20"
    assert "Limit 60, Used 40, Requested 40" in e.message
    body = orjson.loads(e.body())["error"]
    assert body["type"] == "tokens" and body["param"] is None
    # The first response used 10 output tokens: 30 come back.
    limiter.settle(hook_ctx(req, d, 200), res, Usage(40, 10))
    res2 = await limiter.reserve(hook_ctx(chat("x" * 156, max_tokens=40), d))
    assert res2.response_headers["x-ratelimit-remaining-tokens-output"] == "10"
    # 2 s later both buckets are full again (second unit).
    clock.now += 2
    res3 = await limiter.reserve(hook_ctx(chat("x" * 156, max_tokens=40), d))
    assert res3.response_headers["x-ratelimit-remaining-tokens-output"] == "20"


async def test_limiter_debits_overuse_and_input_from_usage():
    clock = Clock()
    limiter = RateLimiter(GatewayConfig(rate_limit_default_output_tokens=10), clock=clock)
    limiter.update([route("r", {"inputTokensPerUnit": 1000, "outputTokensPerUnit": 100})])
    d = _Decision("ModelRoute/default/r#0")
    req = chat("hi")  # no max_tokens: 10 reserved
    res = await limiter.reserve(hook_ctx(req, d))
    assert dict(res.taken[0].amounts)["output"] == 10
    limiter.settle(hook_ctx(req, d, 200), res, Usage(500, 95))  # real: 500 in, 95 out
    left = await limiter.reserve(hook_ctx(chat("hi", max_tokens=1), d))
    assert left.response_headers["x-ratelimit-remaining-tokens-output"] == "4"  # 100-95-1
    assert left.response_headers["x-ratelimit-remaining-tokens-input"] == "498"  # 1000-500-2


async def test_limiter_refuses_what_can_never_fit_without_retry_after():
    limiter = RateLimiter(GatewayConfig(), clock=Clock())
    limiter.update([route("r", {"outputTokensPerUnit": 100, "unit": "minute"})])
    with pytest.raises(RateLimitError) as err:
        await limiter.reserve(
            hook_ctx(chat("hi", max_tokens=101), _Decision("ModelRoute/default/r#0"))
        )
    assert err.value.retry_after is None
    assert (
        "Request too large" in err.value.message and "Limit 100, Requested 101" in err.value.message
    )
    resp = err.value.response()
    assert "Retry-After" not in resp.headers
    assert resp.headers["x-ratelimit-limit-tokens"] == "100"


async def test_limiter_ignores_unlimited_routes_and_failed_requests_refund():
    limiter = RateLimiter(GatewayConfig(), clock=Clock())
    limiter.update([route("r", {"inputTokensPerUnit": 10})])
    assert (
        await limiter.reserve(hook_ctx(chat("hi"), _Decision("ModelRoute/default/other#0"))) is None
    )
    assert await limiter.reserve(hook_ctx(chat("hi"), _Decision("Model/m"))) is None
    d = _Decision("ModelRoute/default/r#0")
    req = chat("x" * 36)  # 10 tokens: the whole bucket
    res = await limiter.reserve(hook_ctx(req, d))
    limiter.settle(hook_ctx(req, d, 503), res, None)
    assert await limiter.reserve(hook_ctx(chat("x" * 36), d)) is not None  # refunded


async def test_limiter_injects_include_usage_for_streams_only_when_missing():
    limiter = RateLimiter(GatewayConfig(), clock=Clock())
    limiter.update([route("r", {"outputTokensPerUnit": 1000})])
    d = _Decision("ModelRoute/default/r#0")
    req = chat("hi", stream=True)
    res = await limiter.reserve(hook_ctx(req, d))
    assert req.dirty and req.doc["stream_options"] == {"include_usage": True}
    assert isinstance(res.stream_filter, UsageChunkFilter)
    req = chat("hi", stream=True, stream_options={"include_usage": True})
    res = await limiter.reserve(hook_ctx(req, d))
    assert not req.dirty and res.stream_filter is None


def test_config_settings_and_bad_policy():
    c = config_from_dict(
        {"gateway": {"rateLimitRedisFailure": "closed", "rateLimitDefaultOutputTokens": 64}}
    )
    assert c.rate_limit_redis_failure == "closed" and c.rate_limit_default_output_tokens == 64
    with pytest.raises(ValueError, match="rateLimitRedisFailure"):
        RateLimiter(GatewayConfig(rate_limit_redis_failure="maybe"))


def test_invalid_rate_limits_are_ignored():
    assert route_limits([route("r", {"unit": "minute"})]) == {}  # neither direction
    assert route_limits([route("r", {"inputTokensPerUnit": 0})]) == {}
    assert "ModelRoute/ns/r" in route_limits([route("r", {"inputTokensPerUnit": 5}, "ns")])
