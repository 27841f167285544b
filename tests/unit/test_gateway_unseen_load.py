"""An engine whose load gauges do not show this gateway's load (``registry.unseen_load``): its
``/metrics`` says nothing runs or waits while the gateway has requests on it, as nginx's fixed
page in bench/nginx_upstream.py does. The capacity rule (``scraped_room``) would learn only
what the gateway had in flight at each scrape and keep a closed loop saturated; such an engine
is scheduled as one without load metrics until a scrape reports a request. Pure state, explicit
clock; scrapes go through ``scraper.apply_metrics`` as the scraper applies them."""

from __future__ import annotations

from llmplane.gateway.admission import Admission
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.registry import UNSEEN_LOAD, EndpointState, unseen_load
from llmplane.gateway.scraper import LoadMetrics, apply_metrics, blind
from llmplane.gateway.workers.scrapes import ScrapeTable, apply_row, encode_row
from llmplane.runtime.endpoint import Endpoint

NOW = 100.0
STALENESS = 0.2


def endpoint(max_num_seqs: int = 0) -> EndpointState:
    return EndpointState(Endpoint("10.0.0.1:8000", {}, "m", max_num_seqs=max_num_seqs))


def scrape(state: EndpointState, waiting: float = 0, running: float = 0) -> None:
    """A scrape sent now (with the gateway's in-flight count as it is) and answered."""
    apply_metrics(state, LoadMetrics(waiting=waiting, running=running, kv=0.0), NOW, state.inflight)


def saturated(state: EndpointState) -> bool:
    config = GatewayConfig(metrics_staleness=STALENESS)
    return Admission(config, Outliers(config)).saturated(state, NOW)


def test_requests_unseen_in_a_row_add_up_and_any_reported_request_ends_the_run():
    assert unseen_load(0, waiting=0, running=0, sent=0) == 0  # idle, nothing sent: no evidence
    assert unseen_load(0, waiting=0, running=0, sent=5) == 5
    assert unseen_load(5, waiting=0, running=0, sent=7) == 12
    assert unseen_load(12, waiting=0, running=0, sent=0) == 12  # idle in between: kept
    assert unseen_load(12, waiting=0, running=1, sent=7) == 0
    assert unseen_load(12, waiting=2, running=0, sent=7) == 0
    assert unseen_load(UNSEEN_LOAD - 1, waiting=0, running=0, sent=1000) == UNSEEN_LOAD


def test_an_engine_that_never_reports_load_is_scheduled_on_the_in_flight_count():
    state = endpoint()
    config = GatewayConfig()
    # A closed loop of 32 clients; flow control lets the estimate go to saturationQueue past
    # the learned capacity, and each scrape catches some of them in flight. Before the fix
    # the capacity grew only by what a scrape caught and the loop stayed saturated.
    state.add_inflight(8)
    scrape(state)
    assert state.has_load_metrics and state.capacity == 8
    state.add_inflight(6)
    assert saturated(state)  # 6 past the room: the old behaviour, until the evidence is in
    for _ in range(UNSEEN_LOAD):  # a scrape at a time until 32 went unreported
        scrape(state)
    assert blind(state) and state.scraped_at == NOW and state.unseen == UNSEEN_LOAD
    # Now the 32 (more than the 14 ever caught in flight) are not held, and the queue estimate
    # is the in-flight count, as for an engine without load metrics.
    state.add_inflight(32 - state.inflight)
    assert not saturated(state)
    assert state.queue_estimate(STALENESS, NOW) == 32
    state.add_inflight(config.saturation_inflight - 32 - 1)
    assert not saturated(state)
    state.add_inflight(1)
    assert saturated(state)  # saturationInflight still applies
    # Idle scrapes keep it so; the first scrape that reports a request gives the gauges back.
    state.add_inflight(-state.inflight)
    scrape(state)
    assert not state.has_load_metrics
    state.add_inflight(3)
    scrape(state, running=3)
    assert state.has_load_metrics and not blind(state) and state.unseen == 0
    state.add_inflight(state.capacity - 3 + 6)
    assert saturated(state)  # the capacity rule again: room, then saturationQueue


def test_an_engine_that_reports_its_load_keeps_its_gauges_through_transient_gaps():
    # vLLM or the sim misses a request for a few milliseconds (in transit, being tokenized,
    # answered but not yet relayed): scrapes that catch one or two such requests between
    # scrapes that report the load do not take its gauges away, nor does an idle engine.
    state = endpoint(max_num_seqs=4)
    for _ in range(200):
        scrape(state)  # idle
        state.add_inflight(2)
        scrape(state)  # two in flight, not in its figures yet
        scrape(state, running=2)
        state.add_inflight(-2)
    assert state.has_load_metrics and state.unseen == 0
    for _ in range(UNSEEN_LOAD // 2 - 1):  # a lone pair missed at scrape after scrape
        state.add_inflight(2)
        scrape(state)
        state.add_inflight(-2)
    assert state.has_load_metrics
    # Saturated as its gauges say: 4 running, 6 waiting.
    state.add_inflight(10)
    scrape(state, waiting=6, running=4)
    assert state.has_load_metrics and saturated(state)


def test_the_scraping_worker_publishes_it_to_the_others():
    table = ScrapeTable(2)
    state, follower = endpoint(), endpoint()
    state.add_inflight(UNSEEN_LOAD)
    scrape(state)
    assert not state.has_load_metrics
    table.write(0, encode_row(state))
    row = table.row(0).read(0)
    assert row is not None
    apply_row(follower, row[1])
    assert follower.has_load_metrics is False
