"""``previous_response_id`` on ``/v1/responses`` across replicas: each engine keeps its stored
responses in its own memory (vLLM with ``VLLM_ENABLE_RESPONSES_API_STORE=1``; the sim does the
same), so a follow-up must reach the replica that holds the response it names. Two sim
replicas of one model behind an in-process gateway, the official ``openai`` client."""

from __future__ import annotations

import openai
import orjson
import pytest

from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.gateway.protocols.responses import replica_tag
from llmplane.testing import eventually

STORE = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}


@pytest.fixture
async def two_replicas(store, processes, gateways):
    sims = [processes.sim("tiny", "--time-scale", "0", env=STORE) for _ in range(2)]
    for i, sim in enumerate(sims):
        store.apply(endpoint_object(f"r{i}", sim.address, "tiny"))
    gw = await gateways(store)
    await eventually(
        lambda: (
            len(gw.registry.states) == 2
            and all(s.served_models for s in gw.registry.states.values())
        ),
        what="both replicas and their models",
    )
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{gw.port}/v1", api_key="none", max_retries=0
    )
    yield client, [s.address for s in sims]
    await client.close()


async def test_a_follow_up_reaches_the_replica_that_holds_the_response(two_replicas, client):
    oa, addresses = two_replicas
    raw = await oa.responses.with_raw_response.create(
        model="tiny", input="hello there", max_output_tokens=4
    )
    holder = raw.headers["x-llmplane-endpoint"]
    first = raw.parse()
    # The id names the replica that holds it.
    assert first.id.startswith("resp_") and first.id.endswith("-" + replica_tag(holder))
    other = next(a for a in addresses if a != holder)
    # Any other replica does not know it (vLLM's 404): sent there, the follow-up would fail.
    async with client.post(
        f"http://{other}/v1/responses",
        data=orjson.dumps(
            {"model": "tiny", "input": "and then?", "previous_response_id": first.id}
        ),
    ) as r:
        assert r.status == 404, await r.text()
        error = (await r.json())["error"]
    assert error["message"] == f"Response with id '{first.id}' not found.", error
    # A chain of follow-ups, each naming the last: every one on the holder, each prompt the
    # whole conversation so far (the engine found every previous response).
    last, inputs = first, [first.usage.input_tokens]
    for turn in range(8):
        raw = await oa.responses.with_raw_response.create(
            model="tiny",
            input=f"turn {turn}",
            max_output_tokens=3,
            previous_response_id=last.id,
        )
        assert raw.headers["x-llmplane-endpoint"] == holder
        last = raw.parse()
        assert last.previous_response_id is not None
        inputs.append(last.usage.input_tokens)
    assert inputs == sorted(inputs) and inputs[-1] > inputs[0] + 8, inputs
    # Streamed, naming the first response again: its id is in response.completed.
    stream = await oa.responses.create(
        model="tiny", input="streamed", previous_response_id=first.id, stream=True
    )
    events = [event async for event in stream]
    assert events[-1].type == "response.completed"
    assert events[-1].response.id.endswith("-" + replica_tag(holder))


async def test_ids_the_gateway_cannot_place_get_the_engines_404(two_replicas):
    oa, _ = two_replicas
    for previous in ("resp_nope", "resp_0123456789abcdef01234567-00000000", "x-1"):
        with pytest.raises(openai.NotFoundError) as missing:
            await oa.responses.create(model="tiny", input="hi", previous_response_id=previous)
        assert f"'{previous}' not found" in missing.value.message
    # store=false: nothing kept, the gateway gives no id of its own.
    unstored = await oa.responses.create(model="tiny", input="hi", store=False)
    assert "-" not in unstored.id
    with pytest.raises(openai.NotFoundError):
        await oa.responses.create(model="tiny", input="hi", previous_response_id=unstored.id)
