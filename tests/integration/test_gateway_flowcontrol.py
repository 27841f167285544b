"""Flow control end to end: a gateway in front of a real sim engine that saturates at once
(one running sequence; ``saturationQueue: 0``: anything waiting in the engine saturates it),
Tenants with real keys. Requests wait in the gateway by band and fairly between tenants; the
TTL, a full band, eviction and a client that leaves are seen on the wire and in /metrics."""

from __future__ import annotations

import asyncio
import time

import pytest

from llmplane.controlplane.autoscaling import INFLIGHT
from llmplane.testing import eventually
from tests.integration.flowcontrol_gateway import (
    MODEL,
    TOKEN_TIME,
    complete,
    queued,
    release,
    sample,
    saturate,
    start,
    stream,
)
from tests.integration.openai_errors import assert_openai_error


@pytest.fixture
def sim(processes):
    return processes.sim(MODEL, "--max-num-seqs", "1")


async def test_critical_is_dispatched_before_sheddable(gateways, store, sim, client):
    gw, keys = await start(
        gateways, store, sim, {"bulk": "Sheddable", "urgent": "Critical", "filler": "Default"}
    )
    fillers = await saturate(client, gw, keys["filler"], 60.0)
    shed = [asyncio.create_task(complete(client, gw, keys["bulk"], 5)) for _ in range(3)]
    await eventually(lambda: queued(gw).get(("Sheddable", "bulk")) == 3, what="3 Sheddable queued")
    crit = [asyncio.create_task(complete(client, gw, keys["urgent"], 5)) for _ in range(3)]
    await eventually(lambda: queued(gw).get(("Critical", "urgent")) == 3, what="3 Critical queued")
    await release(fillers)
    shed_done = await asyncio.gather(*shed)
    crit_done = await asyncio.gather(*crit)
    assert [r[0] for r in shed_done + crit_done] == [200] * 6
    # Queued after the Sheddable ones, served before every one of them.
    assert max(r[3] for r in crit_done) < min(r[3] for r in shed_done)
    assert sample(gw, "llmplane_gateway_flow_wait_seconds_count", band="Critical") == 3
    await eventually(lambda: not gw.flow.queues, what="the queue empty again")


async def test_a_small_tenant_is_not_starved_by_a_big_one(gateways, store, sim, client):
    gw, keys = await start(gateways, store, sim, {"big": "Default", "small": "Default"})
    fillers = await saturate(client, gw, keys["big"], 60.0)
    big = [asyncio.create_task(complete(client, gw, keys["big"], 3, str(i))) for i in range(20)]
    await eventually(lambda: queued(gw).get(("Default", "big")) == 20, what="20 big queued")
    small = [asyncio.create_task(complete(client, gw, keys["small"], 3, str(i))) for i in range(3)]
    await eventually(lambda: queued(gw).get(("Default", "small")) == 3, what="3 small queued")
    await release(fillers)
    big_done = await asyncio.gather(*big)
    small_done = await asyncio.gather(*small)
    assert all(r[0] == 200 for r in big_done + small_done)
    # Round-robin between the two: the small tenant's 3 go within the first 7 dispatches,
    # although 20 of the big one's were queued before them (FIFO would serve them last).
    last_small = max(r[3] for r in small_done)
    big_before = sum(1 for r in big_done if r[3] < last_small)
    assert big_before <= 4, f"{big_before} big requests finished before the small ones"


async def test_ttl_ends_in_429_with_retry_after(gateways, store, sim, client):
    gw, keys = await start(
        gateways, store, sim, {"a": "Default"}, flow_control_ttl=0.3, shed_retry_after=2
    )
    fillers = await saturate(client, gw, keys["a"], 3.0)
    started = time.monotonic()
    status, headers, body, ended = await complete(client, gw, keys["a"], 3)
    assert_openai_error(status, body, 429, "overloaded")
    assert headers["Retry-After"] == "2"
    assert b"waited 0.3 s" in body
    assert 0.3 <= ended - started < 2.5  # the TTL ended it, not the fillers finishing
    assert sample(gw, "llmplane_gateway_flow_refused_total", reason="ttl", tenant="a") == 1
    await asyncio.gather(*fillers)


async def test_a_client_that_disconnects_leaves_the_queue(gateways, store, sim, client):
    gw, keys = await start(gateways, store, sim, {"a": "Default"})
    fillers = await saturate(client, gw, keys["a"], 3.0)
    dispatched = sample(gw, "llmplane_gateway_flow_wait_seconds_count")
    gone = asyncio.create_task(complete(client, gw, keys["a"], 3))
    await eventually(lambda: queued(gw).get(("Default", "a")) == 1, what="one request queued")
    # The autoscaler sees the waiting request as in flight on the endpoint it waits for.
    assert gw.signals.replica_signals("")[sim.address][INFLIGHT] == 3
    gone.cancel()  # the client closes its connection
    await eventually(
        lambda: queued(gw).get(("Default", "a"), 0) == 0, what="the request left the queue"
    )
    assert sample(gw, "llmplane_gateway_flow_left_total", band="Default", tenant="a") == 1
    assert not any(f.done() for f in fillers)  # it left while the sim was still busy
    await asyncio.gather(*fillers)
    # Never dispatched, and the sim never saw it (one request per filler, no more).
    assert sample(gw, "llmplane_gateway_flow_wait_seconds_count") == dispatched
    assert sample(gw, "llmplane_gateway_requests_total", endpoint=sim.address, status="200") == 2


async def test_a_full_band_refuses_and_a_full_queue_evicts_the_lowest_band(
    gateways, store, sim, client
):
    gw, keys = await start(
        gateways,
        store,
        sim,
        {"a": "Default", "low": "Sheddable", "top": "Critical"},
        flow_control_band_requests=1,
        flow_control_total_requests=2,
    )
    fillers = await saturate(client, gw, keys["a"], 3.0)
    waiting = asyncio.create_task(complete(client, gw, keys["a"], 3))
    await eventually(lambda: queued(gw).get(("Default", "a")) == 1, what="one Default queued")
    # The Default band holds one: the next Default request is refused at once.
    status, headers, body, _ = await complete(client, gw, keys["a"], 3)
    assert_openai_error(status, body, 429, "overloaded")
    assert b"Default band is full" in body and headers["Retry-After"] == "1"
    low = asyncio.create_task(complete(client, gw, keys["low"], 3))
    await eventually(lambda: queued(gw).get(("Sheddable", "low")) == 1, what="Sheddable queued")
    # The queue holds two: a Critical request evicts the Sheddable one.
    top = asyncio.create_task(complete(client, gw, keys["top"], 3))
    status, _, body, _ = await low
    assert_openai_error(status, body, 429, "overloaded")
    assert b"evicted" in body
    assert (await top)[0] == 200 and (await waiting)[0] == 200
    assert sample(gw, "llmplane_gateway_flow_refused_total", reason="band_full") == 1
    assert sample(gw, "llmplane_gateway_flow_refused_total", reason="evicted") == 1
    await asyncio.gather(*fillers)


async def test_flow_control_off_sends_everything_to_the_engine(gateways, store, sim, client):
    gw, keys = await start(gateways, store, sim, {"a": "Default"}, flow_control=False)
    fillers = await saturate(client, gw, keys["a"], 0.5)
    extra = asyncio.create_task(complete(client, gw, keys["a"], 3))
    state = next(iter(gw.registry.states.values()))
    await eventually(lambda: state.inflight == 3, what="the third request sent to the sim")
    assert not gw.flow.queues
    assert (await extra)[0] == 200
    await asyncio.gather(*fillers)


async def test_an_in_flight_cap_keeps_the_rest_in_the_gateway(gateways, store, sim, client):
    # saturationMaxInflight 1 over a sim that runs one sequence: the second request waits in
    # the gateway, not in the sim's queue, and starts once the first is done.
    gw, keys = await start(
        gateways, store, sim, {"a": "Default"}, saturation_queue=5, saturation_max_inflight=1
    )
    state = next(iter(gw.registry.states.values()))
    first = asyncio.create_task(complete(client, gw, keys["a"], int(0.5 / TOKEN_TIME)))
    await eventually(lambda: state.inflight == 1, what="the first request sent")
    second = asyncio.create_task(complete(client, gw, keys["a"], 3))
    await eventually(lambda: queued(gw).get(("Default", "a")) == 1, what="the second queued")
    await eventually(lambda: state.running == 1 and state.scraped_at > 0, what="a scrape")
    assert state.inflight == 1 and state.waiting == 0  # nothing waits in the engine
    (s1, *_, t1), (s2, *_, t2) = await asyncio.gather(first, second)
    assert (s1, s2) == (200, 200) and t1 <= t2


async def test_a_first_token_releases_the_next_waiter(gateways, store, processes, client):
    # saturationMaxPrefilling 1 over a sim with room for 8 sequences: while the first stream's
    # long prefill runs (2,000 prompt tokens: about 0.8 s at time scale 10), the second waits
    # in the gateway; the first's first chunk releases it (not the first's end: it still has
    # 2 s of decoding), so the short second stream ends long before the first. Scrapes (which
    # dispatch too) are 30 s apart here: only the first chunk can release it in time.
    sim = processes.sim(MODEL, "--max-num-seqs", "8", "--time-scale", "10")
    gw, keys = await start(
        gateways,
        store,
        sim,
        {"a": "Default"},
        saturation_queue=100,
        saturation_max_prefilling=1,
        scrape_interval=30.0,
        scrape_idle_interval=30.0,
        metrics_staleness=60.0,
    )
    state = next(iter(gw.registry.states.values()))
    long_prompt = "abcd" * 2000  # 2,000 sim tokens
    first = asyncio.create_task(stream(client, gw, keys["a"], long_prompt, 30))
    await eventually(lambda: state.prefilling == 1, what="the first stream sent, no chunk yet")
    second = asyncio.create_task(stream(client, gw, keys["a"], "short", 3))
    await eventually(lambda: queued(gw).get(("Default", "a")) == 1, what="the second queued")
    assert state.prefilling == 1 and state.inflight == 1  # it waits in the gateway
    await eventually(lambda: not gw.flow.queues, what="the second released", timeout=30)
    assert not first.done()  # released while the first stream still decodes
    (s1, n1, t1, _), (s2, n2, t2, _) = await asyncio.gather(first, second)
    assert (s1, n1, s2, n2) == (200, 30, 200, 3)
    assert t2 < t1  # it ran beside the first one's decode, not after it
    assert state.prefilling == 0 and state.inflight == 0
