"""The saturation rule (``llmplane.gateway.admission.Admission.saturated``): what makes an endpoint
count as full, the question flow control and shedding ask. Pure state, explicit clock."""

from __future__ import annotations

import pytest

from llmplane.gateway.admission import Admission
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.errors import Overloaded
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.routing import Backend
from llmplane.runtime.endpoint import Endpoint

NOW = 100.0


def admission(**config: object) -> Admission:
    c = GatewayConfig(saturation_inflight=4, metrics_staleness=0.2, **config)  # type: ignore[arg-type]
    return Admission(c, Outliers(c))


def scraped(waiting: float = 0.0, inflight: int = 0, at: float = NOW) -> EndpointState:
    s = EndpointState(Endpoint("10.0.0.1:8000"))
    s.has_load_metrics, s.scraped_at, s.waiting = True, at, waiting
    s.inflight = s.inflight_at_scrape = inflight
    return s


def test_fresh_metrics_decide_and_stale_ones_saturate() -> None:
    a = admission(saturation_queue=5)
    assert not a.saturated(scraped(waiting=1), NOW)
    assert a.saturated(scraped(waiting=6), NOW)
    assert a.saturated(scraped(waiting=0, at=NOW - 1.0), NOW)  # too old to trust


def test_unreadable_metrics_fall_back_to_the_gateways_own_count() -> None:
    # The scraper cannot read the engine now: its last figures are stale, but that is no sign
    # of load; the gateway's in-flight count decides, as for an engine without metrics.
    a = admission()
    s = scraped(at=NOW - 1.0, inflight=3)
    s.scrape_ok = False
    assert not a.saturated(s, NOW)
    s.inflight = 4
    assert a.saturated(s, NOW)


def test_the_in_flight_cap_saturates_whatever_the_metrics_say() -> None:
    s = scraped(inflight=2)
    assert not admission().saturated(s, NOW)
    assert admission(saturation_max_inflight=2).saturated(s, NOW)
    assert not admission(saturation_max_inflight=3).saturated(s, NOW)
    # A Sheddable request is shed only when every candidate is saturated.
    with pytest.raises(Overloaded):
        admission(saturation_max_inflight=2).admit(
            "m", Backend("b", (s, s)), NOW, "Sheddable", True
        )
    mixed = Backend("b", (s, scraped(waiting=9)))
    assert admission(saturation_max_inflight=3).admit("m", mixed, NOW, "Sheddable", True)


def test_the_prefill_cap_saturates_while_that_many_first_chunks_are_due() -> None:
    s = scraped(inflight=3)
    s.prefilling = 1
    assert not admission().saturated(s, NOW)  # off by default
    assert admission(saturation_max_prefilling=1).saturated(s, NOW)
    assert not admission(saturation_max_prefilling=2).saturated(s, NOW)
    s.prefilling = 0  # the first chunk came: room again, whatever the in-flight count
    assert not admission(saturation_max_prefilling=1).saturated(s, NOW)


def test_the_prefill_cap_steers_the_pick_to_endpoints_with_room() -> None:
    busy, free = scraped(), scraped()
    busy.prefilling = 1
    a = admission(saturation_max_prefilling=1)
    assert a.with_room([busy, free]) == [free]
    assert list(a.with_room([busy, busy])) == [busy, busy]  # none has room: all
    assert list(admission().with_room([busy, free])) == [busy, free]  # off


def test_the_inflight_cap_steers_the_pick_to_endpoints_with_room() -> None:
    busy, free = scraped(inflight=2), scraped(inflight=1)
    a = admission(saturation_max_inflight=2)
    assert a.with_room([busy, free]) == [free]
    assert list(a.with_room([busy, busy])) == [busy, busy]  # none has room: all
    assert list(admission().with_room([busy, free])) == [busy, free]  # off
