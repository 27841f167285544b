"""The precise prefix-cache scorer: how much of a request's prompt each replica really holds.

score = the request's leading blocks the replica holds / the request's full blocks, in [0, 1],
read from the index of the blocks the engines report (``gateway/kvcache``). The request's
blocks are keyed from its token ids exactly as the index keys the engines' blocks (at each
block size the model's replicas use), so the score counts the engine's real block boundaries,
its evictions and its restarts, and every request any gateway sent.

Token ids come from a ``TokenSource``: the model's own tokenizer where the gateway has one,
the engine's /tokenize (whole, or for a request not asked before the ids of its leading part:
``LeadingIds``), the sim's rule for sim replicas (``SimTokens``). A replica that does not
publish events, or a request the source cannot tokenize, gets the ``fallback`` scorer's score
(the approximate ``prefix-cache`` one in the default profile), so one profile serves a mixed
fleet.

A request's blocks that the replica it was sent to has not reported yet are on their way there
(``BlockIndex.expect``): they score as held there, and ``predicted_cached_tokens`` (the access
log's prediction) counts them for the requests that follow.

In the built-in default profile it takes the approximate scorer's place while some replica
publishes events (``use_in_default``). There a request whose blocks no replica holds (every
replica evicted its group's prefix) gets the approximate scorer's score too: it goes back to
the replica the gateway sent its group to, so an eviction does not place the group again by
the load of the moment (each such draw moved groups together onto some replicas:
``bench/precise_routing.py --same-groups``). The opt-in ``prefill-cost`` scorer
(``prefill_cost.py``) reads it to weigh what each replica holds against its queue.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from itertools import compress, repeat
from operator import attrgetter
from typing import Any, Protocol

from llmplane.gateway.kvcache.index import BlockIndex, block_keys, root_key
from llmplane.gateway.kvcache.subscriber import replica_model
from llmplane.gateway.registry import EndpointState, queue_estimates
from llmplane.gateway.scheduler.framework import Scheduler, SchedulingContext, best
from llmplane.gateway.scheduler.prefix import PrefixCacheScorer, runs_by_name
from llmplane.gateway.tokenization.prefix import LeadingIds
from llmplane.sim.tokenizer import render_chat, tokenize

SIM_VOCAB = 128_256  # the sim's default --vocab-size
_UNKNOWN = object()
_key = attrgetter("address")  # EndpointState.key, without the property call
_block_size = attrgetter("block_size")
# ctx.cache key: replica -> prompt tokens the index says it holds, for the access log.
PREDICTED = "cached_tokens_predicted"
PROMPT_TOKENS = "prompt_tokens"  # ctx.cache key: the request's token count, once tokenized
# ctx.cache key: (block size, the request's block keys at that size) for each size.
KEYS = "block_keys"
# ctx.cache keys: replica -> prompt tokens it will hold counting the blocks of requests sent
# there and not reported yet (``on_pick``), where that is more than it reported; and the
# fraction of the request's blocks that makes.
PENDING = "cached_tokens_pending"
PENDING_SHARE = "pending_share"
# ctx.cache key: replica -> the ``PENDING`` tokens it will hold when this request is admitted:
# those of replicas without a queue. Engines admit requests in order and cache a block once it
# is computed, so the request computing them is running there and is done with them first;
# behind a queue, the two may be admitted in one step, and this one computes them too.
ARRIVING = "cached_tokens_arriving"
BYTES_PER_TOKEN = 4  # the approximate index's bytes -> tokens (the sim's own rule; English ~4)


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

    async def prepare(self, request: Any, model: str | None = None) -> bool:
        """Fetch what ``token_ids`` needs from the engine (bounded); True when it is there."""
        ...


class ModelTokens:
    """Token ids from the model's own tokenizer and chat template, for every engine whose
    model the gateway can tokenize (``Tokenization``: the model's files, else the engine's
    ``/tokenize``, which ``prepare`` asks before scheduling)."""

    def __init__(self, tokenizer: RequestTokenizer) -> None:
        self.tokenizer = tokenizer

    def token_ids(self, ctx: SchedulingContext, engine: str) -> list[int] | None:
        if ctx.request is None:
            return None
        return self.tokenizer.token_ids(ctx.request, ctx.model)

    async def prepare(self, ctx: SchedulingContext) -> bool:
        if ctx.request is None:
            return False
        return await self.tokenizer.prepare(ctx.request, ctx.model)


class TokenSources:
    """The first answer of several sources, computed once a request and engine kind (kept in
    ``ctx.cache``); a whole answer before another source's ``LeadingIds``."""

    def __init__(self, *sources: TokenSource) -> None:
        self.sources = list(sources)

    def token_ids(self, ctx: SchedulingContext, engine: str) -> list[int] | None:
        key = (self, engine)
        ids = ctx.cache.get(key, _UNKNOWN)
        if ids is not _UNKNOWN:
            return ids
        leading = None
        for source in self.sources:
            ids = source.token_ids(ctx, engine)
            if ids is not None and not isinstance(ids, LeadingIds):
                break
            leading = leading or ids  # a later source may know them whole
        else:
            ids = leading
        ctx.cache[key] = ids
        return ids

    async def prepare(self, ctx: SchedulingContext, engine: str) -> None:
        """Where no source knows the request's whole ids now, let those that can fetch them
        (the engine's /tokenize) do so, within their bound."""
        ids = self.token_ids(ctx, engine)
        if ids is not None and not isinstance(ids, LeadingIds):
            return
        for source in self.sources:
            prepare = getattr(source, "prepare", None)
            if prepare is not None and await prepare(ctx):
                del ctx.cache[(self, engine)]  # asked again when scored
                return


class PrecisePrefixCacheScorer:
    """See the module docstring; ``index``: the gateway's index of the replicas' blocks,
    ``tokens``: where a request's token ids come from (without them every endpoint gets the
    fallback's score, or 0)."""

    def __init__(
        self,
        name: str = "precise-prefix-cache",
        fallback: Any = None,
        index: BlockIndex | None = None,
        tokens: TokenSource | None = None,
    ) -> None:
        self.name = name
        self.fallback: PrefixCacheScorer | None = fallback
        self.index = index
        self.tokens = tokens

    def scores(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]
    ) -> dict[str, float] | None:
        """Replica -> score for the replicas of the candidates' model holding the request's
        first block, or with its blocks on their way there (the group's next request follows
        its first); None when the request's token ids are not known. Computed once a request
        (kept in ``ctx.cache``), at the block sizes in the index and those the candidates
        reported (their first request then leaves blocks on their way too)."""
        first = endpoints[0].endpoint
        model, engine = replica_model(first), first.engine
        key = (self, model, engine)
        found = ctx.cache.get(key, _UNKNOWN)
        if found is not _UNKNOWN:
            return found
        sizes = set(map(_block_size, endpoints))
        sizes.discard(0)
        index, tokens = self.index, self.tokens
        ids = tokens.token_ids(ctx, engine) if tokens is not None else None
        request_keys = None if ids is None or index is None else self._keys(ctx, ids, model, sizes)
        if request_keys is None:
            found = None
        else:
            found = {}
            # Leading ids (a prefix of the request's ids) are keyed as far as they go: block
            # keys are chained, so theirs are the whole request's first keys and the scorer
            # counts fewer of its cached blocks, never other ones; the fractions and the
            # prompt's length are the whole request's (estimated).
            length = ids.total if isinstance(ids, LeadingIds) else len(ids)
            ctx.cache[PROMPT_TOKENS] = length
            ctx.cache[KEYS] = request_keys
            tokens = ctx.cache.setdefault(PREDICTED, {})
            for size, keys in request_keys:
                total = max(len(keys), length // size)
                # The engine computes the prompt's last token whatever it holds.
                usable = (length - 1) // size
                # By run length, in C-level steps: when 1,000 replicas hold the request's first
                # block, a step per replica in Python cost most of a pick.
                groups = index.run_groups(model, size, keys)
                runs = runs_by_name(groups)
                for held, replicas in groups:
                    found.update(dict.fromkeys(replicas, held / total))
                    tokens.update(dict.fromkeys(replicas, min(held, usable) * size))
                if index.expected:
                    soon = ctx.cache.setdefault(PENDING, {})
                    share = ctx.cache.setdefault(PENDING_SHARE, {})
                    for replica, n in index.expected_runs(model, size, keys, runs, ctx.now).items():
                        if min(n, usable) > runs.get(replica, 0):  # beyond what it reported
                            soon[replica] = min(n, usable) * size
                            share[replica] = max(share.get(replica, 0.0), n / total)
            share = ctx.cache.get(PENDING_SHARE)
            if share:
                found = {**found, **{r: max(v, found.get(r, 0.0)) for r, v in share.items()}}
        ctx.cache[key] = found
        return found

    def _keys(
        self, ctx: SchedulingContext, ids: list[int], model: str, sizes: Iterable[int]
    ) -> list[tuple[int, list[int]]] | None:
        """(block size, the request's block keys) at each size of ``model``'s replicas that
        leaves a full block; None for ids no engine has (beyond 8 bytes: a prompt of token
        ids), which match nothing and score as a request not tokenized."""
        assert self.index is not None
        root = root_key(ctx.model if ctx.lora else None)
        try:
            return [
                (size, keys)
                for size in {*self.index.block_sizes(model), *sizes}
                if (keys := block_keys(ids, size, root))
            ]
        except struct.error:
            return None

    def on_pick(self, ctx: SchedulingContext, endpoint: EndpointState) -> None:
        """The request's blocks that ``endpoint`` has not reported are on their way there
        (``BlockIndex.expect``) until its events tell: they score as held there (the next
        request of a group follows the first before the engine has reported its blocks, as
        the approximate index does at pick time) and count in the prediction of a request
        that arrives after this one (``predicted_cached_tokens``)."""
        lists = ctx.cache.get(KEYS)
        if not lists or self.index is None:
            return
        for size, keys in lists:
            self.index.expect(endpoint.key, size, keys, ctx.now)

    def publishing(self) -> dict[str, Any]:
        """The replicas whose events the index follows."""
        return self.index.replicas if self.index is not None else {}

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        if not endpoints:
            return []
        # (Only C-level maps over the endpoints, as few as can be: at 1,000 endpoints each
        # costs 0.02 ms, a generator or a comprehension 0.05 ms or more.)
        keys = list(map(_key, endpoints))
        publishing = self.publishing().__contains__
        publishes = None if all(map(publishing, keys)) else list(map(publishing, keys))
        if publishes is not None and not any(publishes):
            return self._fallback(ctx, endpoints)
        scores = self.scores(ctx, endpoints)
        if not scores:  # not tokenized, or held nowhere: where the fallback sent it (docstring)
            return self._fallback(ctx, endpoints)
        soon = ctx.cache.get(PENDING)
        if soon:  # which replicas run the request at once, to count the blocks on their way
            waiting = list(compress(endpoints, map(soon.__contains__, keys)))
            queues = queue_estimates(waiting, ctx.staleness, ctx.now)
            ctx.cache[ARRIVING] = {
                e.key: soon[e.key] for e, queue in zip(waiting, queues, strict=True) if queue < 1
            }
        if publishes is None:
            return list(map(scores.get, keys, repeat(0.0)))
        approximate = self._fallback(ctx, endpoints)
        return [
            scores.get(k, 0.0) if p else a
            for k, p, a in zip(keys, publishes, approximate, strict=True)
        ]

    def favoured(
        self, ctx: SchedulingContext, endpoints: Sequence[EndpointState], k: int
    ) -> list[EndpointState]:
        """The candidates holding most of the request's blocks (``Profile.sample``), and those
        the fallback favours where some candidate does not publish."""
        publishing = self.publishing()
        scores = self.scores(ctx, endpoints) if endpoints and publishing else None
        chosen = best(endpoints, scores, k) if scores else []
        if self.fallback is not None and (
            not scores or not all(map(publishing.__contains__, map(_key, endpoints)))
        ):
            chosen += self.fallback.favoured(ctx, endpoints, k)
        return chosen

    def _fallback(self, ctx: SchedulingContext, endpoints: Sequence[EndpointState]) -> list[float]:
        if self.fallback is None:
            return [0.0] * len(endpoints)
        return self.fallback.score(ctx, endpoints)


def predicted_cached_tokens(
    ctx: SchedulingContext, replica: str, on_the_way: bool = True
) -> int | None:
    """The prompt tokens ``replica`` will hold for this request when it is admitted there, as
    the router believes (the access log's ``cached_tokens_predicted``): the leading run of its
    blocks the index says the replica holds or, where longer and the replica has no queue
    (``ARRIVING``), the run of blocks on their way there (sent with earlier requests, not
    reported yet; not counted with ``on_the_way`` false). Where no
    precise prediction was made (no replica of the model publishes events, the request was not
    tokenized, the profile has no precise scorer), the approximate index's estimate (its
    matched bytes / ``BYTES_PER_TOKEN``); None when neither scored."""
    tokens = ctx.cache.get(PREDICTED)
    if tokens is not None:
        held = tokens.get(replica, 0)
        if on_the_way:
            soon = ctx.cache.get(ARRIVING)
            if soon:
                return max(held, soon.get(replica, 0))
        return held
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
