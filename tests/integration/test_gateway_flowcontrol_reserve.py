"""Flow control's reserve end to end: a gateway in front of a real sim engine, Tenants with
real keys, ``saturationMaxInflight: 1`` (the rule, on the gateway's own count) and
``flowControlReserve: 1``. A tenant with no recent dispatch goes at once, past a backlog of a
tenant over its share of the recent dispatches (even a Critical one) and a Sheddable waiter,
which stay queued."""

from __future__ import annotations

import asyncio

from llmplane.testing import eventually
from tests.integration.flowcontrol_gateway import MODEL, TOKEN_TIME, complete, queued, sample, start


async def test_an_under_share_tenant_goes_past_a_backlog_within_the_reserve(
    gateways, store, processes, client
):
    sim = processes.sim(MODEL, "--max-num-seqs", "8")
    gw, keys = await start(
        gateways,
        store,
        sim,
        {"big": "Critical", "small": "Default", "bulk": "Sheddable"},
        saturation_queue=100,
        saturation_max_inflight=1,
        flow_control_reserve=1,
    )
    state = next(iter(gw.registry.states.values()))
    for i in range(3):  # big's recent service: over its share from here on
        assert (await complete(client, gw, keys["big"], 1, f"warm {i}"))[0] == 200
    long = asyncio.create_task(complete(client, gw, keys["big"], int(3.0 / TOKEN_TIME), "long"))
    await eventually(lambda: state.inflight == 1, what="the big tenant's long request sent")
    waiting = [
        asyncio.create_task(complete(client, gw, keys["big"], 3, "next")),
        asyncio.create_task(complete(client, gw, keys["bulk"], 3, "bulk")),
    ]
    await eventually(
        lambda: queued(gw) == {("Critical", "big"): 1, ("Sheddable", "bulk"): 1},
        what="the big tenant's second request and the Sheddable one queued",
    )
    status, _, _, _ = await complete(client, gw, keys["small"], 3, "small")
    assert status == 200
    assert not long.done()  # served beside the long request, within the reserve
    assert queued(gw) == {("Critical", "big"): 1, ("Sheddable", "bulk"): 1}  # still waiting
    assert sample(gw, "llmplane_gateway_flow_reserved_total", tenant="small") == 1
    assert sample(gw, "llmplane_gateway_flow_reserved_total", tenant="big") == 0
    results = await asyncio.gather(long, *waiting)
    assert [r[0] for r in results] == [200, 200, 200]
    await eventually(lambda: not gw.flow.shares.held(), what="every seat released")


async def test_a_sheddable_backlog_does_not_cut_the_shares(gateways, store, processes, client):
    # saturationMaxInflight 3: big's two long requests and small's one fill the rule; a
    # Sheddable request waits. small's next request: 1 in flight of a share of 3/2 (big and
    # small are the claimants; bulk, waiting only as Sheddable, is none): it goes within the
    # reserve instead of waiting for a long request to end.
    sim = processes.sim(MODEL, "--max-num-seqs", "8")
    gw, keys = await start(
        gateways,
        store,
        sim,
        {"big": "Default", "small": "Default", "bulk": "Sheddable"},
        saturation_queue=100,
        saturation_max_inflight=3,
        flow_control_reserve=1,
    )
    state = next(iter(gw.registry.states.values()))
    tokens = int(3.0 / TOKEN_TIME)
    longs = [
        asyncio.create_task(complete(client, gw, keys[name], tokens, f"long {i}"))
        for i, name in enumerate(("big", "big", "small"))
    ]
    await eventually(lambda: state.inflight == 3, what="the three long requests sent")
    bulk = asyncio.create_task(complete(client, gw, keys["bulk"], 3, "bulk"))
    await eventually(
        lambda: queued(gw) == {("Sheddable", "bulk"): 1}, what="the Sheddable request queued"
    )
    status, _, _, _ = await complete(client, gw, keys["small"], 3, "small")
    assert status == 200
    assert not any(task.done() for task in longs)  # served beside them, within the reserve
    assert queued(gw) == {("Sheddable", "bulk"): 1}
    assert sample(gw, "llmplane_gateway_flow_reserved_total", tenant="small") == 1
    results = await asyncio.gather(*longs, bulk)
    assert [r[0] for r in results] == [200] * 4
    await eventually(lambda: not gw.flow.shares.held(), what="every seat released")
