"""The gateway as a proxy: Playground routing, OpenAI errors, streaming, usage, the openai client.

Upstreams are real processes: ``llmplane/testing/upstream.py`` (a small vLLM-shaped server that
stands in for ``llmplane.sim`` where a test needs exact control of delays and failures).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import openai
import orjson
import pytest

from llmplane.controlplane.plan import MODEL_NAME_LABEL
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import Endpoint, StaticDiscovery
from llmplane.gateway.errors import GatewayError
from llmplane.testing import Processes, eventually, upstream_process
from tests.integration.openai_errors import assert_openai_error

MODEL = "llama3-8b"


def playground(name: str, model: str) -> dict:
    return {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Playground",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": 2, "modelClaim": {"modelName": model}},
    }


@pytest.fixture(scope="module")
def upstreams():
    with Processes() as group:
        yield group.start(*(upstream_process(MODEL, "--tokens", "5") for _ in range(2)))


def discovery(upstreams) -> StaticDiscovery:
    return StaticDiscovery(
        Endpoint(s.address, {MODEL_NAME_LABEL: MODEL}, MODEL, fixed_port=True) for s in upstreams
    )


@pytest.fixture
async def gateway(store, upstreams, gateways):
    store.apply(playground("llama", MODEL))
    store.apply(playground("pending", "qwen-pending"))
    # A Playground without a ready replica: the activator holds its requests this long.
    config = GatewayConfig(max_body_bytes=64 * 1024, activator_hold_timeout=0.2)
    return await gateways(store, discovery(upstreams), config=config)


def url(gw, path: str) -> str:
    return f"http://127.0.0.1:{gw.port}{path}"


async def post(client, gw, path, body, **kw):
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with client.post(
        url(gw, path), data=data, headers={"Content-Type": "application/json"}, **kw
    ) as r:
        return r.status, r.headers, await r.read()


async def test_playground_model_is_routable_and_relayed(gateway, client, upstreams):
    addresses = {s.address for s in upstreams}
    seen = set()
    # Ten at a time: the gateway counts its in-flight requests, so concurrent ones spread over
    # the replicas (one at a time, every pick is a random tie-break between idle replicas).
    answers = []
    for _ in range(2):
        answers += await asyncio.gather(
            *(
                post(
                    client,
                    gateway,
                    "/v1/chat/completions",
                    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                )
                for _ in range(10)
            )
        )
    for status, headers, body in answers:
        assert status == 200, body
        doc = orjson.loads(body)
        assert doc["model"] == MODEL
        assert doc["usage"]["completion_tokens"] == 5
        assert headers["x-llmplane-endpoint"] in addresses
        seen.add(headers["x-llmplane-endpoint"])
    assert seen == addresses  # load is spread


async def test_completions_and_embeddings(gateway, client):
    status, _, body = await post(
        client, gateway, "/v1/completions", {"model": MODEL, "prompt": "x"}
    )
    assert status == 200 and orjson.loads(body)["object"] == "text_completion"
    status, _, body = await post(client, gateway, "/v1/embeddings", {"model": MODEL, "input": "x"})
    assert status == 200 and orjson.loads(body)["data"][0]["embedding"]


async def test_models_lists_every_routable_name(gateway, client):
    async with client.get(url(gateway, "/v1/models")) as r:
        doc = await r.json()
    assert {m["id"] for m in doc["data"]} >= {MODEL, "qwen-pending"}


async def test_health_and_metrics(gateway, client):
    await post(client, gateway, "/v1/completions", {"model": MODEL, "prompt": "x"})
    async with client.get(url(gateway, "/health")) as r:
        assert r.status == 200
    async with client.get(url(gateway, "/metrics")) as r:
        text = await r.text()
    assert "llmplane_gateway_requests_total" in text
    assert f'model="{MODEL}"' in text
    assert "llmplane_gateway_scheduling_duration_seconds_bucket" in text


async def test_errors_have_the_openai_shape(gateway, client):
    status, _, body = await post(client, gateway, "/v1/chat/completions", b"{not json")
    assert_openai_error(status, body, 400, "invalid_json")
    status, _, body = await post(client, gateway, "/v1/chat/completions", {"messages": []})
    assert_openai_error(status, body, 400, "missing_model")
    status, _, body = await post(client, gateway, "/v1/chat/completions", {"model": "nope"})
    assert_openai_error(status, body, 404, "model_not_found")
    assert MODEL in orjson.loads(body)["error"]["message"]  # names what exists
    status, _, body = await post(
        client, gateway, "/v1/chat/completions", {"model": MODEL, "prompt": "x" * 70_000}
    )
    assert_openai_error(status, body, 413, "request_too_large")
    status, headers, body = await post(
        client, gateway, "/v1/chat/completions", {"model": "qwen-pending"}
    )
    assert_openai_error(status, body, 503, "no_ready_endpoint")  # after the hold timeout
    assert "qwen-pending" in orjson.loads(body)["error"]["message"]
    assert headers["retry-after"] == "5"
    status, _, body = await post(client, gateway, "/v2/nothing", {"model": MODEL})
    assert_openai_error(status, body, 404)


async def test_an_answer_over_max_response_bytes_is_a_502_not_held(
    store, upstreams, client, gateways
):
    """A unary answer larger than ``maxResponseBytes`` is refused as it arrives (502,
    ``response_too_large``), once: another replica's would be as large."""
    store.apply(playground("llama", MODEL))
    gw = await gateways(store, discovery(upstreams), config=GatewayConfig(max_response_bytes=64))
    body = {"model": MODEL, "prompt": "x"}
    before = [await served(client, s.address) for s in upstreams]
    status, _, answer = await post(client, gw, "/v1/completions", body)
    assert_openai_error(status, answer, 502, "response_too_large")
    assert "maxResponseBytes (64 bytes)" in orjson.loads(answer)["error"]["message"]
    after = [await served(client, s.address) for s in upstreams]
    assert sum(after) - sum(before) == 1  # not retried on the other replica


async def served(client, address: str) -> int:
    async with client.get(f"http://{address}/admin") as r:
        return (await r.json())["served"]


async def test_upstream_4xx_is_relayed_after_exactly_one_attempt(gateway, client, caplog):
    # The upstream does not serve this LoRA name: its own 404 comes back as it is, from the
    # first replica tried - a client error is not retried on the other one.
    # The table is patched by hand, so only once the replicas' first /v1/models reads (each
    # rebuilds the table, which would drop the patch) are in.
    await eventually(
        lambda: (
            len(states := gateway.registry.states) == 2
            and all(s.served_models is not None for s in states.values())
        ),
        what="both replicas' model lists read",
    )
    gateway.table.decisions["ghost"] = replace(gateway.table.decisions[MODEL], model="ghost")
    with caplog.at_level(logging.INFO, logger="llmplane.gateway.access"):
        status, headers, body = await post(
            client, gateway, "/v1/completions", {"model": "ghost", "prompt": "x"}
        )
    assert status == 404
    assert "does not exist" in orjson.loads(body)["error"]["message"]
    assert headers["x-llmplane-endpoint"]
    [line] = [orjson.loads(r.getMessage()) for r in caplog.records if r.name.endswith("access")]
    assert line["attempts"] == 1 and line["status"] == 404, line
    assert "failures" not in line, line
    retried = [
        sample
        for sample in gateway.metrics.render().decode().splitlines()
        if sample.startswith("llmplane_gateway_retries_total{")
    ]
    assert retried == [], retried


async def test_streaming_is_relayed_with_usage(gateway, client):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.post(url(gateway, "/v1/chat/completions"), json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        assert r.headers["x-llmplane-endpoint"]
        raw = await r.read()
    events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    assert orjson.loads(events[-2])["usage"]["completion_tokens"] == 5
    await asyncio.sleep(0)
    async with client.get(url(gateway, "/metrics")) as r:
        text = await r.text()
    assert "llmplane_gateway_time_to_first_token_seconds_count" in text
    assert f'llmplane_gateway_output_tokens_total{{model="{MODEL}"}}' in text


async def test_official_openai_client(gateway):
    client = openai.AsyncOpenAI(base_url=url(gateway, "/v1"), api_key="unused", max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.model == MODEL
        assert reply.usage.completion_tokens == 5
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage
        assert text == "ok " * 5
        assert usage is not None and usage.completion_tokens == 5
        models = await client.models.list()
        assert MODEL in {m.id for m in models.data}
        with pytest.raises(openai.NotFoundError) as err:
            await client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "x"}]
            )
        assert "does not exist" in str(err.value)
    finally:
        await client.close()


async def test_access_log_line_per_request(gateway, client, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="llmplane.gateway.access"):
        await post(client, gateway, "/v1/completions", {"model": MODEL, "prompt": "x"})
        await post(client, gateway, "/v1/completions", {"model": "nope", "prompt": "x"})
    lines = [
        orjson.loads(r.getMessage()) for r in caplog.records if r.name == "llmplane.gateway.access"
    ]
    assert len(lines) == 2
    ok, missing = lines
    assert ok["status"] == 200 and ok["route"] == f"Model/{MODEL}" and ok["endpoint"]
    assert ok["attempts"] == 1 and ok["sched_ms"] >= 0 and ok["total_ms"] > 0
    assert ok["scores"] and ok["profile"] == "default"
    assert ok["prompt_tokens"] > 0 and ok["completion_tokens"] == 5
    assert missing["status"] == 404 and "does not exist" in missing["error"]


class RecordingHook:
    def __init__(self):
        self.events = []

    async def reserve(self, ctx):
        ctx.inference.doc["stream_options"] = {"include_usage": True}
        ctx.inference.mark_dirty()
        self.events.append(("reserve", ctx.decision.model))
        return "token"

    def settle(self, ctx, reservation, usage):
        self.events.append(
            ("settle", reservation, usage.completion_tokens if usage else None, ctx.status)
        )


async def test_request_hooks_reserve_and_settle(store, upstreams, client, gateways, caplog):
    hook = RecordingHook()
    gw = await gateways(store, discovery(upstreams), config=GatewayConfig(hooks=[hook]))
    # The hook turned usage on for a stream the client sent without it.
    async with client.post(
        url(gw, "/v1/completions"), json={"model": MODEL, "prompt": "x", "stream": True}
    ) as r:
        raw = await r.read()
    assert b'"usage":{' in raw
    assert hook.events == [("reserve", MODEL), ("settle", "token", 5, 200)]

    class Refuse:
        async def reserve(self, ctx):
            raise GatewayError(429, "token budget exhausted", "rate_limited", retry_after=7)

        def settle(self, *args):
            raise AssertionError("not reserved, not settled")

    gw.hooks = [Refuse()]
    status, headers, body = await post(
        client, gw, "/v1/completions", {"model": MODEL, "prompt": "x"}
    )
    assert headers["Retry-After"] == "7"
    assert_openai_error(status, body, 429, "rate_limited")

    class Broken:
        async def reserve(self, ctx):
            raise RuntimeError("a bug in a hook")

        def settle(self, *args):
            raise AssertionError("not reserved, not settled")

    gw.hooks = [Broken()]
    with caplog.at_level(logging.CRITICAL, logger="llmplane.gateway"):  # the traceback it logs
        status, _, body = await post(client, gw, "/v1/completions", {"model": MODEL, "prompt": "x"})
    assert_openai_error(status, body, 500)
