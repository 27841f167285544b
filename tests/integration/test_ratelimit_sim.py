"""Token rate limits (local buckets) through the gateway in front of a real simulated engine
(``python -m llmplane.sim``): 429 with Retry-After and x-ratelimit headers, settlement from
the engine's usage (overuse debited), streams with and without include_usage."""

from __future__ import annotations

import math

import orjson
import pytest

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import Endpoint, StaticDiscovery
from llmplane.store.sqlite import SQLiteStore
from llmplane.testing import sim
from tests.integration.openai_errors import assert_openai_error

KTHENA = "networking.serving.volcano.sh/v1alpha1"
MODEL = "rl-model"
MAX_MODEL_LEN = 128
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def engine():
    with sim(MODEL, "--time-scale", "0", "--max-model-len", str(MAX_MODEL_LEN)) as server:
        yield server


def objects(rate_limit: dict) -> list[dict]:
    return [
        {
            "apiVersion": KTHENA,
            "kind": "ModelServer",
            "metadata": {"name": "srv", "namespace": "default"},
            "spec": {
                "model": MODEL,
                "inferenceEngine": "vLLM",
                "workloadSelector": {"matchLabels": {"app": "rl"}},
            },
        },
        {
            "apiVersion": KTHENA,
            "kind": "ModelRoute",
            "metadata": {"name": "limited", "namespace": "default"},
            "spec": {
                "modelName": "limited",
                "rules": [{"targetModels": [{"modelServerName": "srv"}]}],
                "rateLimit": rate_limit,
            },
        },
    ]


@pytest.fixture
def stores():
    """Stores opened by the test, closed after its gateways (set up first, torn down last)."""
    opened: list[SQLiteStore] = []
    yield opened
    for store in opened:
        store.close()


@pytest.fixture
async def make_gateway(tmp_path, engine, stores, gateways):
    async def make(rate_limit: dict, **config):
        store = SQLiteStore(tmp_path / f"db{len(stores)}.sqlite")
        stores.append(store)
        for obj in objects(rate_limit):
            store.apply(obj)
        discovery = StaticDiscovery(
            [Endpoint(engine.address, {"app": "rl"}, MODEL, fixed_port=True)]
        )
        return await gateways(store, discovery, config=GatewayConfig(**config))

    return make


def chat(text: str, **extra) -> dict:
    return {"model": "limited", "messages": [{"role": "user", "content": text}], **extra}


async def post(client, gw, body):
    async with client.post(
        f"http://127.0.0.1:{gw.port}/v1/chat/completions", data=orjson.dumps(body), headers=JSON
    ) as resp:
        return resp.status, resp.headers, await resp.read()


async def stream(client, gw, body):
    """(headers, the SSE events' data payloads)."""
    async with client.post(
        f"http://127.0.0.1:{gw.port}/v1/chat/completions", data=orjson.dumps(body), headers=JSON
    ) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.read()
    events = [e for e in raw.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events)
    return resp.headers, [e[6:] for e in events]


async def metrics(client, gw) -> str:
    async with client.get(f"http://127.0.0.1:{gw.port}/metrics") as resp:
        return await resp.text()


async def test_429_with_retry_after_and_headers_once_the_input_budget_is_spent(
    make_gateway, client
):
    gw = await make_gateway({"inputTokensPerUnit": 300, "unit": "hour"})
    text = "x" * 396  # estimate: ("user" + 396 chars) / 4 = 100 tokens
    status, headers, body = await post(client, gw, chat(text, max_tokens=2))
    assert status == 200, body
    used1 = orjson.loads(body)["usage"]["prompt_tokens"]
    assert used1 > 100  # the sim's chat template counts more than the estimate
    assert headers["x-ratelimit-limit-tokens"] == "300"
    assert headers["x-ratelimit-remaining-tokens"] == "200"  # 300 - the estimate, at admission
    status, headers, body = await post(client, gw, chat(text, max_tokens=2))
    assert status == 200, body
    # The first request was settled with the engine's count, not the estimate.
    assert headers["x-ratelimit-remaining-tokens"] == str(300 - used1 - 100)
    used2 = orjson.loads(body)["usage"]["prompt_tokens"]
    left = 300 - used1 - used2
    status, headers, body = await post(client, gw, chat(text, max_tokens=2))
    err = assert_openai_error(status, body, 429, "rate_limit_exceeded")
    assert f"Limit 300, Used {300 - left}, Requested 100" in err["message"]
    # Whole seconds, rounded up, until the missing tokens have refilled at 300/hour.
    assert headers["Retry-After"] == str(math.ceil((100 - left) / (300 / 3600)))
    assert headers["x-ratelimit-remaining-tokens"] == str(left)
    assert headers["x-ratelimit-limit-tokens-input"] == "300"
    assert headers["x-ratelimit-reset-tokens"].endswith("s")
    text_metrics = await metrics(client, gw)
    assert (
        'llmplane_ratelimit_rejections_total{direction="input",reason="exhausted",'
        'route="ModelRoute/default/limited"} 1.0' in text_metrics
    )
    # Still refused: nothing refills that fast (300 per hour).
    status, _, _ = await post(client, gw, chat(text, max_tokens=2))
    assert status == 429


async def test_a_request_that_can_never_fit_is_refused_at_once(make_gateway, client):
    gw = await make_gateway({"outputTokensPerUnit": 50, "unit": "minute"})
    status, headers, body = await post(client, gw, chat("hi", max_tokens=51))
    assert "Retry-After" not in headers
    err = assert_openai_error(status, body, 429, "rate_limit_exceeded")
    assert "Request too large" in err["message"] and "Requested 51" in err["message"]
    assert 'reason="too_large"' in await metrics(client, gw)
    # Without max_tokens the default reservation (256) is capped at the bucket: admitted.
    status, headers, body = await post(client, gw, chat("hi"))
    assert status == 200, body
    assert headers["x-ratelimit-remaining-tokens"] == "0"


async def test_overuse_is_debited_from_the_next_budget(make_gateway, client):
    gw = await make_gateway(
        {"outputTokensPerUnit": 1000, "unit": "hour"}, rate_limit_default_output_tokens=16
    )
    # No max_tokens: 16 reserved, but the engine generates up to the context length.
    status, headers, body = await post(client, gw, chat("hi", ignore_eos=True))
    assert status == 200, body
    assert headers["x-ratelimit-remaining-tokens-output"] == str(1000 - 16)
    used = orjson.loads(body)["usage"]["completion_tokens"]
    assert used > 100  # far over the reservation
    status, headers, body = await post(client, gw, chat("hi", max_tokens=4))
    assert status == 200, body
    # Kthena would show 1000 - 16 - 4 here: the overuse would never be counted.
    assert headers["x-ratelimit-remaining-tokens-output"] == str(1000 - used - 4)


async def test_stream_without_include_usage_gets_no_usage_chunk_but_is_counted(
    make_gateway, client
):
    gw = await make_gateway(
        {"outputTokensPerUnit": 1000, "unit": "hour"}, rate_limit_default_output_tokens=16
    )
    headers, events = await stream(client, gw, chat("hi", stream=True, ignore_eos=True))
    assert headers["x-ratelimit-remaining-tokens-output"] == str(1000 - 16)
    assert events[-1] == b"[DONE]"
    docs = [orjson.loads(e) for e in events[:-1]]
    assert all(d["choices"] for d in docs), "the usage-only chunk reached the client"
    assert all("usage" not in d for d in docs)
    tokens = sum(1 for d in docs if d["choices"][0]["delta"].get("content"))
    assert tokens > 100
    # Counted all the same: the next reservation sees the streamed tokens.
    status, headers, body = await post(client, gw, chat("hi", max_tokens=4))
    assert status == 200, body
    # Every streamed token has its chunk: the bucket was settled with exactly that many.
    assert headers["x-ratelimit-remaining-tokens-output"] == str(1000 - tokens - 4)


async def test_stream_with_include_usage_gets_it(make_gateway, client):
    gw = await make_gateway({"outputTokensPerUnit": 1000, "unit": "hour"})
    _, events = await stream(
        client,
        gw,
        chat("hi", stream=True, max_tokens=7, stream_options={"include_usage": True}),
    )
    assert events[-1] == b"[DONE]"
    last = orjson.loads(events[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] <= 7
    status, headers, _ = await post(client, gw, chat("hi", max_tokens=1))
    assert status == 200
    used = last["usage"]["completion_tokens"]
    assert headers["x-ratelimit-remaining-tokens-output"] == str(1000 - used - 1)


async def test_unlimited_routes_are_untouched(make_gateway, client, engine):
    gw = await make_gateway({"inputTokensPerUnit": 10})
    # The engine's own name resolves to the plain endpoint (no ModelRoute): no limit, no headers.
    async with client.post(
        f"http://127.0.0.1:{gw.port}/v1/chat/completions",
        data=orjson.dumps({**chat("x" * 400, max_tokens=1), "model": MODEL}),
        headers=JSON,
    ) as resp:
        assert resp.status == 200
        assert "x-ratelimit-limit-tokens" not in resp.headers
