"""Flow control: the queue's order (bands, fairness between flows, weights), its bounds and
eviction, and the controller's TTL, eviction, cancellation and one-at-a-time dispatch."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplane.gateway.errors import GatewayError
from llmplane.gateway.flowcontrol import FlowControl, FlowQueue, Full, Limits, Waiter
from llmplane.gateway.flowcontrol.queue import BAND
from llmplane.testing import eventually

CRITICAL, DEFAULT, SHEDDABLE = BAND["Critical"], BAND["Default"], BAND["Sheddable"]


def waiter(band: int = DEFAULT, flow: str = "a", size: int = 10, at: float = 0.0) -> Waiter:
    return Waiter(band, flow, size, at)


def drain(queue: FlowQueue) -> list[Waiter]:
    out = []
    while (w := queue.pop()) is not None:
        out.append(w)
    return out


# --- order ---------------------------------------------------------------------------------


def test_higher_bands_go_first_and_arrival_order_inside_a_flow() -> None:
    q = FlowQueue(Limits())
    s1, d1, c1, d2, s2, c2 = (
        waiter(SHEDDABLE),
        waiter(DEFAULT),
        waiter(CRITICAL),
        waiter(DEFAULT),
        waiter(SHEDDABLE),
        waiter(CRITICAL),
    )
    for w in (s1, d1, c1, d2, s2, c2):
        assert q.offer(w) == []
    assert drain(q) == [c1, c2, d1, d2, s1, s2]
    assert q.count == 0 and q.bytes == 0


def test_a_small_flow_is_not_starved_by_a_big_one() -> None:
    q = FlowQueue(Limits())
    for i in range(100):
        q.offer(waiter(flow="big", at=i))
    for i in range(10):
        q.offer(waiter(flow="small", at=100 + i))
    first = [w.flow for w in drain(q)[:20]]
    # Round-robin while both wait: the small flow's 10 requests are all in the first 20.
    assert Counter(first) == {"big": 10, "small": 10}


def test_a_flow_that_comes_back_goes_before_a_backlogged_one() -> None:
    # Equal credit when the small flow arrives: it has fewer waiting, so it goes next instead
    # of after one more of big's (the smaller caller's TTFT under overload).
    q = FlowQueue(Limits())
    for i in range(5):
        q.offer(waiter(flow="big", at=i))
    assert q.pop().flow == "big"  # type: ignore[union-attr]
    q.offer(waiter(flow="small", at=10))
    assert [q.pop().flow, q.pop().flow] == ["small", "big"]  # type: ignore[union-attr]
    # Again after its turn: the credit it left behind does not put one more of big's first.
    q.offer(waiter(flow="small", at=11))
    assert [w.flow for w in drain(q)[:2]] == ["small", "big"]


def test_weights_share_dispatches() -> None:
    q = FlowQueue(Limits())
    for i in range(400):
        q.offer(waiter(flow="heavy", at=i), weight=3)
        q.offer(waiter(flow="light", at=i), weight=1)
    first = Counter(w.flow for w in drain(q)[:400])
    assert first == {"heavy": 300, "light": 100}


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.integers(1, 5), min_size=1, max_size=5),
    rounds=st.integers(1, 6),
)
def test_every_waiting_flow_gets_its_weighted_share(weights: list[int], rounds: int) -> None:
    """Smooth weighted round-robin: over any window of one full round (sum of weights) each
    flow with waiters gets exactly its weight, so no flow waits longer than one round."""
    q = FlowQueue(Limits(band_requests=10**6, total_requests=10**6))
    total = sum(weights)
    for i, weight in enumerate(weights):
        for _ in range(total * rounds):
            q.offer(waiter(flow=f"f{i}"), weight=weight)
    order = [w.flow for w in drain(q)]
    for r in range(rounds):
        window = Counter(order[r * total : (r + 1) * total])
        assert window == {f"f{i}": weight for i, weight in enumerate(weights)}


def test_remove_takes_a_waiter_out() -> None:
    q = FlowQueue(Limits())
    a, b = waiter(flow="a", size=5), waiter(flow="b", size=7)
    q.offer(a)
    q.offer(b)
    assert q.remove(a) and not q.remove(a)
    assert (q.count, q.bytes) == (1, 7)
    assert q.lengths() == {("Default", "b"): 1}
    assert drain(q) == [b]


# --- bounds ----------------------------------------------------------------------------------


def test_a_full_band_refuses_by_count_and_by_bytes() -> None:
    q = FlowQueue(Limits(band_requests=2, band_bytes=100))
    q.offer(waiter(size=40))
    q.offer(waiter(size=40))
    with pytest.raises(Full, match="Default band is full") as full:
        q.offer(waiter(size=1))
    assert q.count == 2 and full.value.code == "band_full"
    q2 = FlowQueue(Limits(band_requests=10, band_bytes=100))
    q2.offer(waiter(size=60))
    with pytest.raises(Full, match="band is full"):
        q2.offer(waiter(size=41))
    q2.offer(waiter(CRITICAL, size=100))  # another band has its own bound


def test_a_full_queue_evicts_the_lowest_band_first_from_its_biggest_flow() -> None:
    q = FlowQueue(Limits(band_requests=10, total_requests=5))
    shed_small = waiter(SHEDDABLE, flow="small")
    shed_big = [waiter(SHEDDABLE, flow="big", at=i) for i in range(3)]
    default = waiter(DEFAULT, flow="x")
    for w in (shed_small, *shed_big, default):
        q.offer(w)
    # A Critical newcomer evicts the newest Sheddable request of the flow with the most.
    assert q.offer(waiter(CRITICAL)) == [shed_big[2]]
    # A Default one evicts Sheddable too, never a Default or Critical one.
    assert q.offer(waiter(DEFAULT)) == [shed_big[1]]
    assert q.offer(waiter(DEFAULT)) + q.offer(waiter(DEFAULT)) in (
        [shed_small, shed_big[0]],
        [shed_big[0], shed_small],
    )
    # Nothing lower left: a Default newcomer is refused and nothing changes.
    with pytest.raises(Full, match="queue is full") as full:
        q.offer(waiter(DEFAULT))
    assert full.value.code == "queue_full"
    # A Sheddable newcomer never evicts anything.
    with pytest.raises(Full):
        q.offer(waiter(SHEDDABLE))
    assert q.count == 5
    assert [w.band for w in drain(q)] == [CRITICAL, DEFAULT, DEFAULT, DEFAULT, DEFAULT]


def test_total_bytes_evict_enough_or_refuse_without_evicting() -> None:
    q = FlowQueue(Limits(total_bytes=100))
    small = [waiter(SHEDDABLE, size=30) for _ in range(3)]
    for w in small:
        q.offer(w)
    # 90 queued; 70 more needs two of them out.
    assert len(q.offer(waiter(CRITICAL, size=70))) == 2
    assert q.bytes == 100
    # 100 more cannot fit even with the last Sheddable gone: refused, nothing evicted.
    with pytest.raises(Full):
        q.offer(waiter(DEFAULT, size=60))
    assert q.count == 2 and q.bytes == 100
    with pytest.raises(Full, match="larger than the whole queue"):
        q.offer(waiter(CRITICAL, size=101))


# --- the controller --------------------------------------------------------------------------


class Room:
    """The saturation rule over a number of free slots, set by the test (the queue's unit,
    not the gateway's: the gateway's rule is tested with real engines)."""

    def __init__(self, slots: int = 0) -> None:
        self.slots = slots

    def admit(self, model, backend, now, level, shed):
        return backend.candidates

    def saturated(self, state: object, now: float, extra: int = 0) -> bool:
        return self.slots <= 0


ONE = (SimpleNamespace(endpoint=SimpleNamespace(priority_scheduling=False)),)  # one endpoint
BACKEND = SimpleNamespace(ref="b", candidates=ONE)


def flow_control(room: Room, **kw: object) -> FlowControl:
    return FlowControl(room, **kw)  # type: ignore[arg-type]


async def test_requests_wait_until_room_and_go_by_band_one_slot_at_a_time() -> None:
    room = Room()
    fc = flow_control(room)
    went: list[str] = []

    async def request(criticality: str) -> None:
        candidates, seat, waited, _ = await fc.admit("m", BACKEND, criticality, "t", 1, 10)
        assert candidates == ONE and seat is None and waited is not None
        room.slots -= 1  # it takes its endpoint (the gateway: in-flight count up)
        went.append(criticality)

    tasks = [asyncio.create_task(request(c)) for c in ("Sheddable", "Default", "Critical")]
    await asyncio.sleep(0)
    assert fc.waiting() == 3
    fc.pump()  # saturated: nobody goes
    for _ in range(5):
        await asyncio.sleep(0)
    assert went == []
    room.slots = 1
    fc.pump()
    fc.pump()  # a burst of completions before the dispatched one has taken its endpoint
    await wait_until(lambda: went == ["Critical"])
    for _ in range(5):
        await asyncio.sleep(0)
    assert went == ["Critical"]  # one slot: one request, however many loop turns pass
    for expected in (["Critical", "Default"], ["Critical", "Default", "Sheddable"]):
        room.slots += 1  # a request finished
        fc.pump()
        await wait_until(lambda e=expected: went == e)
    await asyncio.gather(*tasks)
    await wait_until(lambda: not fc.queues)
    room.slots = 1
    # Nothing waits and there is room: it goes on at once.
    assert (await fc.admit("m", BACKEND, "Default", "t", 1, 10))[2] is None


async def test_an_arrival_queues_behind_those_waiting_even_with_room() -> None:
    room = Room()
    fc = flow_control(room)
    first = asyncio.create_task(fc.admit("m", BACKEND, "Default", "t", 1, 10))
    await wait_until(lambda: fc.waiting() == 1)
    room.slots = 1  # room, and nothing pumped yet: the newcomer still goes behind the first
    second = await fc.admit("m", BACKEND, "Default", "t", 1, 10)
    assert first.done() and second[2] is not None  # it went through the queue, after it


async def wait_until(condition, turns: int = 100) -> None:
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not met within the loop turns given")


async def test_ttl_ends_in_429_with_retry_after() -> None:
    fc = flow_control(Room(), ttl=0.05, retry_after=3)
    with pytest.raises(GatewayError) as err:
        async with asyncio.timeout(5):  # a TTL that never fires fails here, not at the suite's
            await fc.wait("b", ONE, "Default", "t", 1, 10)
    assert err.value.status == 429 and err.value.retry_after == 3
    assert "waited 0.05 s" in err.value.message
    assert err.value.response().headers["Retry-After"] == "3"
    assert not fc.queues
    assert fc.metrics.refused.labels("Default", "t", "ttl").value == 1


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    fc = flow_control(Room())
    task = asyncio.create_task(fc.wait("b", ONE, "Default", "t", 1, 10))
    await asyncio.sleep(0)
    assert fc.waiting() == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fc.waiting() == 0 and not fc.queues
    assert fc.metrics.left.labels("Default", "t").value == 1


async def test_eviction_and_a_full_band_answer_429() -> None:
    fc = flow_control(Room(), limits=Limits(band_requests=1, total_requests=1))
    low = asyncio.create_task(fc.wait("b", ONE, "Sheddable", "t", 1, 10))
    await asyncio.sleep(0)
    high = asyncio.create_task(fc.wait("b", ONE, "Critical", "t", 1, 10))
    with pytest.raises(GatewayError, match="evicted") as err:
        await low
    assert err.value.status == 429
    with pytest.raises(GatewayError, match="Critical band is full"):
        await fc.wait("b", ONE, "Critical", "u", 1, 10)
    assert fc.waiting() == 1
    high.cancel()
    with pytest.raises(asyncio.CancelledError):
        await high


async def test_waiting_requests_count_as_demand_on_the_endpoints_they_wait_for() -> None:
    from llmplane.gateway.registry import EndpointState
    from llmplane.runtime.endpoint import Endpoint

    a, b = (EndpointState(Endpoint(f"127.0.0.1:{p}", {}, "m")) for p in (1, 2))
    fc = flow_control(Room())
    tasks = [asyncio.create_task(fc.wait("pool", (a, b), "Default", None, 1, 1)) for _ in range(3)]
    await wait_until(lambda: fc.waiting() == 3)
    assert fc.queued_by_endpoint() == {a.address: 1.5, b.address: 1.5}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert fc.queued_by_endpoint() == {}


# --- configuration ---------------------------------------------------------------------------


def test_settings_from_the_config_file_and_the_command_line(tmp_path) -> None:
    import logging

    from llmplane.gateway.cli import _parser, configure
    from llmplane.gateway.config import ConfigFileError, load_checked

    # configure() sets up the process's logging (the access logger stops propagating): put it
    # back afterwards, or later tests reading the access log through caplog see nothing.
    access = logging.getLogger("llmplane.gateway.access")
    saved = access.propagate, access.level

    def parse(*argv: str):
        return configure(_parser().parse_args([*argv, "--no-access-log"]))

    path = tmp_path / "gw.yaml"
    path.write_text("gateway:\n  flowControl: false\n  flowControlTtl: 2.5\n")
    config = load_checked(path)
    assert (config.flow_control, config.flow_control_ttl) == (False, 2.5)
    try:
        # The flag wins over the file; without it the file (or the default: on) decides.
        assert parse("--config", str(path), "--flow-control").flow_control is True
        assert parse("--config", str(path)).flow_control is False
        assert parse("--no-flow-control").flow_control is False
        assert parse().flow_control is True
    finally:
        access.propagate = saved[0]
        access.setLevel(saved[1])
    for bad, message in (
        ("flowControl: 'yes'", "flowControl: must be true or false"),
        ("flowControlTtl: 0", "flowControlTtl: must be a number of seconds above 0"),
        ("flowControlBandRequests: -1", "flowControlBandRequests: must be a whole number"),
        ("flowControlTotalBytes: 1.5", "flowControlTotalBytes: must be a whole number"),
        ("saturationMaxInflight: -2", "saturationMaxInflight: must be a whole number"),
        ("saturationMaxPrefilling: true", "saturationMaxPrefilling: must be a whole number"),
        ("saturationMaxPrefilling: 1.5", "saturationMaxPrefilling: must be a whole number"),
    ):
        path.write_text(f"gateway:\n  {bad}\n")
        with pytest.raises(ConfigFileError, match=message):
            load_checked(path)


def test_a_tenants_weight_reaches_the_gateway() -> None:
    from llmplane.gateway.auth import TenantTable

    def obj(name: str, spec: dict) -> dict:
        return {"kind": "Tenant", "metadata": {"name": name}, "spec": spec}

    made = {"id": "abcdefabcdef", "salt": "00" * 16, "hash": "11" * 32}
    table = TenantTable(
        [
            obj("heavy", {"weight": 5, "keys": [made]}),
            obj("plain", {"keys": [{**made, "id": "bcdefabcdefa"}]}),
            obj("odd", {"weight": "x", "keys": [{**made, "id": "cdefabcdefab"}]}),
        ]
    )
    weights = {r.tenant.name: r.tenant.weight for r in table.keys.values()}
    assert weights == {"heavy": 5, "plain": 1, "odd": 1}


@pytest.mark.parametrize("weight", [0, 1001, "heavy"])
def test_a_tenant_weight_out_of_range_is_refused(weight: object) -> None:
    from llmplane.api.documents import InvalidResources, parse_document

    doc = {
        "apiVersion": "llmplane.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": "t"},
        "spec": {"weight": weight},
    }
    with pytest.raises(InvalidResources, match="weight"):
        parse_document(doc)
    doc["spec"]["weight"] = 7
    assert parse_document(doc)[0].spec.weight == 7


async def test_a_waiter_goes_when_room_frees_without_an_event_here() -> None:
    """Capacity freed by nothing this process sees (another worker's requests finishing, a
    dead worker's counts released): the re-check dispatches the waiter long before its TTL,
    and stops once nothing waits."""
    room = Room()
    fc = flow_control(room, ttl=30.0, recheck=0.01)
    task = asyncio.create_task(fc.wait("b", ONE, "Default", "t", 1, 10))
    await wait_until(lambda: fc.waiting() == 1)
    room.slots = 1  # no pump
    async with asyncio.timeout(5):
        waited = await task
    assert waited < 5
    await eventually(
        lambda: not fc.queues and fc._rechecking is None, timeout=5, what="the re-check stopped"
    )
