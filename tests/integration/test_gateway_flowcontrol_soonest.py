"""Where the reserve sends a request: to the endpoint where it starts soonest. Two real sim
engines, ``saturationMaxInflight: 2`` and ``flowControlReserve: 1``; on one (``free``) two
requests with long prompts are decoding, on the other (``busy``, slowed down) two shorter
prompts are in prefill, not yet at their first chunk. Both endpoints are at the rule; an
under-share tenant's stream goes within the reserve, and to ``free``: no prefill is under way
there, so its own is the next step. The scheduler alone would choose ``busy``: less of its KV
cache is in use (the only scorer that differs here)."""

from __future__ import annotations

import asyncio
import random

from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.testing import eventually
from tests.integration.flowcontrol_gateway import MODEL, TOKEN_TIME, sample, start, stream


def words(tokens: int, seed: str) -> str:
    """A prompt of ``tokens`` sim tokens (4 characters each) that shares no prefix with
    another seed's."""
    rng = random.Random(seed)
    return "".join(
        " " + rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") + rng.choice("bdfgklmnprstvz")
        for _ in range(tokens)
    )


async def test_the_reserve_sends_to_the_endpoint_with_no_prefill_under_way(
    gateways, store, processes, client
):
    free = processes.sim(MODEL, "--max-num-seqs", "8")
    # A 4,000-token prefill takes 3 s at time scale 20: time to look while two are under way.
    busy = processes.sim(MODEL, "--max-num-seqs", "8", "--time-scale", "20")
    gw, keys = await start(
        gateways,
        store,
        free,
        {"big": "Default", "small": "Default"},
        saturation_queue=100,
        saturation_max_inflight=2,
        flow_control_reserve=1,
    )
    tokens = int(60.0 / TOKEN_TIME)  # decoding for the whole test
    decoding = [asyncio.Event(), asyncio.Event()]
    tasks = [
        asyncio.create_task(
            stream(client, gw, keys["big"], words(8000, f"decode {i}"), tokens, first=e)
        )
        for i, e in enumerate(decoding)
    ]
    for event in decoding:
        await asyncio.wait_for(event.wait(), 30)
    # Now the second engine: the only one below the rule, it gets big's next two streams.
    store.apply(endpoint_object("busy", busy.address, MODEL, engine="vllm"))
    await eventually(
        lambda: (
            len(gw.registry.states) == 2
            and all(s.has_load_metrics for s in gw.registry.states.values())
        ),
        what="the second engine discovered and scraped",
    )
    states = {s.address: s for s in gw.registry.states.values()}
    prefilled = [asyncio.Event(), asyncio.Event()]
    tasks += [
        asyncio.create_task(stream(client, gw, keys["big"], words(4000, f"busy {i}"), 3, first=e))
        for i, e in enumerate(prefilled)
    ]
    await eventually(
        lambda: states[busy.address].prefilling == 2 and states[free.address].prefilling == 0,
        what="two streams before their first chunk on busy, none on free",
    )
    assert states[busy.address].inflight == states[free.address].inflight == 2  # at the rule
    await eventually(
        lambda: 0 < states[busy.address].kv_usage < states[free.address].kv_usage,
        what="both engines scraped with their prompts in the KV cache",
    )
    assert not any(event.is_set() for event in prefilled)  # still in prefill

    status, _, _, endpoint = await asyncio.wait_for(
        stream(client, gw, keys["small"], words(10, "small"), 3), 30
    )
    assert (status, endpoint) == (200, free.address)
    assert sample(gw, "llmplane_gateway_flow_reserved_total", tenant="small") == 1
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await eventually(lambda: not gw.flow.shares.held(), what="every seat released")
