"""The ``prefix-spread`` scorer: a prompt head no replica was sent lately goes to the replica sent
the fewest distinct heads lately.

Prefix affinity keeps the requests that share a prompt head (a group's system prompt, a
document) on the replica the first of them went to, so each replica's share of the traffic is
settled when the groups are placed. The load scorers place a new group by the requests in
flight at that moment, which says nothing about the traffic the group brings later: in
``bench/precise_routing.py`` (64 groups, 8 sims, 150 req/s) placements by least-request put 9
to 13 groups on the busiest sim, and the TTFT p90 of the cell followed that number (about
490 ms with 9, 1,011 ms with 13). This scorer places new heads evenly, as vllm-router's
``cache_aware`` sends a miss to the worker with the smallest prefix tree.

A head is the prompt's first ``HEAD_BYTES`` (its first block in the approximate prefix index).
A request whose head was sent to any replica within ``window`` seconds scores 1 everywhere:
affinity and load decide, as without this scorer. A new head scores each candidate by the
distinct heads sent to it within the window, min-max inverted (fewest: 1). Each gateway worker
counts its own picks. In the built-in default profile at weight 3 (``DEFAULT_CONFIG``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any

from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.framework import SchedulingContext
from llmplane.gateway.scheduler.plugins import min_max_inverse
from llmplane.gateway.scheduler.prefix import block_hashes

HEAD_BYTES = 64
MAX_ENTRIES = 200_000  # (replica, head) pairs kept, the oldest dropped first: bounded memory
_key = attrgetter("address")  # EndpointState.key, without the property call


class PrefixSpreadScorer:
    """See the module docstring; ``window``: the seconds a head counts after its last pick."""

    def __init__(self, name: str = "prefix-spread", window: float = 60.0) -> None:
        if not 0 < window < math.inf:
            raise ValueError(f"{name}: window must be a positive number of seconds, got {window}")
        self.name = name
        self.window = window
        # (replica, head) -> last pick, oldest first; replica -> its heads among them.
        self.recent: dict[tuple[str, int], float] = {}
        self.counts: dict[str, int] = {}
        self.seen: dict[int, float] = {}  # head -> last pick anywhere, oldest first

    def head(self, ctx: SchedulingContext) -> int | None:
        key = (self, "head")
        if key not in ctx.cache:
            if 0 <= ctx.prompt_bound < HEAD_BYTES:
                ctx.cache[key] = None
            else:
                hashes = block_hashes(ctx.prompt, ctx.model, HEAD_BYTES, 1)
                ctx.cache[key] = hashes[0] if hashes else None
        return ctx.cache[key]

    def expire(self, now: float) -> None:
        """Forget the picks older than the window (and the oldest beyond ``MAX_ENTRIES``)."""
        oldest = now - self.window
        recent, counts, seen = self.recent, self.counts, self.seen
        for key, _ in list(_front(recent, oldest, MAX_ENTRIES)):
            del recent[key]
            counts[key[0]] -= 1
        for head, _ in list(_front(seen, oldest, MAX_ENTRIES)):
            del seen[head]

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        head = self.head(ctx)
        self.expire(ctx.now)
        if head is None or head in self.seen or not endpoints:
            return [1.0] * len(endpoints)
        return min_max_inverse(list(map(self.counts.get, map(_key, endpoints), repeat(0))))

    def on_pick(self, ctx: SchedulingContext, endpoint: EndpointState) -> None:
        head = self.head(ctx)
        if head is None:
            return
        now, key = ctx.now, (endpoint.key, head)
        if self.recent.pop(key, None) is None:
            self.counts[endpoint.key] = self.counts.get(endpoint.key, 0) + 1
        self.recent[key] = now  # to the young end
        self.seen.pop(head, None)
        self.seen[head] = now

    def on_remove(self, endpoint: EndpointState) -> None:
        replica = endpoint.key
        self.counts.pop(replica, None)
        for key in [k for k in self.recent if k[0] == replica]:
            del self.recent[key]


def _front(ordered: dict[Any, float], oldest: float, limit: int) -> Iterator[tuple[Any, float]]:
    """The leading items of an insertion-ordered ``ordered`` (key -> time, oldest first) that
    are older than ``oldest`` or beyond ``limit`` entries."""
    extra = len(ordered) - limit
    for item in ordered.items():
        if item[1] >= oldest and extra <= 0:
            return
        extra -= 1
        yield item
