"""The gateway's count of prompt tokens waiting for their first byte (the autoscaling signal
``llmplane_gateway_endpoint_prefill_tokens``) on the plain proxy path: an in-process gateway
in front of the stand-in upstream (``llmplane.testing.upstream``, exact delays: 4 s a
request, a stream's spread over its chunks). A stream's prompt counts from the send to its
first chunk, not to its end; a non-streamed request's until its answer. The same number shows
on ``/metrics`` (``/autoscaling/signals``, which has it per workload, in
test_up_autoscale_roles.py)."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.testing import eventually

MODEL = "m"
PROMPT = "tokens " * 400  # 2,800 bytes: 700 tokens at 4 bytes a token


async def exported(client: aiohttp.ClientSession, url: str) -> list[float]:
    """``llmplane_gateway_endpoint_prefill_tokens`` on the gateway's ``/metrics``."""
    async with client.get(f"{url}/metrics") as r:
        text = await r.text()
    return [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "llmplane_gateway_endpoint_prefill_tokens"
    ]


async def test_prompt_tokens_count_until_the_first_byte(gateways, store, processes, client):
    upstream = processes.upstream(MODEL, "--delay", "4")
    store.apply(endpoint_object(MODEL, upstream.address, MODEL, engine="vllm"))
    gw = await gateways(store)
    url = f"http://127.0.0.1:{gw.port}"
    await eventually(lambda: gw.registry.states, what="the endpoint discovered")
    state = next(iter(gw.registry.states.values()))
    assert await exported(client, url) == [0]

    # A stream of 4 chunks, one a second: its prompt counts until the first.
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "stream": True}
    at_first_chunk: list[tuple[int, int]] = []  # (prefill tokens, in flight) as it arrived

    async def stream() -> None:
        async with client.post(f"{url}/v1/completions", json=body) as r:
            assert r.status == 200
            await r.content.readuntil(b"\n\n")
            at_first_chunk.append((state.prefill_tokens, state.inflight))
            await r.read()

    streaming = asyncio.create_task(stream())
    sent = await eventually(lambda: state.prefill_tokens, what="the prompt counted")
    assert 700 <= sent <= 720, sent  # the body's bytes / 4: the prompt and a few fields
    assert await exported(client, url) == [sent]
    assert not at_first_chunk
    await streaming
    assert at_first_chunk == [(0, 1)]  # uncounted at its first chunk, still in flight

    # Not streamed: the answer is its first byte.
    unary = {**body, "stream": False}
    answer = asyncio.create_task(client.post(f"{url}/v1/completions", json=unary))
    await eventually(lambda: state.prefill_tokens > 0, what="a unary request's prompt counted")
    assert not answer.done()
    async with await answer as r:
        assert r.status == 200
    assert state.prefill_tokens == 0 and state.inflight == 0
    assert await exported(client, url) == [0]
