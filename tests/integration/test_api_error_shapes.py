"""The gateway's refusals as the official clients see them: on ``/v1/messages`` in Anthropic's
shape (the ``anthropic`` client raises the class for the status and reads ``error.type``), on
``/v1/responses`` in OpenAI's (the ``openai`` client's class and ``code``). Refusals: no key
401, no ready replica 503, a Sheddable request over a saturated replica 429. An in-process
gateway in front of a real sim replica (the endpoint picker's, through Envoy, are in
test_epp_envoy.py)."""

from __future__ import annotations

import asyncio

import anthropic
import openai
import pytest

from llmplane.gateway import apikeys
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.testing import eventually
from tests.integration.gie_objects import inference_model, pool

BUSY = {"app": "busy"}


async def test_refusals_in_each_apis_shape(store, processes, gateways):
    # One running sequence at a time, 20 ms a token: a few requests make a queue.
    busy = processes.sim("busy", "--max-num-seqs", "1", "--step-time", "0.02")
    store.apply(endpoint_object("busy", busy.address, "busy", labels=BUSY))
    made = apikeys.new_key()
    for obj in (
        pool("busy", BUSY),
        pool("empty", {"app": "nobody"}),  # selects no replica
        inference_model("batch", "busy", [{"name": "busy"}], "Sheddable"),
        inference_model("chat", "busy", [{"name": "busy"}]),
        inference_model("nowhere", "empty", [{"name": "gone"}]),
        {
            "apiVersion": "llmplane.io/v1alpha1",
            "kind": "Tenant",
            "metadata": {"name": "team", "namespace": "default"},
            "spec": {"keys": [{"id": made.id, "salt": made.salt, "hash": made.hash}]},
        },
    ):
        store.apply(obj)
    # Flow control off: a Sheddable request over the saturated replica is refused at once.
    gw = await gateways(store, config=GatewayConfig(saturation_queue=1, flow_control=False))
    await eventually(
        lambda: (
            {"batch", "chat", "nowhere"} <= set(gw.table.model_names())
            and gw.auth.enabled
            and all(s.served_models for s in gw.registry.states.values())
        ),
        what="the routes, the Tenant and the replica",
    )
    url = f"http://127.0.0.1:{gw.port}"
    an = anthropic.AsyncAnthropic(base_url=url, api_key=made.key, max_retries=0)
    stranger = anthropic.AsyncAnthropic(base_url=url, api_key="llmp-nope", max_retries=0)
    oa = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=made.key, max_retries=0)
    hi = [{"role": "user", "content": "hi"}]

    async def refused(client, name, raised, kind) -> anthropic.APIStatusError:
        with pytest.raises(raised) as caught:
            await client.messages.create(model=name, max_tokens=4, messages=hi)
        body = caught.value.body
        assert body["type"] == "error" and body["error"]["type"] == kind, body
        assert body["error"]["message"], body
        return caught.value

    try:
        await refused(stranger, "chat", anthropic.AuthenticationError, "authentication_error")
        await refused(an, "nowhere", anthropic.ServiceUnavailableError, "api_error")
        with pytest.raises(openai.InternalServerError) as failed:
            await oa.responses.create(model="nowhere", input="hi", max_output_tokens=4)
        assert (failed.value.status_code, failed.value.code) == (503, "no_ready_endpoint")
        # Load the replica until it reports a queue, then a Sheddable request is shed.
        load = [
            asyncio.create_task(
                oa.chat.completions.create(
                    model="chat",
                    messages=hi,
                    max_tokens=25,
                    extra_body={"ignore_eos": True},
                )
            )
            for _ in range(4)
        ]
        await eventually(
            lambda: all(s.waiting >= 2 for s in gw.registry.states.values()),
            what="the replica to report a queue over 1",
        )
        shed = await refused(an, "batch", anthropic.RateLimitError, "rate_limit_error")
        assert int(shed.response.headers["Retry-After"]) >= 1
        with pytest.raises(openai.RateLimitError) as limited:
            await oa.responses.create(model="batch", input="hi", max_output_tokens=4)
        assert limited.value.code == "overloaded"
        await asyncio.gather(*load)
    finally:
        for client in (an, stranger, oa):
            await client.close()
