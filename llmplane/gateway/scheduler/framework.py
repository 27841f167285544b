"""Scheduling framework: filters, weighted scorers and a picker, run per request.

A profile runs its filters in order (a filter that would remove every endpoint is skipped:
scheduling fails open rather than refusing a request the endpoints could still serve), sums
``weight * score`` over its scorers (each score in [0, 1]), and lets its picker order the
endpoints; the first is used and the next ``n - 1`` are the retry fallbacks. Plugins that need
to learn from the outcome implement ``on_pick`` (called for the endpoint a request is actually
sent to) and ``on_remove`` (an endpoint went away).

Past ``SAMPLE_ABOVE`` candidates the scorers rank a sample (``Profile.sample``): the endpoints
each scorer favours (``Favouring``: those holding the request's prefix, its session, its
adapter) and about ``SAMPLE`` others at random. So a pick costs about the same at 1,000 endpoints as
at 150 (bench/scheduling.py), and load is spread as well as by looking at all of them: the
least loaded of 64 random replicas is about as lightly loaded as the least loaded of all (the
"power of d choices"; Envoy's least-request balancer looks at 2). Filters that keep endpoints
by what they are (the model or adapter served) see every endpoint; one that keeps those close
to the best among the candidates (``relative``: the queue margin) runs on the sample, whose
best is, by the same argument, about the best of all.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Any, Protocol, runtime_checkable

from llmplane.gateway.registry import EndpointState

SAMPLE_ABOVE = 256  # candidates past which a pick scores a sample of them
SAMPLE = 64  # the random part of that sample, and the most each scorer favours
_sample = random.sample
_randrange = random.randrange
_key = attrgetter("address")  # EndpointState.key, without the property call


class SchedulingContext:
    """What plugins may read about a request. ``prompt`` (UTF-8 bytes, chat messages flattened)
    is computed on first use, so profiles without a prefix scorer never pay for it."""

    __slots__ = (
        "_prompt",
        "_prompt_source",
        "cache",
        "headers",
        "lora",
        "model",
        "now",
        "prompt_bound",
        "request",
        "staleness",
        "warm",
    )

    def __init__(
        self,
        model: str,
        prompt: bytes | Callable[[], bytes] = b"",
        headers: Mapping[str, str] | None = None,
        lora: bool = False,
        staleness: float = 0.2,
        now: float | None = None,
        warm: Callable[[str], bool] | None = None,
        prompt_bound: int = -1,
        request: Any = None,
    ) -> None:
        self.model = model
        # The parsed request (``gateway/request.InferenceRequest``; None in unit tests), for
        # plugins that tokenize it (``precise_prefix.TokenSource``).
        self.request = request
        # An upper bound on ``len(prompt)`` known without computing it (-1: none), so that a
        # prompt too short for a single prefix block is never extracted.
        self.prompt_bound = prompt_bound
        if callable(prompt):
            self._prompt: bytes | None = None
            self._prompt_source: Callable[[], bytes] | None = prompt
        else:
            self._prompt = prompt
            self._prompt_source = None
        self.headers: Mapping[str, str] = headers if headers is not None else {}
        self.lora = lora
        self.staleness = staleness
        self.now = time.monotonic() if now is None else now
        self.cache: dict[Any, Any] = {}  # per-request scratch for plugins
        # Whether this process holds an idle connection to an address (a gateway worker that
        # does not scrape): the max-score picker prefers those among equally scored endpoints.
        self.warm = warm

    @property
    def prompt(self) -> bytes:
        if self._prompt is None:
            assert self._prompt_source is not None
            self._prompt = self._prompt_source()
        return self._prompt


Scores = Sequence[float]  # one total per candidate, in the candidates' order


@runtime_checkable
class Plugin(Protocol):
    name: str


@runtime_checkable
class Filter(Plugin, Protocol):
    def filter(
        self, ctx: SchedulingContext, endpoints: list[EndpointState]
    ) -> list[EndpointState]: ...


@runtime_checkable
class Scorer(Plugin, Protocol):
    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]: ...


class Favouring(Protocol):
    """A scorer that names the candidates it scores highest, so that a sample keeps them."""

    def favoured(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState], k: int
    ) -> list[EndpointState]:
        """At most ``k`` of ``endpoints``, those this scorer scores highest (above the rest)."""
        ...


@runtime_checkable
class Picker(Plugin, Protocol):
    def order(
        self, scores: Scores, n: int, prefer: Callable[[int], bool] | None = None
    ) -> list[int]:
        """The indexes of the ``n`` endpoints to take, in order; ``prefer(i)`` (if given) is
        True for endpoint ``i`` with a warm connection (a picker may ignore it)."""
        ...


@dataclass
class Pick:
    """The ordered endpoints (first = chosen) and a summary of how they were scored."""

    endpoints: list[EndpointState]
    scores: dict[str, float]  # address -> total score, for the chosen ones
    profile: str


@dataclass
class Profile:
    name: str
    filters: list[Any] = field(default_factory=list)
    scorers: list[tuple[Any, float]] = field(default_factory=list)
    picker: Any = None
    observers: list[Any] = field(default_factory=list)  # plugins with on_pick

    def run(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState], n: int) -> Pick:
        kept, totals = self.score(ctx, endpoints)
        warm = ctx.warm
        if len(kept) < 2:  # nothing to choose
            picked: Sequence[int] = range(min(n, len(kept)))
        elif warm is None:
            picked = self.picker.order(totals, n)
        else:
            picked = self.picker.order(totals, n, lambda i: warm(kept[i].address))
        return Pick(
            [kept[i] for i in picked],
            # (4 decimals; round(x, 4) goes through decimal digits: several times the cost)
            {kept[i].address: round(totals[i] * 1e4) / 1e4 for i in picked},
            self.name,
        )

    def score(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]
    ) -> tuple[list[EndpointState], list[float]]:
        """The general path: each filter in turn (skipped if it would keep no one), then each
        scorer, weighted and summed: (candidates, totals). One candidate is the answer as it
        is: no filter may remove it and no score can rank it."""
        kept = list(endpoints)
        if len(kept) < 2:
            return kept, [0.0] * len(kept)
        later = []  # relative filters, past SAMPLE_ABOVE: on the sample (module docstring)
        for f in self.filters:
            if len(kept) > SAMPLE_ABOVE and getattr(f, "relative", False):
                later.append(f)
            else:
                kept = f.filter(ctx, kept) or kept
        if len(kept) > SAMPLE_ABOVE:
            kept = self.sample(ctx, kept)
        for f in later:
            kept = f.filter(ctx, kept) or kept
        totals = (
            weighted_sum([(scorer.score(ctx, kept), w) for scorer, w in self.scorers], len(kept))
            if len(kept) > 1
            else [0.0] * len(kept)
        )
        return kept, totals

    def sample(self, ctx: SchedulingContext, endpoints: list[EndpointState]) -> list[EndpointState]:
        """The endpoints the scorers favour and ``SAMPLE`` others at random (module docstring)."""
        chosen: dict[str, EndpointState] = {}
        for scorer, _ in self.scorers:
            favoured = getattr(scorer, "favoured", None)
            if favoured is not None:
                named = favoured(ctx, endpoints, SAMPLE)
                chosen.update({e.key: e for e in named})
        # Every ``step``-th from a random start: each endpoint as likely as any (and a slice is
        # C work; ``random.sample`` costs a Python call per endpoint taken).
        step = len(endpoints) // SAMPLE
        for e in endpoints[_randrange(step) :: step]:
            chosen.setdefault(e.key, e)
        return list(chosen.values())

    def on_pick(self, ctx: SchedulingContext, endpoint: EndpointState) -> None:
        for plugin in self.observers:
            plugin.on_pick(ctx, endpoint)


def weighted_sum(scored: Sequence[tuple[Sequence[float], float]], n: int) -> list[float]:
    """sum(weight * score) per endpoint, the scorers added in their order."""
    totals = [0.0] * n
    for scores, w in scored:
        totals = [t + w * x for t, x in zip(totals, scores, strict=True)]
    return totals


def best(
    endpoints: Sequence[EndpointState], scores: Mapping[str, float], k: int
) -> list[EndpointState]:
    """The ``k`` of the ``endpoints`` named in ``scores`` (by key) with the highest scores (all
    of them if fewer), ties at the cut taken at random: ``Favouring.favoured`` for scorers
    that score by key."""
    named = list(compress(endpoints, map(scores.__contains__, map(_key, endpoints))))
    if len(named) <= k:
        return named
    values = list(map(scores.__getitem__, map(_key, named)))
    cut = sorted(values, reverse=True)[k - 1]
    above = list(compress(named, map(cut.__lt__, values)))
    tied = list(compress(named, map(cut.__eq__, values)))
    return above + _sample(tied, k - len(above))


class Scheduler:
    """Named profiles over shared plugin instances."""

    def __init__(self, profiles: dict[str, Profile], plugins: dict[str, Any], default: str) -> None:
        self.profiles = profiles
        self.plugins = plugins
        self.default = default

    def profile(self, name: str | None) -> Profile:
        if name is not None:
            profile = self.profiles.get(name)
            if profile is not None:
                return profile
        return self.profiles[self.default]

    def pick(
        self,
        ctx: SchedulingContext,
        endpoints: Sequence[EndpointState],
        n: int = 4,
        profile: str | None = None,
    ) -> Pick:
        return self.profile(profile).run(ctx, endpoints, n)

    def on_remove(self, endpoint: EndpointState) -> None:
        for plugin in self.plugins.values():
            hook = getattr(plugin, "on_remove", None)
            if hook is not None:
                hook(endpoint)
