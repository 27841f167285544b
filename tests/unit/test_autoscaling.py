"""The autoscaling decision (controlplane/autoscaling.py): every HPA rule it follows, and the
llmplane extensions (default trigger, scale from and to zero)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplane.api.inference import ElasticConfig, ScaleTrigger
from llmplane.controlplane.autoscaling import (
    DEFAULT_TRIGGER,
    INFLIGHT,
    INFLIGHT_METRIC,
    SIGNAL_ALIASES,
    History,
    ReplicaSignals,
    decide,
    effective_trigger,
    scaling_rules,
)

T0 = 1000.0


def elastic(lo: int = 1, hi: int | None = 10, **extra: Any) -> ElasticConfig:
    body: dict[str, Any] = {"minReplicas": lo, **extra}
    if hi is not None:
        body["maxReplicas"] = hi
    return ElasticConfig.model_validate(body)


def pods(name: str, avg: Any) -> dict[str, Any]:
    return {
        "type": "Pods",
        "pods": {"metric": {"name": name}, "target": {"type": "AverageValue", "averageValue": avg}},
    }


def trigger(*metrics: dict[str, Any], behavior: dict[str, Any] | None = None) -> ScaleTrigger:
    hpa: dict[str, Any] = {"metrics": list(metrics)}
    if behavior is not None:
        hpa["behavior"] = behavior
    return ScaleTrigger.model_validate({"hpa": hpa})


WAITING = trigger(pods("vllm:num_requests_waiting", 4))
# Windows of 0 in both directions: the plain per-metric rule without stabilization.
NO_WINDOW = {"scaleDown": {"stabilizationWindowSeconds": 0}}


def loads(*values: float, key: str = "waiting", ready: bool = True) -> list[ReplicaSignals]:
    return [ReplicaSignals(ready=ready, values={key: v}) for v in values]


def started(current: int) -> History:
    """History as after a first decision long ago (not fresh, nothing recent)."""
    return History(recommendations=(), scale_events=(), last_request_at=0.0)


def run(current: int, signals: list[ReplicaSignals], trig: ScaleTrigger = WAITING, **kw: Any):
    el = kw.pop("el", elastic())
    history = kw.pop("history", started(current))
    return decide(current, signals, el, trig, history, kw.pop("now", T0), **kw)


# --- the per-metric rule --------------------------------------------------------------------------


def test_pods_metric_desired_is_ceil_of_current_times_ratio() -> None:
    d = run(2, loads(6, 6))  # average 6 against 4: ratio 1.5 -> ceil(3.0)
    assert d.desired == 3
    assert "vllm:num_requests_waiting 6 per replica (target 4)" in d.reason
    assert run(3, loads(5, 5, 5)).desired == 4  # ratio 1.25 -> ceil(3.75)


def test_tolerance_ten_percent_both_ways() -> None:
    assert run(2, loads(4.4, 4.4)).desired == 2  # +10 %: no change
    assert "within tolerance" in run(2, loads(4.4, 4.4)).reason
    assert run(2, loads(4.5, 4.5)).desired == 3  # +12.5 %: ceil(2.25)
    down = trigger(pods("vllm:num_requests_waiting", 4), behavior=NO_WINDOW)
    assert run(4, loads(3.6, 3.6, 3.6, 3.6), down).desired == 4  # -10 %
    assert run(4, loads(3.5, 3.5, 3.5, 3.5), down).desired == 4  # ceil(3.5) = 4
    assert run(4, loads(2, 2, 2, 2), down).desired == 2


def test_tolerance_from_behavior_per_direction() -> None:
    trig = trigger(
        pods("vllm:num_requests_waiting", 4),
        behavior={"scaleUp": {"tolerance": "0.5"}, "scaleDown": {"stabilizationWindowSeconds": 0}},
    )
    assert run(2, loads(5.6, 5.6), trig).desired == 2  # +40 % within the 50 % up tolerance
    assert run(2, loads(6.4, 6.4), trig).desired == 4
    assert run(4, loads(3, 3, 3, 3), trig).desired == 3  # down keeps the default 10 %


def test_maximum_over_metrics() -> None:
    trig = trigger(pods("vllm:num_requests_waiting", 4), pods("vllm:kv_cache_usage_perc", "500m"))
    signals = [ReplicaSignals(values={"waiting": 4, "kv_usage": 0.9})] * 2
    d = run(2, signals, trig)
    assert d.desired == 4  # kv 0.9 / 0.5 = 1.8 -> ceil(3.6); waiting is on target
    assert "vllm:kv_cache_usage_perc" in d.reason


def test_engine_names_map_to_the_same_signal() -> None:
    for name in (
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "llamacpp:requests_deferred",
    ):
        assert run(1, loads(8), trigger(pods(name, 4))).desired == 2
    for name in (
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "llamacpp:requests_processing",
    ):
        assert SIGNAL_ALIASES[name] == "running"
        assert run(1, loads(8, key="running"), trigger(pods(name, 4))).desired == 2
    assert run(1, loads(16, key=INFLIGHT), trigger(pods(INFLIGHT_METRIC, 8))).desired == 2


def test_object_and_external_metrics_read_the_model_total() -> None:
    def obj(kind: str, number: float) -> dict[str, Any]:
        key = "value" if kind == "Value" else "averageValue"
        return {
            "type": "Object",
            "object": {
                "describedObject": {"kind": "Playground", "name": "pg"},
                "metric": {"name": "vllm:num_requests_waiting"},
                "target": {"type": kind, key: number},
            },
        }

    # Value: total 12 against 4 -> ratio 3 x 2 ready replicas.
    assert run(2, loads(6, 6), trigger(obj("Value", 4))).desired == 6
    # AverageValue: ceil(total / target) whatever the current count.
    assert run(2, loads(6, 6), trigger(obj("AverageValue", 4))).desired == 3
    ext = {
        "type": "External",
        "external": {
            "metric": {"name": "vllm:num_requests_running"},
            "target": {"type": "AverageValue", "averageValue": 5},
        },
    }
    assert run(1, loads(20, key="running"), trigger(ext)).desired == 4


def test_resource_metrics_read_the_replica_process() -> None:
    cpu = {
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}},
    }
    busy = [ReplicaSignals(values={"cpu": 1.5}, requests={"cpu": 2.0})] * 2  # 75 % of request
    assert run(2, busy, trigger(cpu)).desired == 3
    no_request = [ReplicaSignals(values={"cpu": 1.5})] * 2
    d = run(2, no_request, trigger(cpu))
    assert d.desired == 2 and "resources.requests.cpu" in d.reason
    mem = {
        "type": "Resource",
        "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "1Gi"}},
    }
    big = [ReplicaSignals(values={"memory": 3 * 2**30})]
    assert run(1, big, trigger(mem)).desired == 3


def test_unknown_metric_is_skipped_with_a_reason() -> None:
    d = run(2, loads(100, 100), trigger(pods("my_adapter_metric", 1)))
    assert d.desired == 2
    assert "'my_adapter_metric' is not one the gateway measures" in d.reason
    both = trigger(pods("my_adapter_metric", 1), pods("vllm:num_requests_waiting", 4))
    assert run(2, loads(8, 8), both).desired == 4


def test_no_data_blocks_scale_down_but_not_scale_up() -> None:
    trig = trigger(
        pods("vllm:num_requests_waiting", 4),
        pods("vllm:kv_cache_usage_perc", "0.5"),
        behavior=NO_WINDOW,
    )
    idle = loads(0, 0, 0)  # waiting known, kv never reported
    d = run(3, idle, trig)
    assert d.desired == 3 and "scale-down blocked" in d.reason
    assert run(3, loads(8, 8, 8), trig).desired == 6


def test_starting_replicas_count_as_idle_when_scaling_up() -> None:
    # 2 ready replicas at 8 (ratio 2) and 2 starting: the HPA counts the starting ones as 0,
    # ratio (16 / 4) / 4 = 1.0 -> no new replica while they start.
    signals = [*loads(8, 8), ReplicaSignals(ready=False), ReplicaSignals(ready=False)]
    d = run(4, signals)
    assert d.desired == 4 and "start" in d.reason
    # Enough load to want more even then: 2 x 16 over 4 replicas = ratio 2 -> 8.
    assert run(4, loads(16, 16) + [ReplicaSignals(ready=False)] * 2).desired == 8


def test_replicas_without_data_count_as_on_target_when_scaling_down() -> None:
    trig = trigger(pods("vllm:num_requests_waiting", 4), behavior=NO_WINDOW)
    signals = loads(0, 0) + [ReplicaSignals(values={})] * 2  # two not scraped yet
    # Without data taken as target (4): average 2 -> ratio 0.5 -> ceil(0.5 x 4) = 2.
    assert run(4, signals, trig).desired == 2
    # When scaling up they count as idle, like starting replicas: (8 + 8) over 4 is on target.
    assert run(4, loads(8, 8) + [ReplicaSignals(values={})] * 2, trig).desired == 4
    assert run(4, loads(16, 16) + [ReplicaSignals(values={})] * 2, trig).desired == 8


# --- stabilization --------------------------------------------------------------------------------


def test_scale_down_waits_for_the_stabilization_window() -> None:
    el = elastic(1, 10)
    h = started(4)
    d = decide(4, loads(8, 8, 8, 8), el, WAITING, h, T0)  # recommends 8
    assert d.desired == 8
    h = d.history
    # Load gone right after: the window still holds the 8 recommendation for 300 s.
    d = decide(8, loads(0, 0, 0, 0, 0, 0, 0, 0), el, WAITING, h, T0 + 60)
    assert d.desired == 8 and "300 s stabilization window" in d.reason
    d = decide(8, loads(*[0] * 8), el, WAITING, d.history, T0 + 299)
    assert d.desired == 8
    d = decide(8, loads(*[0] * 8), el, WAITING, d.history, T0 + 301)
    assert d.desired == 1  # the 8 left the window; later zero recommendations


def test_scale_down_window_takes_the_highest_recent_recommendation() -> None:
    trig = trigger(
        pods("vllm:num_requests_waiting", 4),
        behavior={"scaleDown": {"stabilizationWindowSeconds": 30}},
    )
    el = elastic(1, 10)
    h = History(recommendations=((T0 - 20, 6), (T0 - 10, 3), (T0 - 40, 9)), last_request_at=0.0)
    d = decide(8, loads(*[0] * 8), el, trig, h, T0)
    assert d.desired == 6  # 9 is outside the 30 s window, 6 is the highest inside


def test_scale_up_window_takes_the_lowest_recent_recommendation() -> None:
    trig = trigger(
        pods("vllm:num_requests_waiting", 4),
        behavior={"scaleUp": {"stabilizationWindowSeconds": 60}},
    )
    h = History(recommendations=((T0 - 30, 3), (T0 - 90, 1)), last_request_at=0.0)
    d = decide(2, loads(16, 16), elastic(1, 10), trig, h, T0)  # wants 8, lowest recent 3
    assert d.desired == 3
    assert d.history.recommendations[-1] == (T0, 8)  # the unstabilized recommendation is kept


def test_a_fresh_history_does_not_scale_down_at_once() -> None:
    d = decide(5, loads(*[0] * 5), elastic(1, 10), WAITING, History(), T0)
    assert d.desired == 5
    d = decide(5, loads(*[0] * 5), elastic(1, 10), WAITING, d.history, T0 + 301)
    assert d.desired == 1


# --- rate limits (behavior policies) -------------------------------------------------------------


def test_default_scale_up_policy_is_four_pods_or_double_per_15_s() -> None:
    huge = 1000.0
    assert run(1, loads(huge), el=elastic(1, 100)).desired == 5  # max(1 + 4, 2)
    assert run(10, loads(*[huge] * 10), el=elastic(1, 100)).desired == 20  # max(14, 20)
    d = run(1, loads(huge), el=elastic(1, 100))
    # 5 s later (same 15 s period) the period started at 1: no further step yet.
    d2 = decide(5, loads(*[huge] * 5), elastic(1, 100), WAITING, d.history, T0 + 5)
    assert d2.desired == 5 and "scale-up policy" in d2.reason
    d3 = decide(5, loads(*[huge] * 5), elastic(1, 100), WAITING, d.history, T0 + 16)
    assert d3.desired == 10


def test_default_scale_down_policy_allows_everything_at_once() -> None:
    trig = trigger(pods("vllm:num_requests_waiting", 4), behavior=NO_WINDOW)
    assert run(10, loads(*[0] * 10), trig).desired == 1


def test_pods_and_percent_policies_with_select_policy() -> None:
    def up(select: str | None) -> ScaleTrigger:
        rules: dict[str, Any] = {
            "policies": [
                {"type": "Pods", "value": 1, "periodSeconds": 60},
                {"type": "Percent", "value": 50, "periodSeconds": 60},
            ]
        }
        if select:
            rules["selectPolicy"] = select
        return trigger(pods("vllm:num_requests_waiting", 4), behavior={"scaleUp": rules})

    big = loads(*[100] * 4)
    assert run(4, big, up(None), el=elastic(1, 50)).desired == 6  # Max: ceil(4 x 1.5)
    assert run(4, big, up("Max"), el=elastic(1, 50)).desired == 6
    assert run(4, big, up("Min"), el=elastic(1, 50)).desired == 5  # 4 + 1
    d = run(4, big, up("Disabled"), el=elastic(1, 50))
    assert d.desired == 4


def test_scale_down_pods_policy_per_period() -> None:
    trig = trigger(
        pods("vllm:num_requests_waiting", 4),
        behavior={
            "scaleDown": {
                "stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
            }
        },
    )
    el = elastic(1, 10)
    d = decide(5, loads(*[0] * 5), el, trig, started(5), T0)
    assert d.desired == 4
    d = decide(4, loads(*[0] * 4), el, trig, d.history, T0 + 30)
    assert d.desired == 4 and "scale-down policy" in d.reason
    d = decide(4, loads(*[0] * 4), el, trig, d.history, T0 + 61)
    assert d.desired == 3


def test_percent_scale_down_rounds_down_and_select_min_is_the_smallest_change() -> None:
    trig = trigger(
        pods("vllm:num_requests_waiting", 4),
        behavior={
            "scaleDown": {
                "stabilizationWindowSeconds": 0,
                "selectPolicy": "Min",
                "policies": [
                    {"type": "Percent", "value": 50, "periodSeconds": 60},
                    {"type": "Pods", "value": 1, "periodSeconds": 60},
                ],
            }
        },
    )
    assert run(5, loads(*[0] * 5), trig).desired == 4  # Min: 5 - 1 = 4 over floor(2.5) = 2
    trig_max = trig.model_copy(deep=True)
    assert trig_max.hpa.behavior and trig_max.hpa.behavior.scale_down
    trig_max.hpa.behavior.scale_down.select_policy = "Max"
    assert run(5, loads(*[0] * 5), trig_max).desired == 2


def test_behavior_defaults_fill_in_field_by_field() -> None:
    up, down = scaling_rules(None)
    assert (up.window, down.window) == (0, 300)
    assert {(p.type, p.value, p.period_seconds) for p in up.policies} == {
        ("Pods", 4, 15),
        ("Percent", 100, 15),
    }
    assert [(p.type, p.value) for p in down.policies] == [("Percent", 100)]
    up, down = scaling_rules(trigger(behavior={"scaleDown": {"selectPolicy": "Min"}}).hpa.behavior)
    assert down.window == 300 and down.select == "Min" and up.select == "Max"


# --- bounds -----------------------------------------------------------------------------------


def test_clamped_to_max_and_min_replicas() -> None:
    d = run(2, loads(100, 100), el=elastic(1, 3))
    assert d.desired == 3 and "maxReplicas" in d.reason
    trig = trigger(pods("vllm:num_requests_waiting", 4), behavior=NO_WINDOW)
    d = run(3, loads(0, 0, 0), trig, el=elastic(2, 5))
    assert d.desired == 2 and "minReplicas" in d.reason
    assert run(7, loads(*[4] * 7), el=elastic(1, 3)).desired == 3  # above max whatever the load
    assert run(1, loads(0), el=elastic(2, 3)).desired == 2  # below min whatever the load


def test_max_replicas_unset_means_unbounded() -> None:
    assert run(10, loads(*[100] * 10), el=elastic(1, None)).desired == 20


# --- the default trigger (llmaz's blog example) -------------------------------------------------


def test_blog_example_without_trigger_scales_on_the_default() -> None:
    el = elastic(1, 3)  # elasticConfig: {minReplicas: 1, maxReplicas: 3}, no scaleTrigger
    trig = effective_trigger(el, None)
    assert trig is DEFAULT_TRIGGER
    busy = loads(40, key=INFLIGHT)  # 40 requests in flight on the only replica
    d = decide(1, busy, el, trig, started(1), T0)
    assert d.desired == 3 and INFLIGHT_METRIC in d.reason
    assert effective_trigger(None, None) is None  # no elasticConfig: fixed replicas
    own = trigger(pods("vllm:num_requests_waiting", 4))
    assert effective_trigger(el, own) is own  # the recommended config's trigger
    pg_trigger = elastic(1, 3, scaleTrigger={"hpa": {"metrics": [pods(INFLIGHT_METRIC, 2)]}})
    assert effective_trigger(pg_trigger, own) is pg_trigger.scale_trigger
    # Behavior only: the default metric with that behavior (an HPA without metrics has one too).
    behavior_only = elastic(
        1, 3, scaleTrigger={"hpa": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 5}}}}
    )
    merged = effective_trigger(behavior_only, None)
    assert merged is not None and merged.hpa.metrics == DEFAULT_TRIGGER.hpa.metrics
    assert merged.hpa.behavior == behavior_only.scale_trigger.hpa.behavior  # type: ignore[union-attr]


# --- scale from and to zero (llmplane extension) ------------------------------------------------


def test_scale_from_zero_on_demand_only() -> None:
    el = elastic(0, 3)
    d = decide(0, [], el, WAITING, started(0), T0)
    assert d.desired == 0 and "no replica" in d.reason
    d = decide(0, [], el, WAITING, started(0), T0, demand=2)
    assert d.desired == 1 and "scale from zero: 2 request(s)" in d.reason
    assert (
        decide(0, [], elastic(0, 3), WAITING, started(0), T0, demand=1).history.last_request_at
        == T0
    )


def test_last_replica_stops_only_after_the_idle_period() -> None:
    trig = trigger(pods("vllm:num_requests_waiting", 4), behavior=NO_WINDOW)
    el = elastic(0, 3, scaleToZeroAfterSeconds=60)
    h = History(last_request_at=T0 - 30, recommendations=((T0 - 30, 1),))
    d = decide(1, loads(0), el, trig, h, T0)
    assert d.desired == 1 and "last replica kept" in d.reason
    d = decide(1, loads(0), el, trig, d.history, T0 + 31)
    assert d.desired == 0 and "scale to zero" in d.reason
    # A request seen by the gateway restarts the idle period.
    d = decide(1, loads(0), el, trig, h, T0 + 31, last_request_at=T0 + 20)
    assert d.desired == 1


def test_idle_period_defaults_to_the_scale_down_window() -> None:
    el = elastic(0, 3)
    d = decide(2, loads(0, 0), el, WAITING, History(), T0)  # fresh: start counts as activity
    assert d.desired == 2
    d = decide(2, loads(0, 0), el, WAITING, d.history, T0 + 200)
    assert d.desired == 2
    d = decide(2, loads(0, 0), el, WAITING, d.history, T0 + 301)
    assert d.desired == 0


@pytest.mark.parametrize("window", [40, 100])
def test_idle_period_default_is_the_window_where_the_load_already_says_zero(window: int) -> None:
    """No load for longer than the scale-down window (stabilization lets 0 through), but a
    request came within it: the default idle period (that window, not a constant) decides."""
    trig = trigger(
        pods("vllm:num_requests_waiting", 4),
        behavior={"scaleDown": {"stabilizationWindowSeconds": window}},
    )
    el = elastic(0, 3)
    h = History(last_request_at=T0 - window + 5, recommendations=((T0 - 2 * window, 0),))
    d = decide(1, loads(0), el, trig, h, T0)
    assert d.history.recommendations[-1] == (T0, 0)  # the load alone says zero
    assert d.desired == 1 and f"idle period {window} s" in d.reason, d.reason
    d = decide(1, loads(0), el, trig, d.history, T0 + 6)
    assert d.desired == 0 and f"no request for {window} s" in d.reason, d.reason


def test_held_requests_prevent_scale_down() -> None:
    trig = trigger(pods("vllm:num_requests_waiting", 4), behavior=NO_WINDOW)
    assert run(3, loads(0, 0, 0), trig, demand=5).desired == 3


# --- properties --------------------------------------------------------------------------------

METRIC_NAMES = st.sampled_from(
    ["vllm:num_requests_waiting", "vllm:num_requests_running", INFLIGHT_METRIC]
)


@settings(max_examples=300, deadline=None)
@given(
    lo=st.integers(0, 5),
    span=st.integers(1, 10),
    current=st.integers(0, 20),
    values=st.lists(st.floats(0, 500, allow_nan=False), max_size=20),
    target=st.integers(1, 50),
    name=METRIC_NAMES,
    demand=st.integers(0, 3),
    past=st.lists(st.tuples(st.floats(0, 400), st.integers(0, 20)), max_size=6),
)
def test_desired_always_within_bounds(
    lo: int,
    span: int,
    current: int,
    values: list[float],
    target: int,
    name: str,
    demand: int,
    past: list[tuple[float, int]],
) -> None:
    el = elastic(lo, lo + span)
    key = SIGNAL_ALIASES[name]
    signals = loads(*values[:current], key=key) + [ReplicaSignals(ready=False)] * max(
        0, current - len(values)
    )
    h = History(recommendations=tuple((T0 - a, r) for a, r in past), last_request_at=T0 - 10)
    d = decide(current, signals, el, trigger(pods(name, target)), h, T0, demand=demand)
    assert lo <= d.desired <= lo + span or (current == 0 and d.desired == 0 and lo == 0)
    if lo == 0 and current > 0:
        assert d.desired >= 1  # a request 10 s ago keeps the last replica
    if demand and current == 0:
        assert d.desired >= 1


@settings(max_examples=200, deadline=None)
@given(
    current=st.integers(1, 30),
    per_replica=st.floats(0, 1000, allow_nan=False),
)
def test_default_scale_up_never_exceeds_double_or_four_more(
    current: int, per_replica: float
) -> None:
    d = run(current, loads(*[per_replica] * current), el=elastic(1, 1000))
    assert d.desired <= max(2 * current, current + 4)
    assert d.desired >= 1


@settings(max_examples=200, deadline=None)
@given(current=st.integers(1, 30), ratio=st.floats(0.905, 1.095))
def test_no_change_within_tolerance(current: int, ratio: float) -> None:
    d = run(current, loads(*[4 * ratio] * current), el=elastic(1, 1000))
    assert d.desired == current


@settings(max_examples=200, deadline=None)
@given(
    current=st.integers(1, 20),
    a=st.floats(0, 200, allow_nan=False),
    b=st.floats(0, 200, allow_nan=False),
)
def test_more_load_never_means_fewer_replicas(current: int, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    trig = trigger(pods("vllm:num_requests_waiting", 4), behavior=NO_WINDOW)
    d_lo = run(current, loads(*[lo] * current), trig, el=elastic(1, 1000))
    d_hi = run(current, loads(*[hi] * current), trig, el=elastic(1, 1000))
    assert d_hi.desired >= d_lo.desired


@pytest.mark.parametrize("bad", [{"type": "Utilization", "averageUtilization": 50}])
def test_pods_metric_with_a_utilization_target_is_skipped(bad: dict[str, Any]) -> None:
    metric = {
        "type": "Pods",
        "pods": {"metric": {"name": "vllm:num_requests_waiting"}, "target": bad},
    }
    d = run(2, loads(50, 50), trigger(metric))
    assert d.desired == 2 and "Value or AverageValue" in d.reason
