"""What the gateway holds for precise prefix routing: the subscriptions to its replicas' KV
events, their index, and the ``precise-prefix-cache`` scorers reading it.

The built-in default profile takes the precise scorer in the approximate one's place while at
least one replica publishes events (``precise_prefix.use_in_default``); a configured profile
uses it, or the cost-aware ``prefill-cost`` scorer, where it names it. Every gateway process
(each worker, each replica of the gateway) subscribes on its own, so all build the same index
without sharing state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from llmplane.gateway.kvcache.subscriber import KVEventSubscriber
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.framework import Profile, Scheduler, SchedulingContext
from llmplane.gateway.scheduler.precise_prefix import (
    PrecisePrefixCacheScorer,
    TokenSource,
    TokenSources,
    use_in_default,
)
from llmplane.gateway.scheduler.prefill_cost import PrefillCostScorer
from llmplane.runtime.endpoint import Endpoint


class PreciseRouting:
    """``subscriber`` and ``tokens``: the index and token ids the scheduler's precise scorers
    were built with (``PluginHandle``); ``builtin_default``: its profile is the built-in one."""

    def __init__(
        self,
        scheduler: Scheduler,
        subscriber: KVEventSubscriber,
        tokens: TokenSources,
        registry: Any,
        builtin_default: bool,
    ) -> None:
        self.scheduler = scheduler
        self.subscriber = subscriber
        registry.register(subscriber)
        self.tokens = tokens
        self.default = (
            PrecisePrefixCacheScorer(index=subscriber.index, tokens=tokens)
            if builtin_default
            else None
        )
        self.scorers = [
            p for p in scheduler.plugins.values() if isinstance(p, PrecisePrefixCacheScorer)
        ]
        self.scorers += [
            p.prefix for p in scheduler.plugins.values() if isinstance(p, PrefillCostScorer)
        ]
        if self.default is not None:
            self.scorers.append(self.default)
        self.active = False

    def add_tokens(self, source: TokenSource) -> None:
        """Another source of token ids, asked before the ones there are."""
        self.tokens.sources.insert(0, source)

    async def prepare(
        self, ctx: SchedulingContext, candidates: Sequence[EndpointState], profile: Profile
    ) -> None:
        """Before scheduling, for a profile that scores by the index and candidates that
        publish events: where the gateway cannot tokenize the request itself (a model without
        files here), fetch its ids from an engine's /tokenize (``Tokenization.prepare``, which
        bounds the wait), so that it is scored precisely."""
        feeds = self.subscriber.feeds
        if not feeds or ctx.request is None:
            return
        engine = next((e.endpoint.engine for e in candidates if e.key in feeds), None)
        if engine is None or not any(
            plugin in self.scorers or getattr(plugin, "prefix", None) in self.scorers
            for plugin, _ in profile.scorers
        ):
            return
        await self.tokens.prepare(ctx, engine)

    def sync(self, endpoints: Iterable[Endpoint]) -> None:
        """Follow the endpoints (on the event loop): subscribe, unsubscribe, and put the
        precise scorer in the default profile while any endpoint publishes."""
        self.subscriber.sync(endpoints)
        active = bool(self.subscriber.feeds)
        if self.default is not None and active != self.active:
            use_in_default(self.scheduler, self.default, active)
        self.active = active

    async def close(self) -> None:
        await self.subscriber.close()
