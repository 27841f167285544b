"""The embedded autoscaler: samples the gateway's signals, runs ``autoscaling.decide`` for every
Playground with ``elasticConfig`` and writes the result to the Playground's ``spec.replicas``
(as an HPA writes the scale subresource). The controller then scales the workload through its
usual paths (new replicas started, removed ones drained before they stop).

Signals come through ``SignalSource`` (the gateway implements it: ``gateway/signals.py``): per
ready replica the values it has now; the autoscaler averages them over ``window`` seconds,
sampled every ``interval`` seconds. Every change is an Event (``SuccessfulRescale``, the
HPA's reason) whose message says why, so ``describe pl`` explains it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmplane.aio import wait_event
from llmplane.api.inference import BackendRuntime, Playground, ScaleTrigger
from llmplane.api.llmaz import OpenModel
from llmplane.api.units import parse_quantity
from llmplane.controlplane import autoscaling
from llmplane.controlplane.disaggregation import ROLES, role_service_name, role_spec
from llmplane.controlplane.events import record_event
from llmplane.quiet import QuietRetries
from llmplane.store.base import Conflict, Store, StoreUnavailable

log = logging.getLogger("llmplane.autoscaler")

RESCALE = "SuccessfulRescale"


class ReplicaSource(Protocol):
    """More per-replica signals (the local runtime's process CPU and memory)."""

    def replica_signals(self, workload: str) -> Mapping[str, Mapping[str, float]]: ...


class SignalSource(Protocol):
    """What the autoscaler reads of the data plane, per workload (``namespace/name``). A
    source may also have ``async refresh()``, awaited before each pass (signals it gathers
    from other processes, e.g. ``llmplane up --workers N``)."""

    def replica_signals(self, workload: str) -> Mapping[str, Mapping[str, float]]:
        """Ready replicas' signals now, by address (keys: ``autoscaling.WAITING`` ...)."""
        ...

    def requests_seen(self, workload: str) -> float:
        """A count that grows with every request sent to the workload (activity detection)."""
        ...

    def held(self, workload: str) -> int:
        """Requests held for want of a ready replica (the activator's queue)."""
        ...


@dataclass
class AutoscalerConfig:
    interval: float = 1.0  # seconds between samples (and decisions)
    window: float = 15.0  # seconds of samples averaged per replica


@dataclass
class _Tracked:
    samples: deque[tuple[float, Mapping[str, Mapping[str, float]]]] = field(default_factory=deque)
    history: autoscaling.History = field(default_factory=autoscaling.History)
    seen: float = -1.0
    last_request_at: float | None = None
    reason: str = ""


def average(
    samples: deque[tuple[float, Mapping[str, Mapping[str, float]]]], addresses: set[str]
) -> dict[str, dict[str, float]]:
    """Per address, each signal's mean over the samples that have it."""
    sums: dict[str, dict[str, list[float]]] = {}
    for _, sample in samples:
        for address, values in sample.items():
            if address not in addresses:
                continue
            slot = sums.setdefault(address, {})
            for key, value in values.items():
                acc = slot.setdefault(key, [0.0, 0.0])
                acc[0] += value
                acc[1] += 1
    return {a: {k: s / n for k, (s, n) in v.items()} for a, v in sums.items()}


class Deciders:
    """The per-workload memory of autoscaling (samples, decision history, activity) and one
    decision from it: the part both substrates share. The embedded ``Autoscaler`` feeds it from
    the store and the in-process gateway; the operator (``operator/autoscaler.py``) from the
    Kubernetes API and the in-cluster gateways' signals."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._tracked: dict[str, _Tracked] = {}

    def forget(self, live: set[str]) -> None:
        """Drop the memory of workloads no longer autoscaled."""
        for key in set(self._tracked) - live:
            del self._tracked[key]

    def decide(
        self,
        pg: Playground,
        key: str,
        trigger: ScaleTrigger,
        sample: Mapping[str, Mapping[str, float]],
        seen: float,
        held: int,
        requests: Mapping[str, float],
        now: float,
        role: str | None = None,
    ) -> autoscaling.Decision:
        """Record this pass's ``sample`` (ready replicas' signals by address), ``seen`` (the
        request counter) and ``held`` (activator queue), then decide for ``pg`` (for one
        ``role`` of a disaggregated Playground: that role's replicas and bounds)."""
        elastic, current = role_scale(pg, role)
        assert elastic is not None
        tracked = self._tracked.setdefault(key, _Tracked())
        tracked.samples.append((now, sample))
        while tracked.samples and tracked.samples[0][0] < now - self.window:
            tracked.samples.popleft()
        busy = any(v.get(autoscaling.INFLIGHT, 0) > 0 for v in sample.values())
        if busy or (tracked.seen >= 0 and seen > tracked.seen):  # a replica leaving lowers it
            tracked.last_request_at = now
        tracked.seen = seen

        averaged = average(tracked.samples, set(sample))
        signals = [
            autoscaling.ReplicaSignals(values=v, requests=requests) for v in averaged.values()
        ]
        signals += [autoscaling.ReplicaSignals(ready=False)] * max(0, current - len(signals))
        decision = autoscaling.decide(
            current,
            signals[: max(current, 0)],
            elastic,
            trigger,
            tracked.history,
            now,
            demand=held,
            last_request_at=tracked.last_request_at,
        )
        tracked.history = decision.history
        tracked.reason = decision.reason
        return decision

    def reason(self, key: str) -> str:
        tracked = self._tracked.get(key)
        return tracked.reason if tracked else ""


def role_scale(pg: Playground, role: str | None) -> tuple[Any, int]:
    """(elasticConfig, declared replicas) of a Playground, or of one of its roles."""
    dis = pg.spec.disaggregation
    if role is None or dis is None:
        return pg.spec.elastic_config, pg.spec.replicas
    spec = role_spec(dis, role)
    return spec.elastic_config, spec.replicas


def scaled_workloads(pg: Playground) -> list[tuple[str | None, str]]:
    """(role, Service name) of every workload of ``pg`` with elasticConfig: the Playground's
    own, or each role of a disaggregated one that has its own bounds."""
    dis = pg.spec.disaggregation
    if dis is None:
        return [(None, pg.name)] if pg.spec.elastic_config is not None else []
    return [
        (role, role_service_name(pg.name, role))
        for role in ROLES
        if role_spec(dis, role).elastic_config is not None
    ]


def pair_key(pg: Playground) -> str:
    """Where the activator counts requests held for a disaggregated Playground (it holds them
    by Playground until both roles have a replica): the demand that wakes both roles."""
    return f"{pg.namespace}/{pg.name}"


def replica_requests(service: Mapping[str, Any] | None) -> dict[str, float]:
    """A replica's resource requests (cpu cores, memory bytes) from its inference Service."""
    svc = service or {}
    template = ((svc.get("spec") or {}).get("workloadTemplate") or {}).get("workerTemplate")
    containers = ((template or {}).get("spec") or {}).get("containers") or []
    wanted = ((containers[0].get("resources") or {}).get("requests") or {}) if containers else {}
    out = {}
    for name in ("cpu", "memory"):
        if name in wanted:
            with contextlib.suppress(ValueError):
                out[name] = float(parse_quantity(wanted[name]))
    return out


def rescale_message(desired: int, reason: str) -> str:
    """The ``SuccessfulRescale`` Event's message (the HPA's wording)."""
    return f"New size: {desired}; reason: {reason}"


class Autoscaler:
    """Decides replicas for every elastic Playground of the store, every ``config.interval``."""

    def __init__(
        self,
        store: Store,
        runtime: Any,
        signals: SignalSource,
        config: AutoscalerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        extra: Sequence[ReplicaSource] = (),
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.signals = signals
        self.extra = list(extra)
        self.config = config or AutoscalerConfig()
        self.clock = clock
        self.deciders = Deciders(self.config.window)
        self._kicked = asyncio.Event()
        self._store_trouble = QuietRetries(log, "autoscaling (writing replicas to the store)")

    def kick(self) -> None:
        """Decide now (a request is waiting for a model without a replica)."""
        self._kicked.set()

    async def run(self) -> None:
        refresh = getattr(self.signals, "refresh", None)  # signals kept in other processes
        while True:
            try:
                if refresh is not None:
                    await refresh()
                self.step()
            except StoreUnavailable as err:  # disk full, locked: the next pass retries
                self._store_trouble.failed(err)
            except Exception:  # a bug must not stop autoscaling for good
                log.exception("autoscaling pass failed")
            else:
                self._store_trouble.succeeded()
            await wait_event(self._kicked, self.config.interval)
            self._kicked.clear()

    def _objects(self, kind: str, cls: Any) -> list[Any]:
        out = []
        for obj in self.store.list(kind):
            with contextlib.suppress(Exception):  # the controller reports invalid objects
                out.append(cls.model_validate(obj))
        return out

    def step(self) -> None:
        """One pass: sample, decide, write."""
        now = self.clock()
        playgrounds = [p for p in self._objects("Playground", Playground) if scaled_workloads(p)]
        if not playgrounds:
            self.deciders.forget(set())
            return
        models = {m.name: m for m in self._objects("OpenModel", OpenModel)}
        backends = {b.name: b for b in self._objects("BackendRuntime", BackendRuntime)}
        live = set()
        for pg in playgrounds:
            backend = backends.get(pg.spec.backend_runtime_config.backend_name)
            for role, service in scaled_workloads(pg):
                key = f"{pg.namespace}/{service}"
                live.add(key)
                if role is None:
                    trigger = autoscaling.trigger_in_force(pg, backend, models)
                else:
                    trigger = autoscaling.role_trigger(role, role_scale(pg, role)[0])
                self._one(pg, key, trigger, now, role, service)
        self.deciders.forget(live)

    def _one(
        self,
        pg: Playground,
        key: str,
        trigger: ScaleTrigger | None,
        now: float,
        role: str | None = None,
        service: str | None = None,
    ) -> None:
        assert trigger is not None
        sample = {a: dict(v) for a, v in self.signals.replica_signals(key).items()}
        for source in self.extra:
            for address, values in source.replica_signals(key).items():
                if address in sample:  # only replicas the gateway routes to
                    sample[address].update(values)
        current = role_scale(pg, role)[1]
        decision = self.deciders.decide(
            pg,
            key,
            trigger,
            sample,
            self.signals.requests_seen(key),
            self.signals.held(key) + (self.signals.held(pair_key(pg)) if role else 0),
            replica_requests(self.store.get("Service", service or pg.name, pg.namespace)),
            now,
            role,
        )
        desired, reason = decision.desired, decision.reason
        # The embedded runtime's replica ceiling (runtime/capacity.py): a Playground without
        # maxReplicas must not be scaled past what this machine runs for one object.
        ceiling = getattr(self.runtime, "max_replicas", None)
        if ceiling is not None and desired > ceiling:
            desired, reason = ceiling, f"{reason}; limited to {ceiling} (this machine's ceiling)"
        if desired != current:
            self._scale(pg, desired, reason, current, role)

    def _scale(
        self, pg: Playground, desired: int, reason: str, current: int, role: str | None = None
    ) -> None:
        obj = self.store.get("Playground", pg.name, pg.namespace)
        if obj is None:
            return
        spec = obj["spec"]
        if role is not None:  # spec.llmplane.disaggregation.<role>.replicas
            spec = spec["llmplane"]["disaggregation"].setdefault(role, {})
        if spec.get("replicas", 1) != current:
            return  # changed meanwhile: decide again on the next pass
        spec["replicas"] = desired
        obj.pop("status", None)
        try:
            stored = self.store.apply(obj)  # resourceVersion kept: a concurrent edit wins
        except Conflict:
            return
        message = rescale_message(desired, reason)
        what = f"{pg.name} {role}" if role else pg.name
        log.info("Playground %s/%s: %d -> %d (%s)", pg.namespace, what, current, desired, reason)
        if role is not None:
            message = f"{role}: {message}"
        record_event(self.store, stored, RESCALE, message)

    def reason(self, key: str) -> str:
        """The last decision's reason for a workload (for status displays)."""
        return self.deciders.reason(key)
