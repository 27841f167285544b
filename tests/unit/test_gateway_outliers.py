"""Outlier ejection (``llmplane.gateway.outliers.Outliers``): when a replica is ejected, for how
long, how it comes back on probation, and what forgives it. Pure state, explicit clock."""

from __future__ import annotations

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.observability import Counter
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.registry import EndpointState
from llmplane.runtime.endpoint import Endpoint

CONFIG = GatewayConfig(ejection_failures=3, ejection_base=10.0, ejection_max=35.0)


def state(address: str = "10.0.0.1:8000", engine: str = "vllm") -> EndpointState:
    s = EndpointState(Endpoint(address, engine=engine))
    s.has_load_metrics = True
    return s


def test_ejected_after_n_consecutive_failures_and_only_then() -> None:
    ejections = Counter("ejections", "", ["endpoint"])
    outliers = Outliers(CONFIG, ejections)

    def ejected() -> list[str]:
        return [a for (a,), child in ejections.children.items() for _ in range(int(child.value))]

    s = state()
    outliers.failure(s, now=100.0)
    outliers.failure(s, now=100.0)
    assert s.ejected_until == 0.0 and s.consecutive_failures == 2 and ejected() == []
    outliers.failure(s, now=100.0)
    assert s.ejected_until == 110.0 and s.ejections == 1 and s.consecutive_failures == 0
    assert ejected() == [s.address]


def test_a_success_resets_the_count_of_consecutive_failures() -> None:
    outliers = Outliers(CONFIG)
    s = state()
    for _ in range(5):  # fail, fail, succeed: never three in a row
        outliers.failure(s, now=0.0)
        outliers.failure(s, now=0.0)
        outliers.success(s)
    assert s.ejected_until == 0.0 and s.ejections == 0


def test_cooldown_doubles_per_ejection_up_to_the_maximum() -> None:
    outliers = Outliers(CONFIG)
    s = state()
    cooldowns = []
    now = 0.0
    for _ in range(4):
        for _ in range(3):
            outliers.failure(s, now=now)
        cooldowns.append(s.ejected_until - now)
        now = s.ejected_until
        assert outliers.available([s], now) == [s]  # readmitted on probation
        assert s.probation
        s.probation = False  # count full runs of failures, not probation failures
    assert cooldowns == [10.0, 20.0, 35.0, 35.0]


def test_ejected_replicas_are_skipped_until_the_cooldown_is_over() -> None:
    outliers = Outliers(CONFIG)
    bad, good = state("10.0.0.1:8000"), state("10.0.0.2:8000")
    for _ in range(3):
        outliers.failure(bad, now=0.0)
    assert outliers.available([bad, good], 5.0) == [good]
    assert outliers.available([bad, good], 9.99) == [good]
    assert outliers.available([bad, good], 10.0) == [bad, good]
    assert bad.probation and bad.ejected_until == 0.0


def test_when_every_candidate_is_ejected_all_are_tried() -> None:
    outliers = Outliers(CONFIG)
    a, b = state("10.0.0.1:8000"), state("10.0.0.2:8000")
    for s in (a, b):
        for _ in range(3):
            outliers.failure(s, now=0.0)
    assert outliers.available([a, b], 1.0) == [a, b]  # fail open, not a 503
    assert a.ejected_until and b.ejected_until and not a.probation  # still ejected


def test_readmission_waits_for_the_metrics_endpoint_to_answer() -> None:
    outliers = Outliers(CONFIG)
    s, other = state(), state("10.0.0.2:8000")
    for _ in range(3):
        outliers.failure(s, now=0.0)
    s.scrape_ok = False  # the scraper cannot reach it
    assert outliers.available([s, other], 50.0) == [other]
    s.scrape_ok = True
    assert outliers.available([s, other], 50.0) == [s, other]
    # An engine without metrics cannot prove itself: readmitted once the time is up.
    bare, other = state("10.0.0.3:8000", engine="ollama"), state("10.0.0.4:8000")
    for _ in range(3):
        outliers.failure(bare, now=0.0)
    bare.has_load_metrics, bare.scrape_ok = False, False
    assert outliers.available([bare, other], 50.0) == [bare, other]


def test_one_failure_on_probation_ejects_again_for_longer() -> None:
    outliers = Outliers(CONFIG)
    s = state()
    for _ in range(3):
        outliers.failure(s, now=0.0)
    outliers.available([s], 10.0)
    assert s.probation
    outliers.failure(s, now=10.0)  # one is enough
    assert s.ejected_until == 30.0 and s.ejections == 2 and not s.probation


def test_probation_success_then_a_second_success_forgives_past_ejections() -> None:
    outliers = Outliers(CONFIG)
    s = state()
    for _ in range(3):
        outliers.failure(s, now=0.0)
    outliers.available([s], 10.0)
    outliers.success(s)  # ends the probation
    assert not s.probation and s.ejections == 1
    outliers.success(s)  # two in a row: the history is forgiven
    assert s.ejections == 0
    for _ in range(3):
        outliers.failure(s, now=100.0)
    assert s.ejected_until == 110.0  # back to the base cool-down


def test_failures_of_requests_in_flight_at_the_ejection_do_not_eject_it_again() -> None:
    ejections = Counter("ejections", "", ["endpoint"])
    outliers = Outliers(CONFIG, ejections)

    def ejected() -> list[str]:
        return [a for (a,), child in ejections.children.items() for _ in range(int(child.value))]

    s = state()
    for _ in range(3):
        outliers.failure(s, now=100.0)
    assert s.ejected_until == 110.0 and s.ejections == 1
    for _ in range(20):  # the other streams the killed replica had, failing one after another
        outliers.failure(s, now=100.5)
    assert s.ejected_until == 110.0 and s.ejections == 1 and ejected() == [s.address]
    assert outliers.available([s], 110.0) == [s] and s.probation  # back after one cool-down
