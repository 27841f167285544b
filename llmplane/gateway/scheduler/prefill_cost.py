"""The ``prefill-cost`` scorer: prefer the replica where the request's first token comes soonest.

A candidate's expected time to first token is the prefill work queued ahead of the request plus
the request's own uncached tokens, in tokens (the fleet's replicas taken as equally fast):

    cost = ahead * uncached_per_request + uncached

- ``uncached``: the request's prompt tokens less those the replica holds, from the precise
  scorer's index (``precise_prefix``; the approximate scorer's fraction for replicas that do
  not publish events);
- ``ahead``: the requests in front of it there, the larger of the engine's waiting queue as the
  gateway estimates it (``registry.queue_estimates``) and this gateway's streams still awaiting
  their first token (queued or in prefill);
- ``uncached_per_request``: the uncached tokens of the requests recently sent to that replica
  (learned at each pick: requests queued behind their own prefix cost little).

Not divided by a replica's observed prefill speed (its uncached prompt tokens over
``vllm:request_prefill_time_seconds``): in a batching engine a request's prefill time is the
whole steps', shared with other requests' prefill chunks, so a replica serving cache hits
looked slow and one recomputing prefixes fast, and requests went to the misses
(bench/precise_routing.py at 50 req/s: hit rate 0.61 with the division, 0.67 without).

Blocks of requests just sent to a replica and not yet reported by its events (the precise
scorer's pending blocks) count as cached there for a request that would wait behind those
requests (``ahead`` >= 1), and make their replica up to ``PENDING_PREFERENCE`` cheaper
otherwise, so a new group follows its first request instead of spreading.

score = lowest cost among the candidates / the candidate's cost, in (0, 1]. So a replica holding
the prefix keeps it until its queue costs the request more than recomputing the prefix
elsewhere (the direction of llm-d's predicted-latency routing). That trade is greedy: it counts
neither what the recompute costs the other replica's requests nor the prefix it evicts there,
and a replica's waiting count swings between 0 and a few under load, so in a saturated fleet
it gives up affinity (bench/precise_routing.py, 150 req/s: hit rate 0.39 against 0.88 for the
default profile); hence opt-in.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmplane.gateway.registry import EndpointState, queue_estimates
from llmplane.gateway.scheduler.framework import SchedulingContext
from llmplane.gateway.scheduler.precise_prefix import (
    BYTES_PER_TOKEN,
    PENDING,
    PROMPT_TOKENS,
    PrecisePrefixCacheScorer,
    predicted_cached_tokens,
)

LEARN = 0.2  # weight of the newest request in ``uncached_per_request``
# A replica the request's prefix was just sent to (its blocks pending) looks this much cheaper
# at most: a new group follows its first request rather than spread over near-equal replicas.
PENDING_PREFERENCE = 0.1


class PrefillCostScorer:
    def __init__(self, name: str = "prefill-cost", prefix: PrecisePrefixCacheScorer | None = None):
        self.name = name
        self.prefix = prefix if prefix is not None else PrecisePrefixCacheScorer()
        self.per_request: dict[str, float] = {}  # replica -> uncached tokens a request

    def uncached(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        """The request's prompt tokens each candidate would compute."""
        held = self.prefix.score(ctx, endpoints)  # fractions of the request's full blocks
        total = ctx.cache.get(PROMPT_TOKENS)
        if total is None:  # not tokenized: the approximate fractions of an estimated length
            size = len(ctx.prompt) / BYTES_PER_TOKEN
            return [size * (1.0 - h) for h in held]
        out = []
        for e, h in zip(endpoints, held, strict=True):
            cached = predicted_cached_tokens(ctx, e.key, on_the_way=False)
            if e.key not in self.prefix.publishing():
                cached = h * total
            out.append(max(float(total) - (cached or 0), 1.0))
        return out

    def costs(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        """Each candidate's prefill work before the request's first token, in tokens."""
        uncached = self.uncached(ctx, endpoints)
        queues = queue_estimates(endpoints, ctx.staleness, ctx.now)
        pending = ctx.cache.get(PENDING) or {}
        total = ctx.cache.get(PROMPT_TOKENS) or 0
        learned = ctx.cache[self] = {}
        uncached_at = dict(zip((e.key for e in endpoints), uncached, strict=True))
        out = []
        for e, mine, queued in zip(endpoints, uncached, queues, strict=True):
            ahead = max(queued, float(e.prefilling))
            soon = pending.get(e.key, 0)
            if soon and ahead >= 1 and total - soon < mine:
                # Queued behind the requests computing those blocks: cached when it runs.
                mine = max(float(total - soon), 1.0)
            learned[e.key] = mine
            per_request = self.per_request.get(e.key, mine)
            cost = ahead * per_request + mine
            if soon:  # by the blocks not reported yet
                cost *= 1.0 - PENDING_PREFERENCE * (soon - (total - uncached_at[e.key])) / total
            out.append(cost)
        return out

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        costs = self.costs(ctx, endpoints)
        best = min(costs, default=0.0)
        return [best / c if c > 0 else 1.0 for c in costs]

    def favoured(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState], k: int
    ) -> list[EndpointState]:
        """The replicas holding most of the request's prefix (the cheapest ones unless their
        queues are long, which a sample's random part finds)."""
        return self.prefix.favoured(ctx, endpoints, k)

    def on_pick(self, ctx: SchedulingContext, endpoint: EndpointState) -> None:
        """Learn the uncached tokens of what is sent to ``endpoint`` (and the precise scorer
        its pending blocks)."""
        self.prefix.on_pick(ctx, endpoint)
        scored = ctx.cache.get(self)
        mine = scored.get(endpoint.key) if scored is not None else None
        if mine is None:
            return
        old = self.per_request.get(endpoint.key)
        self.per_request[endpoint.key] = mine if old is None else old + LEARN * (mine - old)

    def on_remove(self, endpoint: EndpointState) -> None:
        self.per_request.pop(endpoint.key, None)
