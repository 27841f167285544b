"""The autoscaling decision, pure and shared by both substrates.

``decide`` turns (current replicas, per-replica signals averaged over a window, elasticConfig,
scale trigger, the decision history, now) into desired replicas and a sentence saying why. It
follows the HorizontalPodAutoscaler (autoscaling/v2) so a trigger means the same thing locally,
in our in-cluster autoscaler and in a real HPA:

- per metric ``desired = ceil(current_ready x currentMetric / target)`` (Pods and Resource:
  average per replica; Object/External ``Value``: the model-wide total against the target;
  ``AverageValue``: ``ceil(total / target)``), the maximum over metrics;
- no change while the ratio is within the tolerance (0.1; ``behavior.*.tolerance`` overrides);
- replicas still starting count as idle when scaling up, replicas without data count as on
  target when scaling down (so a cold start does not cascade into maxReplicas);
- a metric without data blocks scale-down, as in the HPA;
- stabilization: the result is the lowest recommendation of the scale-up window (0 s default)
  and the highest of the scale-down window (300 s default);
- rate limits from ``behavior`` policies (Pods/Percent per periodSeconds, selectPolicy
  Max/Min/Disabled; default up: max(+4 pods, +100 %) per 15 s, down: 100 % per 15 s);
- clamped to [minReplicas, maxReplicas].

llmplane extensions, beyond the HPA: ``minReplicas: 0``. With no replica the first request
waiting at the gateway's activator (``demand``) asks for ``max(1, minReplicas)`` at once; the
last replica stops only after ``scaleToZeroAfterSeconds`` (default: the scale-down
stabilization window) without any request. With no trigger anywhere, ``DEFAULT_TRIGGER``
applies (the gateway's in-flight requests per replica), so ``elasticConfig: {minReplicas: 1,
maxReplicas: 3}`` scales as llmaz's blog promises.

Metric names users know map onto the signals the gateway has (``SIGNAL_ALIASES``): engine
queue (``vllm:num_requests_waiting`` and the llama.cpp/SGLang/TGI equivalents), running
requests, KV-cache usage (a 0..1 fraction), time to first token, the gateway's own
per-endpoint in-flight count and prompt tokens waiting for their first token, and ``cpu``
(cores) / ``memory`` (bytes) of the replica process for Resource metrics.

Over 500 lines on purpose: one pure decision whose steps (per-metric proposal, tolerance,
stabilization, policies, clamp) are read together, in the order the HPA controller applies them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from llmplane.api.core import (
    HorizontalPodAutoscalerBehavior,
    HPAScalingPolicy,
    HPAScalingRules,
    MetricIdentifier,
    MetricSpec,
    MetricTarget,
    PodsMetricSource,
)
from llmplane.api.inference import (
    BackendRuntime,
    ElasticConfig,
    HPATrigger,
    Playground,
    ScaleTrigger,
)
from llmplane.api.llmaz import OpenModel
from llmplane.api.units import parse_quantity
from llmplane.controlplane.planning import Inputs, PlanningError, chosen_config_name

DEFAULT_TOLERANCE = 0.1
DEFAULT_SCALE_UP_WINDOW = 0
DEFAULT_SCALE_DOWN_WINDOW = 300
UNBOUNDED = 99999  # maxReplicas when elasticConfig leaves it unset (llmaz's HPA uses the same)

INFLIGHT_METRIC = "llmplane_gateway_endpoint_inflight"
PREFILL_TOKENS_METRIC = "llmplane_gateway_endpoint_prefill_tokens"
DEFAULT_INFLIGHT_TARGET = 8

# Signal keys the gateway (or the process supervisor) provides per replica.
WAITING, RUNNING, KV_USAGE, INFLIGHT, PREFILL_TOKENS, TTFT, CPU, MEMORY = (
    "waiting",
    "running",
    "kv_usage",
    "inflight",
    "prefill_tokens",
    "ttft",
    "cpu",
    "memory",
)

SIGNAL_ALIASES: dict[str, str] = {
    # engine queue
    "vllm:num_requests_waiting": WAITING,
    "sglang:num_queue_reqs": WAITING,
    "llamacpp:requests_deferred": WAITING,
    "tgi_queue_size": WAITING,
    "llmplane_gateway_endpoint_waiting": WAITING,
    # requests being decoded
    "vllm:num_requests_running": RUNNING,
    "sglang:num_running_reqs": RUNNING,
    "llamacpp:requests_processing": RUNNING,
    "tgi_batch_current_size": RUNNING,
    # KV-cache usage, 0..1
    "vllm:kv_cache_usage_perc": KV_USAGE,
    "vllm:gpu_cache_usage_perc": KV_USAGE,
    "sglang:token_usage": KV_USAGE,
    "llamacpp:kv_cache_usage_ratio": KV_USAGE,
    "llmplane_gateway_endpoint_kv_usage": KV_USAGE,
    # time to first token, seconds: the engine's mean over the last scrape interval (held
    # while it is busy, 0 when idle)
    "vllm:time_to_first_token_seconds": TTFT,
    "sglang:time_to_first_token_seconds": TTFT,
    "llmplane_gateway_endpoint_ttft_seconds": TTFT,
    # the gateway's own count of requests it sent and has not finished
    INFLIGHT_METRIC: INFLIGHT,
    "llmplane:inflight_requests": INFLIGHT,
    # the gateway's own count of prompt tokens sent that have not had their first token
    PREFILL_TOKENS_METRIC: PREFILL_TOKENS,
}
RESOURCE_SIGNALS = {"cpu": CPU, "memory": MEMORY}


def _default_trigger() -> ScaleTrigger:
    target = MetricTarget(type="AverageValue", average_value=DEFAULT_INFLIGHT_TARGET)
    metric = MetricSpec(
        type="Pods",
        pods=PodsMetricSource(metric=MetricIdentifier(name=INFLIGHT_METRIC), target=target),
    )
    return ScaleTrigger(hpa=HPATrigger(metrics=[metric]))


DEFAULT_TRIGGER: ScaleTrigger = _default_trigger()
"""Used when neither the Playground's elasticConfig nor its BackendRuntime config names one:
8 requests in flight per replica on average (engine-agnostic: every backend has it)."""


def _pods_trigger(*targets: tuple[str, float]) -> ScaleTrigger:
    metrics = [
        MetricSpec(
            type="Pods",
            pods=PodsMetricSource(
                metric=MetricIdentifier(name=name),
                target=MetricTarget(type="AverageValue", average_value=value),
            ),
        )
        for name, value in targets
    ]
    return ScaleTrigger(hpa=HPATrigger(metrics=metrics))


# Disaggregated roles load differently, so each has its own default trigger (a role's
# elasticConfig.scaleTrigger replaces it). Prefill replicas answer one token per request: their
# load is the prompt work waiting for its first token, counted in prompts queued in the engine
# and in prompt tokens the gateway sent and has not had answered (long prompts an engine runs
# side by side never queue); in-flight counts at the gateway say little (a decode request
# holds its slot for the whole answer). 8192 tokens: a few of vLLM's prefill steps on a GPU,
# under a second of TTFT. Decode replicas' load is the sequences being generated and the KV
# cache they hold.
PREFILL_TOKENS_TARGET = 8192
ROLE_TRIGGERS: dict[str, ScaleTrigger] = {
    "prefill": _pods_trigger(
        ("vllm:num_requests_waiting", 2), (PREFILL_TOKENS_METRIC, PREFILL_TOKENS_TARGET)
    ),
    "decode": _pods_trigger(("vllm:num_requests_running", 16), ("vllm:kv_cache_usage_perc", 0.8)),
}


def role_trigger(role: str, elastic: ElasticConfig | None) -> ScaleTrigger | None:
    """The trigger in force for one role of a disaggregated Playground: the role's own
    ``scaleTrigger``, else the role's default (``ROLE_TRIGGERS``); None without elasticConfig."""
    if elastic is None:
        return None
    default = ROLE_TRIGGERS[role]
    own = elastic.scale_trigger
    if own is not None and not own.hpa.metrics:  # behavior only: the role's own metrics
        return ScaleTrigger(hpa=own.hpa.model_copy(update={"metrics": default.hpa.metrics}))
    return effective_trigger(elastic, default)


# --- inputs and outputs ------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaSignals:
    """One replica's signals, averaged over the sampling window by the caller.

    ``values`` is keyed by signal (``WAITING`` ... ``MEMORY``); a missing key means no data.
    ``requests`` holds the replica's resource requests (``cpu`` cores, ``memory`` bytes) for
    Utilization targets. ``ready`` False: still starting (or restarting).
    """

    ready: bool = True
    values: Mapping[str, float] = field(default_factory=dict)
    requests: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class History:
    """What the decision remembers between calls (returned updated by ``decide``)."""

    recommendations: tuple[tuple[float, int], ...] = ()  # (time, unstabilized recommendation)
    scale_events: tuple[tuple[float, int], ...] = ()  # (time, replica change, signed)
    last_request_at: float | None = None  # last time the model had any request


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str
    history: History

    def changed(self, current: int) -> bool:
        return self.desired != current


@dataclass(frozen=True)
class _Rules:
    window: int
    select: str
    policies: tuple[HPAScalingPolicy, ...]
    tolerance: float


def recommended_trigger(
    pg: Playground, backend: BackendRuntime | None, models: Mapping[str, OpenModel]
) -> ScaleTrigger | None:
    """The scaleTrigger of the BackendRuntime's recommended config this Playground runs with."""
    if backend is None:
        return None
    try:
        name = chosen_config_name(Inputs(pg, dict(models), backend))
    except PlanningError:
        return None
    for config in backend.spec.recommended_configs or []:
        if config.name == name:
            return config.scale_trigger
    return None


def effective_trigger(
    elastic: ElasticConfig | None, recommended: ScaleTrigger | None
) -> ScaleTrigger | None:
    """The trigger in force: the Playground's, else the recommended config's, else the default.
    A trigger with ``behavior`` but no metrics gets the default's metric. None without
    elasticConfig (a fixed number of replicas)."""
    if elastic is None:
        return None
    trigger = elastic.scale_trigger or recommended or DEFAULT_TRIGGER
    if not trigger.hpa.metrics:  # like an HPA without metrics (CPU 80 %): a default metric
        hpa = trigger.hpa.model_copy(update={"metrics": DEFAULT_TRIGGER.hpa.metrics})
        trigger = ScaleTrigger(hpa=hpa)
    return trigger


def trigger_in_force(
    pg: Playground, backend: BackendRuntime | None, models: Mapping[str, OpenModel]
) -> ScaleTrigger | None:
    """``effective_trigger`` of a Playground: its recommended config is looked up only when
    the Playground names no trigger of its own (the lookup plans the workload)."""
    elastic = pg.spec.elastic_config
    if elastic is None or elastic.scale_trigger is not None:
        return effective_trigger(elastic, None)
    return effective_trigger(elastic, recommended_trigger(pg, backend, models))


def bounds(elastic: ElasticConfig) -> tuple[int, int]:
    return elastic.min_replicas, (
        elastic.max_replicas if elastic.max_replicas is not None else UNBOUNDED
    )


def _rules(rules: HPAScalingRules | None, up: bool) -> _Rules:
    rules = rules or HPAScalingRules()
    window = rules.stabilization_window_seconds
    if window is None:
        window = DEFAULT_SCALE_UP_WINDOW if up else DEFAULT_SCALE_DOWN_WINDOW
    policies = rules.policies
    if not policies:
        policies = (
            [
                HPAScalingPolicy(type="Pods", value=4, period_seconds=15),
                HPAScalingPolicy(type="Percent", value=100, period_seconds=15),
            ]
            if up
            else [HPAScalingPolicy(type="Percent", value=100, period_seconds=15)]
        )
    tolerance = (
        float(parse_quantity(rules.tolerance)) if rules.tolerance is not None else DEFAULT_TOLERANCE
    )
    return _Rules(window, rules.select_policy or "Max", tuple(policies), tolerance)


def scaling_rules(behavior: HorizontalPodAutoscalerBehavior | None) -> tuple[_Rules, _Rules]:
    """(scale-up rules, scale-down rules) with the HPA's defaults filled in field by field."""
    behavior = behavior or HorizontalPodAutoscalerBehavior()
    return _rules(behavior.scale_up, True), _rules(behavior.scale_down, False)


# --- one metric -> a replica count ---------------------------------------------------------------


@dataclass(frozen=True)
class _Proposal:
    replicas: int | None  # None: no data (blocks scale-down)
    text: str


def _target_number(target: MetricTarget) -> tuple[str, float] | None:
    if target.type == "Utilization":
        return (
            ("Utilization", float(target.average_utilization or 0))
            if (target.average_utilization)
            else None
        )
    raw = target.value if target.type == "Value" else target.average_value
    if raw is None:
        return None
    return target.type, float(parse_quantity(raw))


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _per_replica(
    signals: Sequence[ReplicaSignals],
    key: str,
    target: float,
    tolerance: tuple[float, float],
    label: str,
    utilization_of: str | None = None,
) -> _Proposal:
    """The HPA's per-pod rule (Pods metrics, Resource metrics) with its unready/missing rules."""
    current = len(signals)

    def usage(s: ReplicaSignals) -> float:
        value = s.values[key]
        if utilization_of is None:
            return value
        return 100.0 * value / s.requests[utilization_of]

    have = [s for s in signals if s.ready and key in s.values]
    if utilization_of is not None and any(s.requests.get(utilization_of, 0) <= 0 for s in have):
        return _Proposal(None, f"{label}: Utilization needs resources.requests.{utilization_of}")
    if not have:
        return _Proposal(None, f"{label}: no data yet")
    unready = sum(1 for s in signals if not s.ready)
    missing = sum(1 for s in signals if s.ready and key not in s.values)
    total = sum(usage(s) for s in have)
    ratio = total / len(have) / target
    avg_text = f"{label} {_fmt(total / len(have))} per replica (target {_fmt(target)})"
    up_tol, down_tol = tolerance
    if missing == 0 and (unready == 0 or ratio <= 1.0):
        # Only ready replicas with data (or unready ones, which matter only on scale-up).
        if _within(ratio, up_tol, down_tol):
            return _Proposal(current, f"{avg_text}: within tolerance")
        return _Proposal(math.ceil(ratio * len(have)), avg_text)
    # Fill in the unknowns the HPA's way: on scale-up starting replicas count as idle, on
    # scale-down replicas without data count as exactly on target.
    counted = len(have)
    if ratio < 1.0:
        total += target * missing
        counted += missing
    else:
        counted += unready + missing
    new_ratio = total / counted / target
    if _within(new_ratio, up_tol, down_tol) or (ratio < 1.0) != (new_ratio < 1.0):
        return _Proposal(current, f"{avg_text}: held while replicas start or report")
    proposed = math.ceil(new_ratio * counted)
    if (new_ratio < 1.0 and proposed > current) or (new_ratio > 1.0 and proposed < current):
        return _Proposal(current, f"{avg_text}: held while replicas start or report")
    return _Proposal(proposed, avg_text)


def _within(ratio: float, up_tol: float, down_tol: float) -> bool:
    # 1e-9: 4.4 / 4 is 1.1000000000000001 in floating point; a user writing a 10 % margin means it.
    return (ratio - 1.0) <= up_tol + 1e-9 if ratio >= 1.0 else (1.0 - ratio) <= down_tol + 1e-9


def _total(
    signals: Sequence[ReplicaSignals],
    key: str,
    kind: str,
    target: float,
    tolerance: tuple[float, float],
    label: str,
) -> _Proposal:
    """Object/External: one model-wide value (the sum over ready replicas) against the target."""
    have = [s for s in signals if s.ready and key in s.values]
    ready = sum(1 for s in signals if s.ready)
    current = len(signals)
    if not have:
        return _Proposal(None, f"{label}: no data yet")
    total = sum(s.values[key] for s in have)
    if kind == "Value":
        ratio = total / target
        text = f"{label} {_fmt(total)} in total (target {_fmt(target)})"
        if _within(ratio, *tolerance):
            return _Proposal(current, f"{text}: within tolerance")
        return _Proposal(math.ceil(ratio * ready), text)
    ratio = total / (target * current) if current else math.inf
    text = f"{label} {_fmt(total)} in total (target {_fmt(target)} per replica)"
    if _within(ratio, *tolerance):
        return _Proposal(current, f"{text}: within tolerance")
    return _Proposal(math.ceil(total / target), text)


def _propose(
    metric: MetricSpec, signals: Sequence[ReplicaSignals], tolerance: tuple[float, float]
) -> _Proposal | str:
    """A proposal, or a string saying why the metric cannot be read here (skipped)."""
    if metric.type in ("Resource", "ContainerResource"):
        source = metric.resource or metric.container_resource
        assert source is not None  # validation guarantees the member of the type
        key = RESOURCE_SIGNALS.get(source.name)
        if key is None:
            return f"resource {source.name!r} is not measured (cpu and memory are)"
        target = _target_number(source.target)
        if target is None:
            return f"resource {source.name}: target has no value"
        kind, number = target
        if kind == "Value":
            return f"resource {source.name}: a Value target is not defined for Resource metrics"
        if number <= 0:
            return f"resource {source.name}: target must be above 0"
        return _per_replica(
            signals,
            key,
            number,
            tolerance,
            source.name,
            utilization_of=source.name if kind == "Utilization" else None,
        )
    source = metric.pods or metric.object or metric.external
    assert source is not None
    name = source.metric.name
    key = SIGNAL_ALIASES.get(name)
    if key is None:
        return f"metric {name!r} is not one the gateway measures"
    target = _target_number(source.target)
    if target is None or target[0] == "Utilization":
        return f"metric {name}: {metric.type} metrics need a Value or AverageValue target"
    kind, number = target
    if number <= 0:
        return f"metric {name}: target must be above 0"
    if metric.type == "Pods":
        if kind != "AverageValue":
            return f"metric {name}: Pods metrics need an AverageValue target"
        return _per_replica(signals, key, number, tolerance, name)
    return _total(signals, key, kind, number, tolerance, name)


# --- stabilization and rate limits ---------------------------------------------------------------


def _stabilize(
    recommendation: int, current: int, history: History, now: float, up: _Rules, down: _Rules
) -> int:
    up_cut, down_cut = now - up.window, now - down.window
    up_rec = down_rec = recommendation
    for at, rec in history.recommendations:
        if at > up_cut:
            up_rec = min(up_rec, rec)
        if at > down_cut:
            down_rec = max(down_rec, rec)
    result = max(current, up_rec)
    return min(result, down_rec)


def _period_start(current: int, history: History, now: float, period: int) -> int:
    changed = sum(delta for at, delta in history.scale_events if at > now - period)
    return current - changed


def scale_up_limit(current: int, history: History, now: float, rules: _Rules) -> int:
    if rules.select == "Disabled":
        return current
    limits = []
    for p in rules.policies:
        start = _period_start(current, history, now, p.period_seconds)
        if p.type == "Pods":
            limits.append(start + p.value)
        else:
            limits.append(math.ceil(start * (1 + p.value / 100)))
    limit = min(limits) if rules.select == "Min" else max(limits)
    return max(limit, current)


def scale_down_limit(current: int, history: History, now: float, rules: _Rules) -> int:
    if rules.select == "Disabled":
        return current
    limits = []
    for p in rules.policies:
        start = _period_start(current, history, now, p.period_seconds)
        if p.type == "Pods":
            limits.append(start - p.value)
        else:
            limits.append(math.floor(start * (1 - p.value / 100)))
    limit = max(limits) if rules.select == "Min" else min(limits)
    return min(limit, current)


def _prune(history: History, now: float, up: _Rules, down: _Rules) -> History:
    keep_recs = max(up.window, down.window)
    keep_events = max(p.period_seconds for p in (*up.policies, *down.policies))
    return replace(
        history,
        recommendations=tuple(r for r in history.recommendations if r[0] > now - keep_recs),
        scale_events=tuple(e for e in history.scale_events if e[0] > now - keep_events),
    )


# --- the decision ------------------------------------------------------------------------------


def decide(
    current: int,
    signals: Sequence[ReplicaSignals],
    elastic: ElasticConfig,
    trigger: ScaleTrigger,
    history: History,
    now: float,
    *,
    demand: int = 0,
    last_request_at: float | None = None,
) -> Decision:
    """Desired replicas for one Playground/Service. ``current`` is the declared replica count,
    ``signals`` one entry per replica that exists (starting ones with ``ready=False``),
    ``demand`` the requests held at the gateway for want of a ready replica, and
    ``last_request_at`` the last time any request for the model arrived."""
    minimum, maximum = bounds(elastic)
    up, down = scaling_rules(trigger.hpa.behavior)
    if history == History():
        # First sight: the current count counts as a recommendation and the start as activity,
        # so a restart neither scales down at once nor stops an idle model's last replica.
        history = History(recommendations=((now, current),), last_request_at=now)
    if last_request_at is not None and (
        history.last_request_at is None or last_request_at > history.last_request_at
    ):
        history = replace(history, last_request_at=last_request_at)
    if demand > 0:
        history = replace(history, last_request_at=now)
    history = _prune(history, now, up, down)

    def done(desired: int, reason: str, recommendation: int | None = None) -> Decision:
        h = history
        if recommendation is not None:
            h = replace(h, recommendations=(*h.recommendations, (now, recommendation)))
        if desired != current:
            h = replace(h, scale_events=(*h.scale_events, (now, desired - current)))
        return Decision(desired, reason, h)

    if current > maximum:
        return done(maximum, f"above maxReplicas {maximum}")
    if current < minimum:
        return done(minimum, f"below minReplicas {minimum}")
    if current == 0:
        if demand > 0:
            want = min(max(1, minimum), maximum)
            return done(want, f"scale from zero: {demand} request(s) waiting for a replica")
        return done(0, "no replica and no request")

    tolerance = (up.tolerance, down.tolerance)
    proposals: list[tuple[int, str]] = []
    skipped: list[str] = []
    invalid: list[str] = []
    for metric in trigger.hpa.metrics or []:
        proposal = _propose(metric, signals, tolerance)
        if isinstance(proposal, str):
            skipped.append(proposal)
        elif proposal.replicas is None:
            invalid.append(proposal.text)
        else:
            proposals.append((proposal.replicas, proposal.text))
    if not proposals:
        why = "; ".join(invalid + skipped) or "the trigger names no metric"
        return done(current, f"no usable metric ({why})")
    recommendation, text = max(proposals, key=lambda p: p[0])
    if invalid and recommendation < current:
        return done(
            current,
            f"scale-down blocked: {'; '.join(invalid)}",
            recommendation=current,
        )
    if demand > 0 and recommendation < current:
        recommendation = current  # requests are being held: never shrink now
    stabilized = _stabilize(recommendation, current, history, now, up, down)
    desired, why = stabilized, text
    if stabilized != recommendation:
        window = down.window if recommendation < current else up.window
        why = f"{text}; recommends {recommendation}, held at {stabilized} by the {window} s stabilization window"
    if desired > current:
        limit = min(scale_up_limit(current, history, now, up), maximum)
        if desired > limit:
            desired = limit
            why += (
                f"; limited to {limit} (maxReplicas)"
                if limit == maximum
                else f"; limited to {limit} by the scale-up policy"
            )
    elif desired < current:
        floor_ = max(scale_down_limit(current, history, now, down), minimum)
        if desired < floor_:
            desired = floor_
            why += (
                f"; limited to {floor_} (minReplicas)"
                if floor_ == minimum
                else f"; limited to {floor_} by the scale-down policy"
            )
    desired = min(max(desired, minimum), maximum)
    if desired == 0:
        idle_for = elastic.scale_to_zero_after_seconds
        if idle_for is None:
            idle_for = down.window
        last = history.last_request_at
        if last is not None and now - last < idle_for:
            desired = 1
            why += f"; last replica kept: a request came {_fmt(now - last)} s ago (idle period {idle_for} s)"
        else:
            why += f"; no request for {idle_for} s: scale to zero"
    return done(desired, why, recommendation=recommendation)
