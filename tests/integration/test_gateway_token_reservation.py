"""A request reserves every output token the engine may generate for it, before it runs: every
prompt of a completions list, every choice (``n``, ``best_of``), and the field the engine
honours on its API. Before, a list of 200 prompts with ``max_tokens: 100`` generated 20,000
tokens against a Tenant's 500 a day, and ``max_completion_tokens: 1`` with ``max_tokens: 5000``
on /v1/completions reserved 1 token and got 5,000. Real gateway, real ``llmplane.sim``."""

from __future__ import annotations

import orjson
import pytest

from llmplane.gateway import apikeys
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from tests.integration.openai_errors import assert_openai_error

MODEL = "tr-model"
LIMIT = 500  # output tokens (or budget tokens) a day


def tenant(key: apikeys.NewKey, rate_limit: dict) -> dict:
    return {
        "apiVersion": "llmplane.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": "team", "namespace": "default"},
        "spec": {
            "keys": [{"id": key.id, "salt": key.salt, "hash": key.hash}],
            "rateLimit": rate_limit,
        },
    }


RATE_LIMITS = {
    "output": {"outputTokensPerUnit": LIMIT, "unit": "day"},
    "budget": {"budget": {"tokens": LIMIT, "unit": "day"}},
}

# Each generates more than LIMIT output tokens on the engine; each must be refused whole.
TOO_LARGE = {
    "200 prompts": ("/v1/completions", {"prompt": ["say a"] * 200, "max_tokens": 100}),
    "token-id prompts": ("/v1/completions", {"prompt": [[1, 2, 3]] * 10, "max_tokens": 100}),
    "n": ("/v1/completions", {"prompt": "a", "max_tokens": 100, "n": 6}),
    "best_of": ("/v1/completions", {"prompt": "a", "max_tokens": 100, "best_of": 6}),
    "chat n": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "a"}], "max_tokens": 200, "n": 3},
    ),
    "completions honour max_tokens": (
        "/v1/completions",
        {"prompt": "a", "max_completion_tokens": 1, "max_tokens": 5000},
    ),
    "messages beside a prompt": (
        "/v1/completions",
        {
            "messages": [{"role": "user", "content": "a"}],
            "prompt": ["a", "b", "c"],
            "max_completion_tokens": 1,
            "max_tokens": 200,
        },
    ),
    "prompts without max_tokens": ("/v1/completions", {"prompt": ["a"] * 50}),
}


@pytest.fixture
async def limited(request, store, processes, gateways):
    engine = processes.sim(MODEL, "--time-scale", "0")
    store.apply(endpoint_object("r0", engine.address, MODEL))
    key = apikeys.new_key()
    store.apply(tenant(key, RATE_LIMITS[request.param]))
    gw = await gateways(store)
    return gw, engine, {"Authorization": f"Bearer {key.key}"}


async def served(client, engine) -> float:
    """Requests the engine finished (its ``vllm:request_success_total``)."""
    async with client.get(f"http://{engine.address}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


@pytest.mark.parametrize("limited", sorted(RATE_LIMITS), indirect=True)
async def test_requests_larger_than_the_limit_are_refused_before_they_run(limited, client):
    gw, engine, auth = limited
    url = f"http://127.0.0.1:{gw.port}"

    async def post(path: str, body: dict):
        async with client.post(url + path, json={"model": MODEL, **body}, headers=auth) as r:
            return r.status, r.headers, await r.read()

    before = await served(client, engine)
    for name, (path, body) in TOO_LARGE.items():
        status, headers, raw = await post(path, body)
        error = assert_openai_error(status, raw, 429, "rate_limit_exceeded")
        assert "Retry-After" not in headers, name  # too large: waiting would not help
        assert "must be reduced" in error["message"], (name, error)
    assert await served(client, engine) == before, "a refused request reached the engine"

    # What fits is served, and what it generated counts: 4 prompts x 100 = 400 of 500.
    status, _, raw = await post(
        "/v1/completions", {"prompt": ["a"] * 4, "max_tokens": 100, "ignore_eos": True}
    )
    assert status == 200, raw
    assert orjson.loads(raw)["usage"]["completion_tokens"] == 400
    # Two more prompts of 100 would fit the limit but not what is left of it: wait.
    status, headers, raw = await post("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 100})
    assert_openai_error(status, raw, 429, "rate_limit_exceeded")
    assert "Retry-After" in headers
