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

In the built-in default profile it serves the ``prefill-cost`` scorer (``prefill_cost.py``),
which weighs what each replica holds against its queue, while some replica publishes events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
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
# ctx.cache key: replica -> prompt tokens the index says it holds, for the access log.
PREDICTED = "cached_tokens_predicted"
PROMPT_TOKENS = "prompt_tokens"
KEYS = "block_keys"
# ctx.cache key: replica -> prompt tokens it holds counting the blocks of requests sent there
# and not reported yet (``on_pick``); they are cached for a request queued behind those.
PENDING_SHARE = "pending_share"  # ctx.cache key: replica -> fraction of blocks pending there
PENDING = "cached_tokens_pending"  # ctx.cache key: the request's block keys, a list per block size
# A request's blocks count as held by the replica it was sent to for this long, or until the
# replica's events report them (``on_pick``); at most this many such blocks are remembered.
PENDING_SECONDS = 10.0
MAX_PENDING = 1_000_000
BYTES_PER_TOKEN = 4  # the approximate index's bytes -> tokens (the sim's own rule; English ~4)  # ctx.cache key: the request's token count, once tokenized


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
        # Blocks of requests sent but not yet reported: key -> replica -> until when (monotonic)
        # it counts as held, and the picks in the order they expire.
        self.pending: dict[int, dict[str, float]] = {}
        self._expiries: deque[tuple[float, list[int], str]] = deque()
        self._pending_blocks = 0

    def matches(
        self, ctx: SchedulingContext, model: str, engine: str, sizes: Iterable[int] = ()
    ) -> dict[str, float] | None:
        """Replica -> score for the replicas of ``model`` holding the request's first block;
        None when the request's token ids are not known (kept in ``ctx.cache``). ``sizes``:
        block sizes the candidates reported besides those in the index (their first request
        then leaves pending blocks too)."""
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
            ctx.cache[PROMPT_TOKENS] = len(ids)
            tokens = ctx.cache.setdefault(PREDICTED, {})
            root = root_key(ctx.model if ctx.lora else None)
            request_keys = ctx.cache[KEYS] = []
            for size in {*index.block_sizes(model), *sizes}:
                keys = block_keys(ids, size, root)
                if keys:
                    request_keys.append(keys)
                    total = len(keys)
                    # The engine computes the prompt's last token whatever it holds.
                    usable = (len(ids) - 1) // size
                    runs = index.matches(model, size, keys)
                    for replica, held in runs.items():
                        found[replica] = held / total
                        tokens[replica] = min(held, usable) * size
                    if self.pending:
                        soon = ctx.cache.setdefault(PENDING, {})
                        share = ctx.cache.setdefault(PENDING_SHARE, {})
                        for replica, n in self._pending_runs(keys, ctx.now).items():
                            if min(n, usable) > runs.get(replica, 0):  # beyond what it reported
                                soon[replica] = min(n, usable) * size
                                share[replica] = max(share.get(replica, 0.0), n / total)
        ctx.cache[key] = found
        return found

    def _pending_runs(self, keys: list[int], now: float) -> dict[str, int]:
        """Leading blocks of ``keys`` each replica was sent within ``PENDING_SECONDS``."""
        first = self.pending.get(keys[0])
        if not first:
            return {}
        alive = [r for r, until in first.items() if until > now]
        runs: dict[str, int] = {}
        for i in range(1, len(keys)):
            if not alive:
                break
            holders = self.pending.get(keys[i], {})
            still = []
            for replica in alive:
                if holders.get(replica, 0.0) > now:
                    still.append(replica)
                else:
                    runs[replica] = i
            alive = still
        for replica in alive:
            runs[replica] = len(keys)
        return runs

    def on_pick(self, ctx: SchedulingContext, endpoint: EndpointState) -> None:
        """The request's blocks are pending on ``endpoint`` until its events tell (at most
        ``PENDING_SECONDS``): they score as held there (the next request of a group follows the
        first before the engine has reported its blocks, as the approximate index does at pick
        time) but are not in the prediction (a request running beside this one computes them
        too); the cost-aware scorer counts them for a request that would queue behind it."""
        lists = ctx.cache.get(KEYS)
        if not lists:
            return
        now = ctx.now
        self._prune(now)
        until = now + PENDING_SECONDS
        replica = endpoint.key
        pending = self.pending
        for keys in lists:
            for key in keys:
                holders = pending.get(key)
                if holders is None:
                    pending[key] = {replica: until}
                else:
                    holders[replica] = until
            self._expiries.append((until, keys, replica))
            self._pending_blocks += len(keys)

    def _prune(self, now: float) -> None:
        """Forget the picks past their time, and the oldest beyond ``MAX_PENDING`` blocks."""
        expiries, pending = self._expiries, self.pending
        while expiries and (expiries[0][0] <= now or self._pending_blocks > MAX_PENDING):
            until, keys, replica = expiries.popleft()
            self._pending_blocks -= len(keys)
            for key in keys:
                holders = pending.get(key)
                if holders is not None and holders.get(replica) == until:
                    del holders[replica]
                    if not holders:
                        del pending[key]

    def publishing(self) -> dict[str, Any]:
        """The replicas whose events the index follows."""
        return self.index.replicas if self.index is not None else {}

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        publishing = self.publishing()
        first = endpoints[0].endpoint if endpoints else None
        if first is None or not any(e.key in publishing for e in endpoints):
            return self._fallback(ctx, endpoints)
        sizes = {e.block_size for e in endpoints if e.block_size}
        scores = self.matches(ctx, replica_model(first), first.engine, sizes)
        if scores is None:  # not tokenized: the approximate scores for every replica
            return self._fallback(ctx, endpoints)
        share = ctx.cache.get(PENDING_SHARE)
        if share:  # sent there, not reported yet: the group's next request follows its first
            scores = {**scores, **{r: max(v, scores.get(r, 0.0)) for r, v in share.items()}}
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


def predicted_cached_tokens(ctx: SchedulingContext, replica: str) -> int | None:
    """The prompt tokens the index says ``replica`` holds for this request (the leading run
    of its blocks); where no precise prediction was made (no replica of the model publishes
    events, the request was not tokenized, the profile has no precise scorer), the approximate
    index's estimate (its matched bytes / ``BYTES_PER_TOKEN``); None when neither scored."""
    tokens = ctx.cache.get(PREDICTED)
    if tokens is not None:
        return tokens.get(replica, 0)
    for scorer, matched in ctx.cache.items():
        if isinstance(scorer, PrefixCacheScorer) and isinstance(matched, dict):
            return matched.get(replica, 0) * scorer.block_size // BYTES_PER_TOKEN
    return None


def use_in_default(scheduler: Scheduler, scorer: PrecisePrefixCacheScorer, active: bool) -> None:
    """While ``active`` (some replica publishes KV events), ``scorer`` takes the approximate
    prefix scorer's place in the default profile, at its weight (the approximate one stays its
    fallback and keeps learning from picks); inactive again, the approximate one is back. The
    rest of the profile (the queue-margin filter, least-request, KV use) is unchanged."""
    profile = scheduler.profiles[scheduler.default]
    for i, (plugin, weight) in enumerate(profile.scorers):
        if active and type(plugin) is PrefixCacheScorer:
            scorer.fallback = plugin
            profile.scorers[i] = (scorer, weight)
            profile.observers = [*profile.observers, scorer]
        elif not active and plugin is scorer and scorer.fallback is not None:
            profile.scorers[i] = (scorer.fallback, weight)
            profile.observers = [o for o in profile.observers if o is not scorer]
        else:
            continue
        return
