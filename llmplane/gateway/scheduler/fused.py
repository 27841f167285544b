"""The default profile's filters and scorers in two passes over the endpoints instead of ten.

At 1,000 endpoints a pick through the general path is about ten Python passes over the
endpoints (two filters, three scorers each building a list, the weighted sum, the picker),
each 10-50 us. For profiles built only from the model-served and low-queue filters and the
prefix-cache, least-request and KV-cache scorers (in that order, any weights: the default
profile), ``plan`` returns a ``FusedPlan`` whose ``run`` gives the same candidates and the
bit-identical weighted totals in one filtering pass and one scoring pass: the filters'
conjunction (equal to running them in turn whenever it keeps anyone; otherwise the plan
declines and the general path runs), and each total summed in the general path's order
(``weights[0] * score0 + weights[1] * score1 + weights[2] * score2``, the per-scorer products
computed as there). Anything the plan does not cover (a negative or huge in-flight count, a
threshold <= 0, a clock younger than the staleness) makes it decline too.
tests/unit/test_scheduler_fused.py checks it against the general path.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.framework import SchedulingContext
from llmplane.gateway.scheduler.plugins import (
    KVCacheScorer,
    LeastRequestScorer,
    LowQueueFilter,
    ModelServedFilter,
)
from llmplane.gateway.scheduler.prefix import PrefixCacheScorer

_inflight = attrgetter("inflight")


class FusedPlan:
    """The fused form of one profile (see the module docstring)."""

    def __init__(
        self,
        model_filter: bool,
        threshold: float | None,
        prefix: PrefixCacheScorer,
        weights: tuple[float, float, float],
    ) -> None:
        self.model_filter = model_filter
        self.threshold = threshold
        self.prefix = prefix
        self.weights = weights

    def candidates(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]
    ) -> list[EndpointState] | None:
        """The endpoints every filter keeps, or None when the general path must decide (the
        conjunction is empty, so some filter would be skipped there)."""
        oldest = ctx.now - ctx.staleness
        threshold = self.threshold
        if threshold is not None and (threshold <= 0 or oldest <= 0):
            return None  # the shortcuts below need both > 0
        model = ctx.model
        if threshold is None:
            kept = (
                [e for e in endpoints if (m := e.served_models) is None or model in m]
                if self.model_filter
                else list(endpoints)
            )
        elif self.model_filter:
            # registry.below_queue's test: with threshold > 0 the clamp at 0 changes nothing,
            # and with oldest > 0 a fresh scrape time is non-zero.
            kept = [
                e
                for e in endpoints
                if ((m := e.served_models) is None or model in m)
                and (
                    e.waiting - e.room + e.inflight - e.inflight_at_scrape
                    if e.scraped_at >= oldest and e.has_load_metrics
                    else e.inflight
                )
                < threshold
            ]
        else:
            kept = [
                e
                for e in endpoints
                if (
                    e.waiting - e.room + e.inflight - e.inflight_at_scrape
                    if e.scraped_at >= oldest and e.has_load_metrics
                    else e.inflight
                )
                < threshold
            ]
        return kept or None

    def totals(self, ctx: SchedulingContext, kept: list[EndpointState]) -> list[float] | None:
        """The weighted totals for ``kept`` (more than one endpoint), or None to decline."""
        inflight = list(map(_inflight, kept))
        lo, hi = min(inflight), max(inflight)
        if lo < 0 or hi > 4 * len(kept) + 64:
            return None
        wp, wl, wk = self.weights
        # least-request: (hi - v) / span, or 1.0 for all when every count is equal.
        if hi <= lo:
            lr = [wl * 1.0] * (hi + 1)
        else:
            span = float(hi - lo)
            lr = [wl * ((hi - v) / span) for v in range(hi + 1)]
        # prefix-cache: matched blocks / blocks, only for the endpoints holding block 0.
        prefix = self.prefix
        if prefix.feed is not None:
            prefix.feed.apply()
        hashes = prefix.hashes(ctx)
        none = wp * 0.0
        scores: dict[str, float] = {}
        if hashes:
            matched = ctx.cache[prefix] = prefix.index.matches(hashes)
            count = len(hashes)
            scores = {k: wp * (n / count) for k, n in matched.items()}
        get = scores.get
        oldest = ctx.now - ctx.staleness
        if scores:
            return [
                get(e.endpoint.address, none)
                + lr[f]
                + wk
                * (
                    (1.0 if (u := e.kv_usage) <= 0.0 else 0.0 if u >= 1.0 else 1.0 - u)
                    if e.has_kv and e.has_load_metrics and e.scraped_at >= oldest and e.scraped_at
                    else 0.5
                )
                for e, f in zip(kept, inflight, strict=True)
            ]
        return [
            none
            + lr[f]
            + wk
            * (
                (1.0 if (u := e.kv_usage) <= 0.0 else 0.0 if u >= 1.0 else 1.0 - u)
                if e.has_kv and e.has_load_metrics and e.scraped_at >= oldest and e.scraped_at
                else 0.5
            )
            for e, f in zip(kept, inflight, strict=True)
        ]

    def run(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]
    ) -> tuple[list[EndpointState], list[float]] | None:
        """(candidates, weighted totals) as the general path computes them, or None."""
        kept = self.candidates(ctx, endpoints)
        if kept is None:
            return None
        if len(kept) == 1:
            return kept, [0.0]
        totals = self.totals(ctx, kept)
        if totals is None:
            return None
        return kept, totals


def plan(filters: Sequence[Any], scorers: Sequence[tuple[Any, float]]) -> FusedPlan | None:
    """A fused plan for a profile with these filters and (scorer, weight) pairs, or None when
    the profile is not of the shape it covers. Exact types only: a subclass may change what a
    plugin does."""
    model_filter = False
    threshold: float | None = None
    for f in filters:
        if type(f) is ModelServedFilter and not model_filter:
            model_filter = True
        elif type(f) is LowQueueFilter and threshold is None:
            threshold = float(f.threshold)
        else:
            return None
    kinds = tuple(type(s) for s, _ in scorers)
    if kinds != (PrefixCacheScorer, LeastRequestScorer, KVCacheScorer):
        return None
    (prefix, wp), (_, wl), (_, wk) = scorers
    return FusedPlan(model_filter, threshold, prefix, (float(wp), float(wl), float(wk)))
