"""Built-in filters, scorers and pickers. Every scorer returns one score in [0, 1] per endpoint."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from itertools import count

from llmplane.gateway.registry import EndpointState, queue_estimates
from llmplane.gateway.scheduler.framework import SchedulingContext, Scores

_random = random.random
_sample = random.sample


def min_max_inverse(values: Sequence[float]) -> list[float]:
    """1 for the smallest value, 0 for the largest, linear between; all 1 when equal."""
    lo = min(values, default=0.0)
    hi = max(values, default=0.0)
    if hi <= lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]


# --- filters ------------------------------------------------------------------------------------


class ModelServedFilter:
    """Keeps endpoints known to serve the requested model or LoRA adapter (from their
    ``/v1/models``); endpoints whose list is unknown are kept."""

    def __init__(self, name: str = "model-served") -> None:
        self.name = name

    def filter(self, ctx: SchedulingContext, endpoints: list[EndpointState]) -> list[EndpointState]:
        model = ctx.model
        return [e for e in endpoints if e.served_models is None or model in e.served_models]


class LowQueueFilter:
    """Keeps endpoints whose queue estimate is below ``threshold`` (Kthena's least-request
    filter keeps waiting < 10)."""

    def __init__(self, name: str = "low-queue", threshold: float = 10) -> None:
        self.name = name
        self.threshold = threshold

    def filter(self, ctx: SchedulingContext, endpoints: list[EndpointState]) -> list[EndpointState]:
        queues = queue_estimates(endpoints, ctx.staleness, ctx.now)
        return [e for e, q in zip(endpoints, queues, strict=True) if q < self.threshold]


class QueueMarginFilter:
    """Keeps endpoints whose queue estimate is at most ``margin`` requests above the shortest
    among the candidates. Unlike an absolute threshold it does not push a request off the
    replica holding its prefix because every replica queues a little under load (each miss
    recomputes the prefix elsewhere, slows that replica's steps and evicts: a death spiral);
    it gives way when the holder's queue costs more than a recompute (docs/gateway.md
    "Scheduling"). Relative to the best candidate: in a large fleet it runs on the sample
    (``framework.Profile.score``)."""

    relative = True

    def __init__(self, name: str = "queue-margin", margin: float = 64) -> None:
        self.name = name
        self.margin = margin

    def filter(self, ctx: SchedulingContext, endpoints: list[EndpointState]) -> list[EndpointState]:
        queues = queue_estimates(endpoints, ctx.staleness, ctx.now)
        bound = min(queues, default=0.0) + self.margin
        if max(queues, default=0.0) <= bound:
            return endpoints
        return [e for e, q in zip(endpoints, queues, strict=True) if q <= bound]


# --- scorers ------------------------------------------------------------------------------------


class QueueScorer:
    """(max - q) / (max - min) over the candidates' queue estimates (waiting requests plus those
    sent since the last scrape beyond the room the engine had; in-flight counts when metrics
    are missing or stale). Endpoints with room tie at 0: the least-request scorer spreads a
    burst over them (ranking by the room left favoured whichever replica had been seen
    holding more, an accident of history: docs/benchmarks.md, "Routing quality")."""

    def __init__(self, name: str = "queue") -> None:
        self.name = name

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        return min_max_inverse(queue_estimates(endpoints, ctx.staleness, ctx.now))


class KVCacheScorer:
    """1 - KV-cache utilisation; 0.5 (neutral) for endpoints without fresh KV metrics."""

    def __init__(self, name: str = "kv-cache-utilization") -> None:
        self.name = name

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        oldest = ctx.now - ctx.staleness  # EndpointState.metrics_fresh, inlined
        return [
            (1.0 if (u := e.kv_usage) <= 0.0 else 0.0 if u >= 1.0 else 1.0 - u)
            if e.has_kv and e.has_load_metrics and e.scraped_at >= oldest and e.scraped_at
            else 0.5
            for e in endpoints
        ]


class LeastRequestScorer:
    """Fewest requests in flight from this gateway (counted when a request is sent, so a burst
    between two scrapes spreads out instead of herding onto one replica)."""

    def __init__(self, name: str = "least-request") -> None:
        self.name = name

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        return min_max_inverse([float(e.inflight) for e in endpoints])


class LoraAffinityScorer:
    """1.0 if the adapter is active on the endpoint, 0.8 if it has a free adapter slot, 0.6 if
    the adapter is waiting there, else 0 (from ``vllm:lora_requests_info``)."""

    def __init__(self, name: str = "lora-affinity") -> None:
        self.name = name

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        model = ctx.model
        out = []
        for e in endpoints:
            if model in e.lora_running:
                out.append(1.0)
            elif e.max_lora and len(e.lora_running) < e.max_lora:
                out.append(0.8)
            elif model in e.lora_waiting:
                out.append(0.6)
            else:
                out.append(0.0)
        return out

    def favoured(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState], k: int
    ) -> list[EndpointState]:
        """The endpoints running or queueing the adapter."""
        if not ctx.lora:
            return []
        model = ctx.model
        return [e for e in endpoints if model in e.lora_running or model in e.lora_waiting][:k]


class SessionAffinityScorer:
    """1 for the endpoint that served the request's session (header ``x-session-id`` by
    default) before, 0 for the others."""

    def __init__(
        self, name: str = "session-affinity", header: str = "x-session-id", capacity: int = 100_000
    ) -> None:
        self.name = name
        self.header = header
        self.capacity = capacity
        self.sessions: OrderedDict[str, str] = OrderedDict()

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        target = self._target(ctx)
        if target is None:
            return [0.0] * len(endpoints)
        return [1.0 if e.key == target else 0.0 for e in endpoints]

    def favoured(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState], k: int
    ) -> list[EndpointState]:
        target = self._target(ctx)
        return [] if target is None else [e for e in endpoints if e.key == target]

    def _target(self, ctx: SchedulingContext) -> str | None:
        """The endpoint that served the request's session before, if any."""
        session = ctx.headers.get(self.header)
        return self.sessions.get(session) if session else None

    def on_pick(self, ctx: SchedulingContext, endpoint: EndpointState) -> None:
        session = ctx.headers.get(self.header)
        if session:
            self.sessions[session] = endpoint.key
            self.sessions.move_to_end(session)
            if len(self.sessions) > self.capacity:
                self.sessions.popitem(last=False)

    def on_remove(self, endpoint: EndpointState) -> None:
        for session in [s for s, a in self.sessions.items() if a == endpoint.key]:
            del self.sessions[session]


class RoundRobinScorer:
    """1 for the next endpoint in turn, 0 for the others."""

    def __init__(self, name: str = "round-robin") -> None:
        self.name = name
        self._turn = count()

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        target = self._target(ctx, endpoints)
        return [1.0 if e is target else 0.0 for e in endpoints]

    def favoured(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState], k: int
    ) -> list[EndpointState]:
        target = self._target(ctx, endpoints)
        return [] if target is None else [target]

    def _target(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]
    ) -> EndpointState | None:
        """The endpoint whose turn it is, chosen once a request (among all the candidates
        when a sample is taken)."""
        target = ctx.cache.get(self)
        if target is None and endpoints:
            target = ctx.cache[self] = endpoints[next(self._turn) % len(endpoints)]
        return target


class RandomScorer:
    def __init__(self, name: str = "random") -> None:
        self.name = name

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        return [_random() for _ in endpoints]


# --- pickers ------------------------------------------------------------------------------------


class _Picker:
    """A picker that decides from the scores alone: ``order`` gives the indexes to take."""

    default_name = ""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.default_name

    def pick(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState], scores: Scores, n: int
    ) -> list[EndpointState]:
        return [endpoints[i] for i in self.order(scores, n)]

    def order(
        self, scores: Scores, n: int, prefer: Callable[[int], bool] | None = None
    ) -> list[int]:
        """``framework.Picker.order``."""
        raise NotImplementedError


WARM_LOOKS = 16  # tied endpoints looked at for a warm connection (a bounded random sample)


class MaxScorePicker(_Picker):
    """Highest total score first; ties broken at random, preferring the endpoints ``prefer``
    names (a warm connection: no TCP connect before the request) among a random sample of
    at most WARM_LOOKS of the tied ones, so a tie among 1,000 idle endpoints costs 16
    lookups, not 1,000."""

    default_name = "max-score"

    def order(
        self, scores: Scores, n: int, prefer: Callable[[int], bool] | None = None
    ) -> list[int]:
        # Sort indices by score (C speed), then shuffle only the runs of equal scores that
        # reach into the first n: 4x cheaper than a random key per endpoint.
        order = sorted(range(len(scores)), key=scores.__getitem__, reverse=True)
        total = len(order)
        out: list[int] = []
        i = 0
        while len(out) < n and i < total:
            s = scores[order[i]]
            j = i + 1
            while j < total and scores[order[j]] == s:
                j += 1
            if j - i == 1:
                out.append(order[i])
            elif prefer is None:
                out.extend(_sample(order[i:j], min(j - i, n - len(out))))
            else:
                need = n - len(out)
                looked = _sample(order[i:j], min(j - i, max(need, WARM_LOOKS)))
                warm, cold = [], []
                for k in looked:
                    (warm if prefer(k) else cold).append(k)
                out.extend((warm + cold)[:need])
            i = j
        return out


class WeightedRandomPicker(_Picker):
    """At random, in proportion to the total score (without replacement for the fallbacks)."""

    default_name = "weighted-random"

    def order(
        self, scores: Scores, n: int, prefer: Callable[[int], bool] | None = None
    ) -> list[int]:
        # Efraimidis-Spirakis: key = u ** (1 / w); zero weights go last, in random order.
        keyed = []
        for i, s in enumerate(scores):
            u = _random()
            keyed.append((u ** (1.0 / s) if s > 0 else u - 1.0, i))
        keyed.sort(reverse=True)
        return [i for _, i in keyed[:n]]


class RandomPicker(_Picker):
    default_name = "random-picker"

    def order(
        self, scores: Scores, n: int, prefer: Callable[[int], bool] | None = None
    ) -> list[int]:
        return _sample(range(len(scores)), min(n, len(scores)))
