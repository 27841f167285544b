"""The queue estimate with the engine's room (``registry.scraped_room``): requests sent since
the last scrape count as waiting only beyond the free slots the engine had then, which the
gateway learns from what the engine was seen to hold without queueing. Pure state, explicit
clock; the scrapes go through ``scraper.apply_metrics`` as the scraper applies them."""

from __future__ import annotations

from llmplane.gateway.admission import Admission
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import endpoint_from_object, endpoint_object
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.registry import EndpointState, queue_estimates, scraped_room
from llmplane.gateway.scheduler.framework import SchedulingContext
from llmplane.gateway.scheduler.plugins import LowQueueFilter, QueueScorer
from llmplane.gateway.scraper import LoadMetrics, apply_metrics
from llmplane.runtime.endpoint import Endpoint, max_num_seqs, pod_max_num_seqs

NOW = 100.0
STALENESS = 0.2


def endpoint(i: int = 1) -> EndpointState:
    return EndpointState(Endpoint(f"10.0.0.{i}:8000", {}, "m"))


def scrape(state: EndpointState, waiting: float, running: float) -> None:
    """A scrape sent now (with the gateway's in-flight count as it is) and answered."""
    apply_metrics(state, LoadMetrics(waiting=waiting, running=running, kv=0.1), NOW, state.inflight)


def send(state: EndpointState, n: int) -> None:
    state.add_inflight(n)


def saturated(state: EndpointState, **config: object) -> bool:
    c = GatewayConfig(metrics_staleness=STALENESS, **config)  # type: ignore[arg-type]
    return Admission(c, Outliers(c)).saturated(state, NOW)


def estimate(state: EndpointState) -> float:
    return state.queue_estimate(STALENESS, NOW)


def learn_capacity(state: EndpointState, capacity: int) -> None:
    """The engine seen full once (requests waiting while ``capacity`` run), then idle again."""
    send(state, capacity + 3)
    scrape(state, waiting=3, running=capacity)
    send(state, -(capacity + 3))
    scrape(state, waiting=0, running=0)


def test_capacity_is_what_the_engine_runs_while_requests_wait_and_grows_by_evidence():
    assert scraped_room(0.0, waiting=0, running=0, sent=0) == (0.0, 0.0)  # nothing known
    assert scraped_room(0.0, waiting=4, running=16, sent=20) == (16, 0.0)  # full at 16
    assert scraped_room(16.0, waiting=0, running=3, sent=2) == (16, 13)  # 13 free slots
    # Nothing waits while it runs 20 (or while this gateway has 20 in flight that it does not
    # count, like an upstream whose metrics say nothing runs): it holds at least 20.
    assert scraped_room(16.0, waiting=0, running=20, sent=5) == (20, 0.0)
    assert scraped_room(16.0, waiting=0, running=0, sent=24) == (24, 0.0)
    # Requests wait while it runs fewer than learned, at two scrapes in a row (its KV cache
    # is the limit now): the capacity follows it down and there is no room.
    assert scraped_room(24.0, waiting=2, running=10, sent=12, waited=True) == (10, 0.0)


def test_a_burst_within_the_engines_room_is_not_counted_as_waiting():
    state = endpoint()
    learn_capacity(state, 16)
    assert (state.capacity, state.room) == (16, 16)
    send(state, 12)  # a burst of 12 between two scrapes onto an idle engine with 16 slots
    assert estimate(state) == 0
    assert not saturated(state, saturation_queue=5)  # the old estimate said 12 waiting
    send(state, 4 + 5)  # the room used up, then saturation_queue more
    assert estimate(state) == 5 and not saturated(state, saturation_queue=5)
    send(state, 1)
    assert estimate(state) == 6 and saturated(state, saturation_queue=5)
    # The next scrape: the engine runs 16 and queues 10; nothing was sent since.
    scrape(state, waiting=10, running=16)
    assert (state.capacity, state.room, estimate(state)) == (16, 0, 10)
    send(state, -3)  # three finished: three of the waiting ones run now
    assert estimate(state) == 7


def test_a_cold_engine_holds_a_burst_until_it_is_seen_to_take_it():
    # No capacity known yet (a fresh engine, idle at its first scrape): a burst counts as
    # waiting at once, as before, so that flow control holds what is beyond saturationQueue.
    state = endpoint()
    scrape(state, waiting=0, running=0)
    assert (state.capacity, state.room) == (0, 0)
    send(state, 1000)
    assert estimate(state) == 1000 and saturated(state, saturation_queue=5)
    # ... until the engine reports what it took: the requests it runs are room from then on.
    scrape(state, waiting=0, running=6)
    assert (state.capacity, state.room) == (1000, 0)  # all 1,000 in flight, none waiting
    scrape(state, waiting=744, running=256)  # and when it reports a queue, held back again
    assert (state.room, estimate(state)) == (0, 744)
    assert saturated(state, saturation_queue=5)
    scrape(state, waiting=700, running=256)  # still queued a scrape later: that is its capacity
    assert (state.capacity, estimate(state)) == (256, 700)


def test_one_scrape_with_just_arrived_requests_waiting_does_not_lower_the_capacity():
    # vLLM and the sim count a request as waiting until their next step schedules it: a scrape
    # at that moment shows a few waiting while slots are free. Not a full engine.
    state = endpoint()
    learn_capacity(state, 16)
    send(state, 7)
    scrape(state, waiting=2, running=5)
    assert (state.capacity, state.room) == (16, 0)  # no room while they wait, but 16 kept
    scrape(state, waiting=0, running=7)  # the next step ran them
    assert (state.capacity, state.room) == (16, 9)
    send(state, 9)  # a burst that fits the 9 free slots: none of it counted as waiting
    assert estimate(state) == 0
    # Requests still waiting a scrape later while it runs 10: it holds 10 now.
    send(state, 4)
    scrape(state, waiting=3, running=10)
    assert state.capacity == 16
    scrape(state, waiting=2, running=10)
    assert (state.capacity, state.room) == (10, 0)


def test_the_configured_concurrency_is_a_floor_for_the_learned_capacity():
    state = EndpointState(Endpoint("10.0.0.1:8000", max_num_seqs=16))
    send(state, 12)
    for _ in range(3):  # waiting at every scrape while it runs 10 (a KV cache limit)
        scrape(state, waiting=2, running=10)
    assert (state.capacity, state.room) == (16, 0)
    send(state, 12)
    scrape(state, waiting=4, running=20)  # more than configured: it holds 20
    assert state.capacity == 20


def test_the_kv_rule_saturates_whatever_the_room():
    state = endpoint()
    learn_capacity(state, 16)
    apply_metrics(state, LoadMetrics(waiting=0, running=0, kv=0.97), NOW, 0)
    assert state.room == 16 and estimate(state) == 0
    assert saturated(state, saturation_kv=0.95)


def test_endpoints_with_room_tie_in_the_queue_scorer_and_pass_the_low_queue_filter():
    a, b = endpoint(1), endpoint(2)
    learn_capacity(a, 16)
    learn_capacity(b, 4)
    send(a, 3)
    # Both have room: their queues are 0 whatever room is left (which is only what each was
    # seen to hold, not what it could): least-request spreads them, not the queue scorer.
    assert queue_estimates([a, b], STALENESS, NOW) == [0.0, 0.0]
    ctx = SchedulingContext("m", b"", now=NOW, staleness=STALENESS)
    assert QueueScorer().score(ctx, [a, b]) == [1.0, 1.0]
    send(b, 6)  # b's room used up, and 2 more
    assert QueueScorer().score(ctx, [a, b]) == [1.0, 0.0]
    # The low-queue filter keeps an endpoint with room whatever was sent within it.
    send(a, 13)  # 16 in flight: its room used up, nothing counted as waiting yet
    assert LowQueueFilter(threshold=1).filter(ctx, [a, b]) == [a]
    send(a, 1)
    assert LowQueueFilter(threshold=1).filter(ctx, [a, b]) == []


def test_the_configured_concurrency_is_the_capacity_from_the_start():
    state = EndpointState(Endpoint("10.0.0.1:8000", max_num_seqs=32))
    scrape(state, waiting=0, running=2)
    assert (state.capacity, state.room) == (32, 30)
    send(state, 30)
    assert estimate(state) == 0


def test_the_concurrency_flags_of_an_engine_command_line():
    assert max_num_seqs(["vllm", "serve", "m", "--max-num-seqs", "64"]) == 64
    assert max_num_seqs(["python", "-m", "sglang", "--max-running-requests=48"]) == 48
    assert max_num_seqs(["--max-num-seqs", "8", "--max-num-seqs", "16"]) == 16  # last wins
    for bad in (["--max-num-seqs"], ["--max-num-seqs", "x"], ["--max-num-seqs=-3"],
                ["--max-num-seqs", "0"], ["--max-num-seqs", "\u00b2"], ["--max-num-seqs", "9" * 5000], ["--max-num-seqs", "99999999999"], ["serve", "m"]):  # fmt: skip
        assert max_num_seqs(bad) == 0, bad


def test_an_endpoint_object_carries_its_concurrency_and_a_bad_one_is_ignored():
    obj = endpoint_object("e", "10.0.0.1:8000", "m", max_num_seqs=24)
    assert obj["spec"]["maxNumSeqs"] == 24
    assert endpoint_from_object(obj).max_num_seqs == 24
    for bad in (0, -1, "12", True, 1 << 40):
        obj["spec"]["maxNumSeqs"] = bad
        assert endpoint_from_object(obj).max_num_seqs == 0
    assert endpoint_from_object(endpoint_object("e", "10.0.0.1:8000", "m")).max_num_seqs == 0


def test_a_pods_containers_give_their_concurrency():
    def pod(*containers: object) -> dict:
        return {"spec": {"containers": list(containers)}}

    sidecar = {"command": ["envoy"], "args": ["--max-num-seqs"]}
    engine = {"command": ["python3", "-m", "vllm"], "args": ["--max-num-seqs", "128"]}
    assert pod_max_num_seqs(pod(sidecar, engine)) == 128
    assert pod_max_num_seqs(pod({"args": ["--max-num-seqs=16"]})) == 16
    for bad in ({}, {"spec": None}, {"spec": {"containers": "x"}}, pod("x"), pod({"args": "x"})):
        assert pod_max_num_seqs(bad) == 0
    assert pod_max_num_seqs(pod({"args": ["--max-num-seqs", 12]})) == 0  # not a string


def test_the_kv_rule_sees_the_blocks_of_requests_that_finished_since_the_scrape():
    # An engine seen with 8 running and its KV cache full: saturated until a request finishes;
    # the gateway sees that at once (a flow-control waiter goes then, not at the next scrape).
    state = endpoint()
    send(state, 8)
    apply_metrics(state, LoadMetrics(waiting=0, running=8, kv=1.0), NOW, state.inflight)
    assert saturated(state, saturation_kv=0.8)
    send(state, -1)
    assert state.kv_estimate() == 7 / 8 and saturated(state, saturation_kv=0.8)
    send(state, -1)
    assert state.kv_estimate() == 6 / 8 and not saturated(state, saturation_kv=0.8)
    send(state, 1)  # sent since: counted as KV again (and in the queue estimate)
    assert saturated(state, saturation_kv=0.8)
    send(state, -7)
    assert state.kv_estimate() == 0.0


def test_requests_waiting_in_the_engine_take_the_blocks_freed_first():
    state = endpoint()
    send(state, 10)
    apply_metrics(state, LoadMetrics(waiting=2, running=8, kv=1.0), NOW, state.inflight)
    send(state, -2)  # the two waiting ones start in the freed blocks
    assert state.kv_estimate() == 1.0 and saturated(state, saturation_kv=0.8)
    send(state, -2)
    assert state.kv_estimate() == 6 / 8
