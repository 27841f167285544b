"""Global per-tenant limits (``Tenant.spec.rateLimit.global.redis``) against a real
``redis-server``: two gateway OS processes on one state directory share each tenant's
buckets and together admit exactly the tenant's requests per unit, and its input tokens and
token budget to within 1 %, under concurrent load through both; every refusal is a 429 with
Retry-After in OpenAI's shape."""

from __future__ import annotations

import asyncio
import shutil

import aiohttp
import orjson
import pytest

from llmplane.gateway import apikeys
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.store.paths import open_store
from llmplane.testing import Processes, gateway, sim_process
from tests.integration.metrics_pages import metric, scrape

MODEL = "tenant-redis-model"
REDIS = shutil.which("redis-server")

pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")


def tenant(name: str, key: apikeys.NewKey, rate_limit: dict) -> dict:
    return {
        "apiVersion": "llmplane.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "keys": [{"id": key.id, "salt": key.salt, "hash": key.hash}],
            "rateLimit": rate_limit,
        },
    }


KEYS = {name: apikeys.new_key() for name in ("requests", "tokens", "budget")}
LIMITS = {"requests": 30, "tokens": 5_000, "budget": 4_000}


@pytest.fixture(scope="module")
def two_gateways(tmp_path_factory, redis_server):
    state = tmp_path_factory.mktemp("state")
    with Processes() as group:
        engines = group.start(*(sim_process(MODEL, "--time-scale", "0") for _ in range(2)))
        store = open_store(state)
        for i, engine in enumerate(engines):
            store.apply(endpoint_object(f"sim{i}", engine.address, MODEL))
        glob = {"global": {"redis": {"address": redis_server.address}}, "unit": "day"}
        store.apply(tenant("requests", KEYS["requests"], {"requestsPerUnit": 30, **glob}))
        store.apply(tenant("tokens", KEYS["tokens"], {"inputTokensPerUnit": 5_000, **glob}))
        budget = {"requestsPerUnit": 100_000, "budget": {"tokens": 4_000, "unit": "day"}}
        store.apply(tenant("budget", KEYS["budget"], {**budget, **glob}))
        store.close()
        config = state / "gateway.yaml"
        config.write_text("gateway:\n  rateLimitRedisTimeout: 2.0\n")
        args = ("--config", str(config), "--no-access-log", "--log-level", "WARNING")
        yield group.start(*(gateway(*args, state_dir=state) for _ in range(2)))


async def send(session, address: str, name: str, tokens: int) -> tuple[int, dict, dict]:
    # The sim counts ceil(chars / 4) for a completion prompt, as the gateway estimates it.
    body = orjson.dumps({"model": MODEL, "prompt": "x" * (4 * tokens), "max_tokens": 1})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEYS[name].key}"}
    async with session.post(f"http://{address}/v1/completions", data=body, headers=headers) as r:
        return r.status, dict(r.headers), orjson.loads(await r.read())


async def load(two_gateways, name: str, workers: int, each: int) -> tuple[list[dict], list]:
    """``workers`` concurrent clients, alternating gateways; (usages admitted, refusals)."""
    admitted: list[dict] = []
    refused: list[tuple[dict, dict]] = []
    sizes = (100, 37)

    async def worker(session, k: int) -> None:
        for j in range(each):
            address = two_gateways[(k + j) % 2].address
            status, headers, body = await send(session, address, name, sizes[(k + j) % 2])
            if status == 200:
                admitted.append(body["usage"])
            else:
                assert status == 429, body
                refused.append((headers, body))

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        for gw in two_gateways:  # one through each first: both gateways take from the bucket
            status, _, body = await send(session, gw.address, name, 37)
            assert status == 200, body
            admitted.append(body["usage"])
        await asyncio.gather(*(worker(session, k) for k in range(workers)))
    return admitted, refused


def check_refusals(refused: list, kind: str) -> None:
    assert refused
    for headers, body in refused:
        error = body["error"]
        assert error["code"] == "rate_limit_exceeded" and error["type"] == kind, error
        assert int(headers["Retry-After"]) >= 1


async def test_requests_per_unit_exact_across_two_gateways(two_gateways):
    admitted, refused = await load(two_gateways, "requests", workers=12, each=5)
    assert len(admitted) == LIMITS["requests"]  # 62 sent, exactly 30 answered
    check_refusals(refused, "requests")
    assert all(h["x-ratelimit-limit-requests"] == "30" for h, _ in refused)
    async with aiohttp.ClientSession() as session:
        texts = [await scrape(session, g.address) for g in two_gateways]
    rejections = sum(
        metric(t, "llmplane_ratelimit_rejections_total", route="Tenant/requests") for t in texts
    )
    assert rejections == len(refused)
    assert sum(metric(t, "llmplane_ratelimit_redis_errors_total") for t in texts) == 0


async def test_input_tokens_and_budget_within_one_percent_across_two_gateways(two_gateways):
    # Refill over the test is negligible: 5,000 a day is 0.06 tokens a second.
    admitted, refused = await load(two_gateways, "tokens", workers=12, each=8)
    total = sum(u["prompt_tokens"] for u in admitted)
    assert LIMITS["tokens"] * 0.99 <= total <= LIMITS["tokens"] + 1, (total, len(admitted))
    check_refusals(refused, "tokens")

    admitted, refused = await load(two_gateways, "budget", workers=12, each=8)
    spent = sum(u["prompt_tokens"] + u["completion_tokens"] for u in admitted)
    assert LIMITS["budget"] * 0.99 <= spent <= LIMITS["budget"] + 1, (spent, len(admitted))
    check_refusals(refused, "tokens")
    assert all("token budget" in body["error"]["message"] for _, body in refused)
