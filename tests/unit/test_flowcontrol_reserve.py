"""Flow control's reserve: fair shares of the requests in flight (``Shares``), who may go past
the saturation rule (under-share flows, never Sheddable) and how far (the reserve per
endpoint), on arrival and from the queue."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace
from unittest.mock import ANY

import pytest

from llmplane.gateway.config import config_from_dict
from llmplane.gateway.flowcontrol import FlowControl
from llmplane.gateway.flowcontrol.fairshare import FORGET, TAU, FlowSeat, Shares
from llmplane.gateway.flowcontrol.queue import FlowQueue, Limits, Waiter


class Endpoint:
    """What the saturation rule looks at here: requests in flight against a limit (and
    whether its engine orders its queue by priority)."""

    def __init__(self, limit: int, priority_scheduling: bool = False) -> None:
        self.limit = limit
        self.inflight = 0
        self.prefilling = 0  # streams before their first chunk
        self.capacity = 0.0  # sequence slots (0: not known)
        self.endpoint = SimpleNamespace(priority_scheduling=priority_scheduling)


class Rule:
    """Admission over these endpoints: none ejected, saturated at ``limit`` in flight."""

    def admit(self, model, backend, now, level, shed):
        return backend.candidates

    def saturated(self, state: Endpoint, now: float, extra: int = 0) -> bool:
        return state.inflight >= state.limit + extra


def flow_control(reserve: int = 1, enabled: bool = True) -> FlowControl:
    return FlowControl(Rule(), reserve=reserve, enabled=enabled)  # type: ignore[arg-type]


def pool(*candidates: Endpoint) -> SimpleNamespace:
    return SimpleNamespace(ref="pool", candidates=candidates)


# --- Shares ----------------------------------------------------------------------------------


class Clock:
    """A deterministic clock for the decayed dispatch counts."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def shares_at(slack: int = 1) -> tuple[Shares, Clock]:
    clock = Clock()
    return Shares(slack=slack, tau=TAU, clock=clock), clock


def test_a_flow_never_dispatched_is_under_its_share() -> None:
    shares, _ = shares_at()
    for _ in range(8):
        shares.take("b", "big", 1)
    assert shares.under("b", "small", 1, None)
    assert not shares.under("b", "big", 1, None)  # the only active flow holds everything


def test_a_burst_of_a_low_rate_flow_stays_under_its_share() -> None:
    # The overload benchmark's case: big dispatches 4 a second, critical 3, small one every
    # 2 s, and each request lasts 2 s. Over 20 s each one's count settles near its rate x
    # TAU. Then small bursts 6 requests at once: it holds 7 seats of 21, its seat share with
    # three flows (the old test: at its share, so it waited), yet it got ~8 of ~43 recent
    # dispatches, far below its third; and 7 seats are within 21/3 + the slack 2.
    shares, clock = shares_at(slack=2)
    seats: list[tuple[float, FlowSeat]] = []
    for tick in range(80):  # 20 s in quarter seconds
        clock.now = tick * 0.25
        while seats and seats[0][0] <= clock.now - 2.0:
            shares.release(seats.pop(0)[1])
        seats.append((clock.now, shares.take("b", "big", 1)))
        if tick % 4 != 3:
            seats.append((clock.now, shares.take("b", "critical", 1)))
        if tick % 8 == 0:
            seats.append((clock.now, shares.take("b", "small", 1)))
    for _ in range(6):
        assert shares.under("b", "small", 1, None)
        seats.append((clock.now, shares.take("b", "small", 1)))
    assert shares.in_flight("b", "small") == 7 and shares.held() == 21
    assert shares.served("b", "small") < shares.served("b", "big") / 2
    assert shares.under("b", "small", 1, None)
    # The high-rate flows are over their shares all along.
    assert not shares.under("b", "big", 1, None)
    assert not shares.under("b", "critical", 1, None)
    for _, seat in seats:
        shares.release(seat)
    assert shares.held() == 0


def test_a_high_rate_flow_is_over_and_weights_scale_the_share() -> None:
    shares, _ = shares_at(slack=8)  # the guard out of the way
    for _ in range(6):
        shares.take("b", "big", 1)
    for _ in range(2):
        shares.take("b", "small", 1)
    # 8 dispatches, two flows: 4 each. small got 2: under; big 6: over.
    assert shares.under("b", "small", 1, None)
    assert not shares.under("b", "big", 1, None)
    for _ in range(3):
        shares.take("b", "small", 1)
    assert shares.under("b", "small", 1, None)  # 5 of a share of 5.5
    shares.take("b", "small", 1)
    assert not shares.under("b", "small", 1, None)  # 6 of 12: at its share, not under
    # Weight 3 to 1: small's share is 12 x 3/4.
    assert shares.under("b", "small", 3, None)
    assert not shares.under("b", "big", 1, None)


def test_dispatch_counts_decay_and_a_quiet_flow_is_forgotten() -> None:
    shares, clock = shares_at(slack=8)
    old = [shares.take("b", "a", 1) for _ in range(6)]  # a's burst, long ago
    for seat in old:
        shares.release(seat)
    assert not shares.under("b", "a", 1, None)  # a alone: it has everything
    clock.now = TAU
    assert shares.served("b", "a") == pytest.approx(6 / math.e)
    c = [shares.take("b", "c", 1) for _ in range(3)]
    # a's 6 decayed to 2.2 of a total of 5.2: under its half now; c's 3 over it.
    assert shares.under("b", "a", 1, None)
    assert not shares.under("b", "c", 1, None)
    clock.now = 3 * TAU  # a's count 0.3, c's 1.4: c is still over its half
    assert not shares.under("b", "c", 1, None)
    clock.now = 5 * TAU  # a's count below FORGET and nothing in flight: no claimant any more
    assert shares.served("b", "a") < FORGET
    assert not shares.under("b", "c", 1, None)
    assert "a" not in shares.backends["b"].flows
    clock.now = 20 * TAU  # c's seats keep it counted: alone, it has everything
    assert not shares.under("b", "c", 1, None) and shares.held() == 3
    for seat in c:
        shares.release(seat)
    assert shares.under("b", "c", 1, None)  # then forgotten: nothing left behind
    assert shares.backends == {}


def test_the_slot_hog_guard_holds_a_flow_at_its_seats_plus_the_slack() -> None:
    # A flow with few but long requests: a low dispatch rate, its seats held for a long time.
    shares, clock = shares_at(slack=2)
    hog = []
    for tick in range(40):  # big: 40 short requests over 20 s, 2 in flight at a time
        clock.now = tick * 0.5
        seat = shares.take("b", "big", 1)
        if tick % 10 == 0:
            hog.append(shares.take("b", "hog", 1))  # never finishes
        shares.release(seat)
    big = [shares.take("b", "big", 1) for _ in range(2)]
    # hog: ~4 x e^-k recent dispatches against big's ~20: under by service, yet 4 seats of
    # 6, a seat share of 3, plus the slack 2: 4 < 5, still allowed.
    assert shares.served("b", "hog") < shares.served("b", "big") / 2
    assert shares.under("b", "hog", 1, None)
    hog.append(shares.take("b", "hog", 1))
    assert shares.under("b", "hog", 1, None)  # 5 seats of 7: 5 < 3.5 + 2
    hog.append(shares.take("b", "hog", 1))
    # 6 seats of 8 against 4 + 2: held by the guard although under by service.
    assert shares.served("b", "hog") < shares.served("b", "big") / 2
    assert not shares.under("b", "hog", 1, None)
    for seat in hog + big:
        shares.release(seat)
    assert shares.held() == 0


def test_waiting_flows_count_as_active() -> None:
    shares, _ = shares_at(slack=8)
    for _ in range(3):
        shares.take("b", "a", 1)
    shares.take("b", "c", 1)
    # 4 dispatches, a and c active: c's share 2, it got 1: under.
    assert shares.under("b", "c", 1, None)
    queue = FlowQueue(Limits())
    queue.offer(Waiter(1, "d", 1, 0.0))
    queue.offer(Waiter(0, "e", 1, 0.0))
    # With d and e waiting too: a share of 1, c got 1: not under.
    assert not shares.under("b", "c", 1, queue)
    assert shares.under("b", "d", 1, queue)  # never dispatched


def test_a_flow_with_only_sheddable_requests_waiting_is_no_claimant() -> None:
    # The reserve never serves Sheddable requests: their tenant does not cut the others'
    # shares (the overload benchmark's small tenant, queued in a burst behind a heavy one).
    shares, _ = shares_at(slack=8)
    for _ in range(2):
        shares.take("b", "big", 1)
    small = shares.take("b", "small", 1)
    queue = FlowQueue(Limits())
    for _ in range(5):
        queue.offer(Waiter(2, "bulk", 1, 0.0))
    # 3 dispatches, big and small active: small's share 1.5, it got 1.
    assert shares.under("b", "small", 1, queue)
    # The same tenant with a Default request waiting is a claimant: a share of 1.
    queue.offer(Waiter(1, "bulk", 1, 0.0))
    assert not shares.under("b", "small", 1, queue)
    shares.release(small)


# --- the controller --------------------------------------------------------------------------


def test_the_reserve_is_for_under_share_flows_and_never_for_sheddable() -> None:
    fc = flow_control(reserve=1)
    a, b = Endpoint(2), Endpoint(2)
    a.inflight = b.inflight = 2  # both at the rule
    seats = [fc.shares.take("pool", "big", 1) for _ in range(4)]
    assert fc._reserved("pool", (a, b), "Default", "small", 1, 0.0)
    assert fc._reserved("pool", (a, b), "Critical", "small", 1, 0.0)
    assert not fc._reserved("pool", (a, b), "Sheddable", "small", 1, 0.0)
    assert not fc._reserved("pool", (a, b), "Default", "big", 1, 0.0)  # over its share
    assert fc.metrics.reserved.labels("Default", "small").value == 1
    assert fc.metrics.reserved.labels("Critical", "small").value == 1
    # Where it goes: below the rule if any, else within the reserve.
    b.inflight = 1
    assert fc._room((a, b), 0.0) == [b]
    b.inflight = 2
    assert fc._room((a, b), 0.0) == [a, b]
    a.inflight = 3  # a's reserve used up
    assert fc._room((a, b), 0.0) == [b]
    b.inflight = 3
    assert not fc._reserved("pool", (a, b), "Default", "small", 1, 0.0)  # no reserve left
    assert fc._room((a, b), 0.0) == (a, b)
    for seat in seats:
        assert seat is not None
        fc.shares.release(seat)
    assert fc.shares.held() == 0


async def test_without_a_reserve_nothing_is_counted_and_nobody_goes_past_the_rule() -> None:
    fc = flow_control(reserve=0)
    a = Endpoint(2)
    a.inflight = 1
    assert await fc.admit("m", pool(a), "Critical", "small", 1, 10) == ((a,), None, None, ANY)
    assert fc.shares.slack == 1  # the guard's slack for priority engines: one seat
    assert flow_control(reserve=2).shares.slack == 2  # the reserve's
    a.inflight = 2
    assert not fc._reserved("pool", (a,), "Critical", "small", 1, 0.0)
    assert fc._room((a,), 0.0) == (a,)


async def test_a_queued_under_share_waiter_goes_when_the_reserve_has_room() -> None:
    fc = flow_control(reserve=1)
    a = Endpoint(1)
    a.inflight = 2  # at the rule and its reserve: everyone waits
    big_seats = [fc.shares.take("pool", "big", 1), fc.shares.take("pool", "big", 1)]
    went: list[str] = []

    async def request(criticality: str, tenant: str) -> None:
        await fc.wait("pool", (a,), criticality, tenant, 1, 10)
        a.inflight += 1
        went.append(tenant)

    tasks = [
        asyncio.create_task(request(c, t))
        for c, t in (("Critical", "big"), ("Sheddable", "bulk"), ("Default", "small"))
    ]
    for _ in range(5):
        await asyncio.sleep(0)
    assert fc.waiting() == 3 and went == []
    a.inflight = 1  # one finished: room within the reserve only
    seat = big_seats.pop()
    assert seat is not None
    fc.shares.release(seat)
    fc.pump()
    for _ in range(10):
        await asyncio.sleep(0)
    # The small tenant goes, past the Critical waiter of the over-share big tenant; the
    # Sheddable one does not.
    assert went == ["small"]
    assert fc.metrics.reserved.labels("Default", "small").value == 1
    a.inflight = 0  # room below the rule: the queue's own order again
    fc.pump()
    for _ in range(10):
        await asyncio.sleep(0)
    assert went == ["small", "big"]
    for task in tasks[1:]:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_flow_control_reserve_setting() -> None:
    assert config_from_dict({"gateway": {"flowControlReserve": 2}}).flow_control_reserve == 2
    assert config_from_dict({}).flow_control_reserve == 0
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="flowControlReserve"):
            config_from_dict({"gateway": {"flowControlReserve": bad}})


async def test_a_priority_engine_counts_shares_without_a_reserve_and_seats_note_the_share() -> None:
    fc = flow_control(reserve=0)
    fcfs, prio = Endpoint(9), Endpoint(9, priority_scheduling=True)

    async def seat(tenant: str, *candidates: Endpoint, fc: FlowControl = fc) -> object:
        return (await fc.admit("m", pool(*candidates), "Default", tenant, 1, 10))[1]

    assert await seat("big", fcfs) is None
    big = [await seat("big", fcfs, prio) for _ in range(3)]
    assert big[0].under and not big[1].under and not big[2].under  # alone it holds everything
    small = await seat("small", fcfs, prio)
    assert small.under  # nothing in flight: under its share
    assert await seat("big", prio, fc=flow_control(reserve=0, enabled=False)) is None
    for s in [*big, small]:
        fc.done(s)
    assert fc.shares.held() == 0


def test_the_reserve_sends_to_the_endpoint_where_the_request_starts_soonest() -> None:
    # Real endpoint states under the gateway's own saturation rule (saturationMaxInflight 2,
    # a reserve of 2): every endpoint is at the rule, so an admitted request goes within the
    # reserve, to a free sequence slot first, then to the fewest prefills under way, then to
    # the fewest in flight.
    from llmplane.gateway.admission import Admission
    from llmplane.gateway.config import GatewayConfig
    from llmplane.gateway.outliers import Outliers
    from llmplane.gateway.registry import EndpointState
    from llmplane.runtime.endpoint import Endpoint as Replica

    config = GatewayConfig(saturation_max_inflight=2, saturation_inflight=2)
    admission = Admission(config, Outliers(config))
    fc = FlowControl(admission, reserve=2)
    a, b, c = (EndpointState(Replica(f"127.0.0.1:{p}", {}, "m", max_num_seqs=3)) for p in (1, 2, 3))

    def load(state: EndpointState, inflight: int, prefilling: int) -> None:
        state.inflight, state.prefilling = inflight, prefilling

    load(a, 2, 1)
    load(b, 2, 0)
    load(c, 3, 0)  # its 3 slots taken: a request sent there waits for one to free
    assert fc._room((a, b, c), 0.0) == [b]  # a slot free and no prefill under way
    load(b, 3, 0)
    assert fc._room((a, b, c), 0.0) == [a]  # the only free slot, though a prefill is under way
    load(a, 3, 1)
    assert fc._room((a, b, c), 0.0) == [b, c]  # no slot anywhere: no prefill under way
    load(c, 4, 0)
    assert fc._room((a, b, c), 0.0) == [b]  # c's reserve is used up
    for state in (a, b, c):
        state.capacity = 0.0  # slots not known: by prefills, then in flight
    load(a, 2, 0)
    load(b, 3, 0)
    load(c, 2, 0)
    assert fc._room((a, b, c), 0.0) == [a, c]  # ties stay for the scheduler to choose from
    load(b, 1, 2)
    assert fc._room((a, b, c), 0.0) == [b]  # below the rule: the scheduler's choice, as before
