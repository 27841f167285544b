"""Global token rate limits (``rateLimit.global.redis``) against a real ``redis-server``:
two gateway OS processes (``python -m llmplane.gateway.cli``) in front of real simulated
engines share one bucket and together admit the configured number of tokens (within 1 %)
under concurrent load; Redis killed mid-run: fail-open keeps serving and counts the errors,
and limiting is back once Redis is."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import aiohttp
import orjson
import pytest

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.gateway.errors import GatewayError
from llmplane.gateway.ratelimit import RateLimiter, RateLimitError, RedisBuckets
from llmplane.gateway.request import InferenceRequest
from llmplane.store.paths import open_store
from llmplane.testing import Processes, eventually, gateway, sim_process
from tests.integration.metrics_pages import metric, scrape
from tests.integration.redisserver import REDIS, free_port
from tests.ratelimit_requests import hook_ctx

KTHENA = "networking.serving.volcano.sh/v1alpha1"
MODEL = "rl-redis-model"

pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")


@pytest.fixture(scope="module")
def engines():
    with Processes() as group:
        yield group.start(*(sim_process(MODEL, "--time-scale", "0") for _ in range(2)))


def route(name: str, rate_limit: dict) -> dict:
    return {
        "apiVersion": KTHENA,
        "kind": "ModelRoute",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "modelName": name,
            "rules": [{"targetModels": [{"modelServerName": "srv"}]}],
            "rateLimit": rate_limit,
        },
    }


@pytest.fixture(scope="module")
def two_gateways(tmp_path_factory, redis_server, engines):
    """Two gateway processes on one store (SQLite) and one Redis."""
    state = tmp_path_factory.mktemp("state")
    store = open_store(state)
    for i, engine in enumerate(engines):
        store.apply(endpoint_object(f"sim{i}", engine.address, MODEL, labels={"app": "rl"}))
    store.apply(
        {
            "apiVersion": KTHENA,
            "kind": "ModelServer",
            "metadata": {"name": "srv", "namespace": "default"},
            "spec": {
                "model": MODEL,
                "inferenceEngine": "vLLM",
                "workloadSelector": {"matchLabels": {"app": "rl"}},
            },
        }
    )
    glob = {"redis": {"address": redis_server.address}}
    # 20,000 input tokens a day: refill (0.23 tokens/s) is negligible over the test.
    store.apply(route("shared", {"inputTokensPerUnit": 20_000, "unit": "day", "global": glob}))
    store.apply(route("failover", {"inputTokensPerUnit": 1_000, "unit": "day", "global": glob}))
    store.close()
    config = state / "gateway.yaml"
    # A generous per-call bound: on a loaded 2-CPU machine a 250 ms bound could fail open.
    config.write_text(
        "gateway:\n  rateLimitRedisTimeout: 2.0\n  rateLimitRedisRetryInterval: 0.3\n"
    )
    args = ("--config", str(config), "--no-access-log", "--log-level", "WARNING")
    with Processes() as group:
        yield group.start(*(gateway(*args, state_dir=state) for _ in range(2)))


def completion(model: str, tokens: int) -> bytes:
    # The sim counts ceil(chars / 4) for a completion prompt, as the gateway estimates it.
    return orjson.dumps({"model": model, "prompt": "x" * (4 * tokens), "max_tokens": 1})


async def send(session, address: str, body: bytes) -> tuple[int, dict, dict]:
    async with session.post(
        f"http://{address}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    ) as resp:
        return resp.status, dict(resp.headers), orjson.loads(await resp.read())


async def test_two_gateways_share_the_bucket_within_one_percent(two_gateways):
    limit = 20_000
    sizes = (100, 37)  # input tokens per request; the engine reports the same counts
    admitted: list[tuple[int, int]] = []  # (gateway index, prompt tokens)
    refused: list[dict] = []

    async def worker(session, gw: int, k: int) -> None:
        for j in range(40):
            size = sizes[(k + j) % 2]
            status, headers, body = await send(
                session, two_gateways[gw].address, completion("shared", size)
            )
            if status == 200:
                admitted.append((gw, body["usage"]["prompt_tokens"]))
            else:
                assert status == 429, body
                refused.append(headers)

    t0 = time.monotonic()
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        # One request through each gateway first: on a loaded machine one gateway's workers
        # could otherwise drain the shared bucket before the other's first request arrives.
        for gw in (0, 1):
            status, _, body = await send(
                session, two_gateways[gw].address, completion("shared", 37)
            )
            assert status == 200, body
            admitted.append((gw, body["usage"]["prompt_tokens"]))
        await asyncio.gather(*(worker(session, k % 2, k) for k in range(24)))
        texts = [await scrape(session, g.address) for g in two_gateways]
    elapsed = time.monotonic() - t0
    total = sum(tokens for _, tokens in admitted)
    refill = limit / 86400 * elapsed
    print(f"admitted {len(admitted)} requests, {total} tokens of {limit} in {elapsed:.1f} s")
    assert limit * 0.99 <= total <= limit * 1.01 + refill, (total, len(admitted), elapsed)
    assert total <= limit + refill  # in fact exact: never more than the bucket
    assert {gw for gw, _ in admitted} == {0, 1}  # both gateways admitted from the one bucket
    assert refused and all("Retry-After" in h for h in refused)
    assert all(h["x-ratelimit-limit-tokens"] == str(limit) for h in refused)
    for text in texts:
        assert metric(text, "llmplane_ratelimit_redis_errors_total") == 0
        assert metric(text, "llmplane_ratelimit_degraded_total") == 0
    rejected = sum(
        metric(t, "llmplane_ratelimit_rejections_total", route="ModelRoute/default/shared")
        for t in texts
    )
    assert rejected == len(refused)


async def test_redis_down_fails_open_and_limiting_returns_with_redis(two_gateways, redis_server):
    body = completion("failover", 100)
    async with aiohttp.ClientSession() as session:

        async def until_refused(limit_requests: int) -> int:
            for n in range(limit_requests):
                status, headers, _ = await send(session, two_gateways[n % 2].address, body)
                if status == 429:
                    assert "Retry-After" in headers
                    return n
                assert status == 200
            raise AssertionError(f"no 429 in {limit_requests} requests")

        assert await until_refused(20) == 10  # 1,000 tokens: ten requests of 100

        redis_server.kill()
        for n in range(20):  # fail-open: every request is served
            status, _, answer = await send(session, two_gateways[n % 2].address, body)
            assert status == 200, answer
        texts = [await scrape(session, g.address) for g in two_gateways]
        for text in texts:
            assert metric(text, "llmplane_ratelimit_redis_errors_total", op="reserve") >= 1
            assert metric(text, "llmplane_ratelimit_degraded_total", policy="open") >= 1

        redis_server.start()  # same port, empty: the bucket starts full again
        deadline = time.monotonic() + 15
        served = 0
        while True:
            status, _, _ = await send(session, two_gateways[served % 2].address, body)
            if status == 429:
                break
            assert status == 200
            served += 1
            assert time.monotonic() < deadline, "limiting did not come back with Redis"
            await asyncio.sleep(0.02)
        # Each gateway fails open until its next Redis call (after the retry interval)
        # reconnects; then the fresh bucket admits ten requests.
        assert served >= 10
        assert await until_refused(5) == 0  # and it stays limited


# --- the limiter against real Redis, in this process -----------------------------------------------


def chat(text: str, **extra) -> InferenceRequest:
    doc = {"model": "m", "messages": [{"role": "user", "content": text}], **extra}
    return InferenceRequest("/v1/chat/completions", {}, orjson.dumps(doc))


class _Decision:
    route = "ModelRoute/default/inproc#0"
    model = "m"


def limiter_for(address: str, unit: str = "minute", name: str = "inproc", **config) -> RateLimiter:
    limiter = RateLimiter(GatewayConfig(rate_limit_redis_retry_interval=0.2, **config))
    limiter.update(
        [
            route(
                name,
                {
                    "inputTokensPerUnit": 100,
                    "outputTokensPerUnit": 50,
                    "unit": unit,
                    "global": {"redis": {"address": address}},
                },
            )
        ]
    )
    return limiter


async def test_redis_scripts_reserve_settle_and_refuse(redis_server):
    import redis.asyncio as aioredis

    from llmplane.gateway.hooks import Usage

    client = aioredis.Redis(host="127.0.0.1", port=redis_server.port)
    await client.delete("llmplane:ratelimit:{default/inproc}:input")
    await client.delete("llmplane:ratelimit:{default/inproc}:output")
    limiter = limiter_for(redis_server.address)
    try:
        d = _Decision()
        req = chat("x" * 156, max_tokens=40)  # 40 in, 40 out
        res = await limiter.reserve(hook_ctx(req, d))
        assert res.taken[0].mode == "redis"
        assert res.response_headers["x-ratelimit-remaining-tokens-input"] == "60"
        assert res.response_headers["x-ratelimit-remaining-tokens-output"] == "10"
        # Output: 10 left, 40 wanted at 50/min -> 36 s; nothing was taken from input.
        with pytest.raises(RateLimitError) as err:
            await limiter.reserve(hook_ctx(chat("x" * 156, max_tokens=40), d))
        assert err.value.retry_after == 36
        assert err.value.headers["x-ratelimit-remaining-tokens-input"] == "60"
        # Settled: 70 real input (debit 30), 5 real output (35 back).
        limiter.settle(hook_ctx(req, d, 200), res, Usage(70, 5))
        await limiter.drain()
        level = float(await client.hget("llmplane:ratelimit:{default/inproc}:input", "level"))
        assert 30 <= level < 31  # 100 - 70 (+ a little refill)
        level = float(await client.hget("llmplane:ratelimit:{default/inproc}:output", "level"))
        assert 45 <= level < 46
        ttl = await client.pttl("llmplane:ratelimit:{default/inproc}:input")
        assert 0 < ttl <= 43_000  # expires once it would be full again (70 at 100/min) + 1 s
    finally:
        await limiter.close()
        await client.aclose()


async def test_a_per_second_bucket_refills_in_redis(redis_server):
    """A short window: the Redis bucket refills at its rate (50 output tokens a second), so a
    request refused now fits once enough has flowed back - not before, and not never."""
    import redis.asyncio as aioredis

    client = aioredis.Redis(host="127.0.0.1", port=redis_server.port)
    for direction in ("input", "output"):
        await client.delete(f"llmplane:ratelimit:{{default/persecond}}:{direction}")
    await client.aclose()
    limiter = limiter_for(redis_server.address, unit="second", name="persecond")

    class Decision:
        route = "ModelRoute/default/persecond#0"
        model = "m"

    async def remaining(want: int) -> int | None:
        """Output tokens left as a refused reservation of ``want`` reports them (None: fitted)."""
        try:
            await limiter.reserve(hook_ctx(chat("x", max_tokens=want), Decision()))
        except RateLimitError as err:
            return int(err.headers["x-ratelimit-remaining-tokens-output"])
        return None

    try:
        first = await limiter.reserve(
            hook_ctx(chat("x", max_tokens=40), Decision())
        )  # 40 of 50 output
        assert first.taken[0].mode == "redis"
        assert (left := await remaining(45)) is not None and left < 20  # 10 left, 45 wanted
        # Refilling at 50 a second, the level passes 20 within 0.2 s - long before the key
        # expires (1.8 s) and would start a full bucket, which a broken refill would wait for.
        await eventually(
            lambda: _between(remaining(45), 20, 45), 5, what="the level to rise with the refill"
        )
        await eventually(  # and the refused request fits once it refilled (0.7 s)
            lambda: _is_none(remaining(45)), 5, what="the request to fit after the refill"
        )
    finally:
        await limiter.close()


async def _between(value: Any, low: int, high: int) -> bool:
    v = await value
    return v is not None and low <= v < high


async def _is_none(value: Any) -> bool:
    return await value is None


async def test_failure_policies_against_an_unreachable_redis():
    dead = f"127.0.0.1:{free_port()}"
    closed = limiter_for(dead, rate_limit_redis_failure="closed")
    local = limiter_for(dead, rate_limit_redis_failure="local")
    opened = limiter_for(dead)
    try:
        with pytest.raises(GatewayError) as err:
            await closed.reserve(hook_ctx(chat("hi", max_tokens=1), _Decision()))
        assert err.value.status == 503 and err.value.code == "rate_limit_unavailable"
        res = await local.reserve(hook_ctx(chat("hi", max_tokens=50), _Decision()))
        assert res.taken[0].mode == "local"
        with pytest.raises(RateLimitError):  # this process's own bucket limits now
            await local.reserve(hook_ctx(chat("hi", max_tokens=1), _Decision()))
        t0 = time.monotonic()
        res = await opened.reserve(hook_ctx(chat("hi", max_tokens=50), _Decision()))
        assert res.taken[0].mode == "none"
        # Within the retry interval Redis is not asked again: no wait at all.
        for _ in range(100):
            assert (await opened.reserve(hook_ctx(chat("hi", max_tokens=50), _Decision()))).taken[
                0
            ].mode == "none"
        assert time.monotonic() - t0 < 1.0
    finally:
        for limiter in (closed, local, opened):
            await limiter.close()


async def test_a_blackholed_redis_costs_at_most_the_timeout_once_per_interval():
    # A listening socket that never answers: connect succeeds, the script never returns.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        limiter = limiter_for(address, rate_limit_redis_timeout=0.2)
        try:
            t0 = time.monotonic()
            assert (await limiter.reserve(hook_ctx(chat("hi", max_tokens=1), _Decision()))).taken[
                0
            ].mode == "none"
            first = time.monotonic() - t0
            assert 0.15 < first < 1.0
            t0 = time.monotonic()
            for _ in range(50):
                await limiter.reserve(hook_ctx(chat("hi", max_tokens=1), _Decision()))
            assert time.monotonic() - t0 < 0.2
        finally:
            await limiter.close()


def test_redis_buckets_parse_addresses():
    b = RedisBuckets("[::1]:6379", 0.1, 1.0, 4)
    assert b.pool.connection_kwargs["host"] == "::1"
    assert b.pool.connection_kwargs["port"] == 6379
