"""The precise prefix-cache scorer: how much of a request's prompt each replica really holds.

score = the request's leading blocks the replica holds / the request's full blocks, in [0, 1],
read from the index of the blocks the engines report (``gateway/kvcache``). The request's
blocks are keyed from its token ids exactly as the index keys the engines' blocks (at each
block size the model's replicas use), so the score counts the engine's real block boundaries,
its evictions and its restarts, and every request any gateway sent.

Token ids come from a ``TokenSource``: the model's own tokenizer where the gateway has one,
the sim's rule for sim replicas (``SimTokens``). A replica that does not publish events, or a
request the source cannot tokenize, gets the ``fallback`` scorer's score (the approximate
``prefix-cache`` one in the default profile), so one profile serves a mixed fleet.

In the built-in default profile it takes the approximate scorer's place (same weight) while
some replica publishes events (``use_in_default``), and gives it back when none does.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any, Protocol

from llmplane.gateway.kvcache.index import BlockIndex, block_keys, root_key
from llmplane.gateway.kvcache.subscriber import replica_model
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.framework import Scheduler, SchedulingContext
from llmplane.gateway.scheduler.prefix import PrefixCacheScorer
from llmplane.sim.tokenizer import render_chat, tokenize

SIM_VOCAB = 128_256  # the sim's default --vocab-size
_UNKNOWN = object()


class TokenSource(Protocol):
    def token_ids(self, ctx: SchedulingContext, engine: str) -> list[int] | None:
        """The token ids the engine (``Endpoint.engine``) computes for ``ctx.request``'s
        prompt, or None when this source does not know them."""
        ...


class SimTokens:
    """The sim's tokenizer (``llmplane/sim/tokenizer.py``) for sim replicas at the default
    vocabulary size: its chat template, then 4-character chunks."""

    def __init__(self, vocab_size: int = SIM_VOCAB) -> None:
        self.vocab_size = vocab_size

    def token_ids(self, ctx: SchedulingContext, engine: str) -> list[int] | None:
        request = ctx.request
        if engine != "sim" or request is None:
            return None
        doc = request.doc
        try:
            if request.path.endswith("/chat/completions"):
                messages = doc.get("messages")
                if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                    return None
                text = render_chat(messages, bool(doc.get("add_generation_prompt", True)))
                return tokenize(text, self.vocab_size)
            prompt = doc.get("prompt")
            if isinstance(prompt, str):
                return tokenize(prompt, self.vocab_size)
            if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
                return prompt
        except (TypeError, ValueError, AttributeError):
            return None
        return None


class RequestTokenizer(Protocol):
    def token_ids(self, request: Any, model: str | None = None) -> list[int] | None:
        """The engine's ids for a parsed request (``gateway/tokenization``), ``model`` being
        the served name; None when unknown."""
        ...


class ModelTokens:
    """Token ids from the model's own tokenizer and chat template, for every engine whose
    model the gateway can tokenize (``Tokenization``: the model's files, else the engine's
    ``/tokenize``)."""

    def __init__(self, tokenizer: RequestTokenizer) -> None:
        self.tokenizer = tokenizer

    def token_ids(self, ctx: SchedulingContext, engine: str) -> list[int] | None:
        if ctx.request is None:
            return None
        return self.tokenizer.token_ids(ctx.request, ctx.model)


class TokenSources:
    """The first answer of several sources."""

    def __init__(self, *sources: TokenSource) -> None:
        self.sources = list(sources)

    def token_ids(self, ctx: SchedulingContext, engine: str) -> list[int] | None:
        for source in self.sources:
            ids = source.token_ids(ctx, engine)
            if ids is not None:
                return ids
        return None


class PrecisePrefixCacheScorer:
    """See the module docstring; ``index`` and ``tokens`` are set by the gateway (without
    them every endpoint gets the fallback's score, or 0)."""

    def __init__(self, name: str = "precise-prefix-cache", fallback: Any = None) -> None:
        self.name = name
        self.fallback: PrefixCacheScorer | None = fallback
        self.index: BlockIndex | None = None
        self.tokens: TokenSource | None = None

    def matches(self, ctx: SchedulingContext, model: str, engine: str) -> dict[str, float] | None:
        """Replica -> score for the replicas of ``model`` holding the request's first block;
        None when the request's token ids are not known (kept in ``ctx.cache``)."""
        key = (self, model, engine)
        found = ctx.cache.get(key, _UNKNOWN)
        if found is not _UNKNOWN:
            return found
        index, tokens = self.index, self.tokens
        ids = tokens.token_ids(ctx, engine) if tokens is not None else None
        if ids is None or index is None:
            found = None
        else:
            found = {}
            root = root_key(ctx.model if ctx.lora else None)
            for size in index.block_sizes(model):
                keys = block_keys(ids, size, root)
                if keys:
                    total = len(keys)
                    for replica, held in index.matches(model, size, keys).items():
                        found[replica] = held / total
        ctx.cache[key] = found
        return found

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        index = self.index
        publishing = index.replicas if index is not None else {}
        first = endpoints[0].endpoint if endpoints else None
        if first is None or not any(e.key in publishing for e in endpoints):
            return self._fallback(ctx, endpoints)
        scores = self.matches(ctx, replica_model(first), first.engine)
        if scores is None:  # not tokenized: the approximate scores for every replica
            return self._fallback(ctx, endpoints)
        if all(e.key in publishing for e in endpoints):
            return list(map(scores.get, (e.key for e in endpoints), repeat(0.0)))
        approximate = self._fallback(ctx, endpoints)
        return [
            scores.get(e.key, 0.0) if e.key in publishing else a
            for e, a in zip(endpoints, approximate, strict=True)
        ]

    def _fallback(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        if self.fallback is None:
            return [0.0] * len(endpoints)
        return self.fallback.score(ctx, endpoints)


def use_in_default(scheduler: Scheduler, scorer: PrecisePrefixCacheScorer, active: bool) -> None:
    """Put ``scorer`` in the approximate prefix scorer's place in the default profile (its
    weight; the approximate one stays its fallback and keeps learning from picks), or take it
    out again."""
    profile = scheduler.profiles[scheduler.default]
    for i, (plugin, weight) in enumerate(profile.scorers):
        if active and type(plugin) is PrefixCacheScorer:
            scorer.fallback = plugin
            profile.scorers[i] = (scorer, weight)
        elif not active and plugin is scorer and scorer.fallback is not None:
            profile.scorers[i] = (scorer.fallback, weight)
        else:
            continue
        return
