"""``RateLimiter``: the request hook that reserves tokens before scheduling and settles them
with the engine's usage afterwards (see the package docstring)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Counter

from llmplane.gateway.errors import GatewayError
from llmplane.gateway.hooks import Reservation as HookReservation
from llmplane.gateway.hooks import Usage
from llmplane.gateway.ratelimit.buckets import (
    BucketState,
    TokenBucket,
    duration,
    rate_headers,
    reserve_local,
    retry_after,
    settle_deltas,
)
from llmplane.gateway.ratelimit.error import RateLimitError
from llmplane.gateway.ratelimit.limits import (
    INPUT,
    OUTPUT,
    RouteLimit,
    output_reservation,
    route_limits,
)
from llmplane.gateway.ratelimit.redis_store import RedisBuckets, redis_key
from llmplane.gateway.ratelimit.usage_filter import UsageChunkFilter, inject_include_usage
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.routing import Decision
from llmplane.gateway.tokens import TokenCounter

log = logging.getLogger("llmplane.gateway")

FAILURE_POLICIES = ("open", "local", "closed")

# attribute -> (metric name, help, label names)
# fmt: off
_METRICS = {
    "rejections": ("llmplane_ratelimit_rejections", "Requests refused by a token rate limit (reason: exhausted = retry later, too_large = can never fit)", ("route", "direction", "reason")),
    "redis_errors": ("llmplane_ratelimit_redis_errors", "Failed or timed-out Redis calls of global rate limits", ("op",)),
    "degraded": ("llmplane_ratelimit_degraded", "Requests decided by the Redis failure policy (open, local, closed)", ("route", "policy")),
}
# fmt: on


class Reservation(HookReservation):
    """What ``reserve`` took (the gateway applies its ``response_headers`` and
    ``stream_filter``, see ``llmplane.gateway.hooks``)."""

    __slots__ = ("amounts", "limit", "mode")

    def __init__(
        self,
        limit: RouteLimit,
        mode: str,
        amounts: list[tuple[str, int]],
        response_headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(response_headers)
        self.limit = limit
        self.mode = mode  # local | redis | none (Redis failed, admitted without a reservation)
        self.amounts = amounts


class RateLimiter:
    """The ``RequestHook`` enforcing ModelRoute rate limits (the gateway installs one and
    calls ``update`` with the store objects whenever they change)."""

    def __init__(
        self,
        config: Any,
        registry: Any = None,
        clock: Callable[[], float] = time.monotonic,
        make_bucket: Callable[[str, float, float, float], TokenBucket] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        # (key, rate, burst, now) -> a bucket; with several workers one they all share.
        self.make_bucket = make_bucket or (
            lambda key, rate, burst, now: TokenBucket(rate, burst, now)
        )
        self.limits: dict[str, RouteLimit] = {}
        self.local: dict[tuple[str, str], TokenBucket] = {}
        self.redis: dict[str, RedisBuckets] = {}
        self.counter = TokenCounter(getattr(config, "rate_limit_tokenizers", None))
        self.policy = getattr(config, "rate_limit_redis_failure", "open")
        if self.policy not in FAILURE_POLICIES:
            raise ValueError(
                f"rateLimitRedisFailure: {self.policy!r} is not one of {FAILURE_POLICIES}"
            )
        self._tasks: set[asyncio.Task[None]] = set()
        self._children: dict[tuple[Any, ...], Any] = {}
        self.rejections = self.redis_errors = self.degraded = None
        if registry is not None:
            for attribute, (name, doc, labels) in _METRICS.items():
                setattr(self, attribute, Counter(name, doc, labels, registry=registry))

    # --- configuration ---------------------------------------------------------------------

    def update(self, objects: Iterable[dict[str, Any]]) -> None:
        """New store objects: re-read every ModelRoute's rateLimit. A changed limit keeps
        the bucket's level (capped at the new burst)."""
        self.limits = route_limits(objects)
        for limit in self.limits.values():
            for direction, tokens in limit.tokens:
                bucket = self.local.get((limit.key, direction))
                if bucket is not None:
                    bucket.rate = tokens / limit.period
                    bucket.burst = tokens
        live = {(lim.key, d) for lim in self.limits.values() for d, _ in lim.tokens}
        for key in [k for k in self.local if k not in live]:
            del self.local[key]

    def _count(self, metric: Any, *labels: str) -> None:
        if metric is None:
            return
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        child.inc()

    def _bucket(self, limit: RouteLimit, direction: str, tokens: int) -> TokenBucket:
        bucket = self.local.get((limit.key, direction))
        if bucket is None:
            bucket = self.local[(limit.key, direction)] = self.make_bucket(
                f"{limit.key}\n{direction}", tokens / limit.period, tokens, self.clock()
            )
        return bucket

    def _redis(self, address: str) -> RedisBuckets:
        client = self.redis.get(address)
        if client is None:
            c = self.config
            client = self.redis[address] = RedisBuckets(
                address,
                getattr(c, "rate_limit_redis_timeout", 0.25),
                getattr(c, "rate_limit_redis_retry_interval", 1.0),
                getattr(c, "rate_limit_redis_max_connections", 64),
            )
        return client

    # --- the hook ----------------------------------------------------------------------------

    async def reserve(self, inference: InferenceRequest, decision: Decision) -> Reservation | None:
        if not self.limits:
            return None
        ref = decision.route.partition("#")[0]
        limit = self.limits.get(ref)
        if limit is None:
            return None
        doc = inference.doc
        embeddings = inference.path.endswith("/embeddings")
        amounts: list[tuple[str, int]] = []
        for direction, tokens in limit.tokens:
            if direction == INPUT:
                amount = self.counter.count(doc, decision.model, inference.model)
            elif embeddings:
                continue
            else:
                amount = output_reservation(
                    doc, getattr(self.config, "rate_limit_default_output_tokens", 256), tokens
                )
            if amount > tokens:
                self._count(self.rejections, ref, direction, "too_large")
                state = BucketState(direction, tokens, tokens / limit.period, tokens)
                raise RateLimitError(
                    f"Request too large for model {inference.model!r} on {direction} tokens per "
                    f"{limit.unit} ({ref}): Limit {tokens}, Requested {amount}. The "
                    f"{direction} tokens{' (max_tokens)' if direction == OUTPUT else ''} must be "
                    "reduced for this request to ever be admitted.",
                    retry_after=None,
                    headers=rate_headers([state], state),
                )
            amounts.append((direction, amount))
        if not amounts:
            return None
        if limit.redis is not None:
            reservation = await self._reserve_redis(inference, limit, amounts)
        else:
            reservation = self._reserve_local(inference, limit, amounts)
        if inference.stream and not embeddings and inject_include_usage(doc):
            inference.mark_dirty()
            reservation.stream_filter = UsageChunkFilter()
        return reservation

    def _reserve_local(
        self, inference: InferenceRequest, limit: RouteLimit, amounts: list[tuple[str, int]]
    ) -> Reservation:
        buckets = [(d, self._bucket(limit, d, limit.limit(d) or 0), a) for d, a in amounts]
        ok, states = reserve_local(buckets, self.clock())
        return self._decide(inference, limit, "local", amounts, ok, states)

    async def _reserve_redis(
        self, inference: InferenceRequest, limit: RouteLimit, amounts: list[tuple[str, int]]
    ) -> Reservation:
        assert limit.redis is not None
        client = self._redis(limit.redis)
        keys, args, limits = [], [], []
        for direction, amount in amounts:
            tokens = limit.limit(direction) or 0
            keys.append(redis_key(limit, direction))
            args += [tokens / limit.period, tokens, amount]
            limits.append(tokens)
        now = self.clock()
        if client.available(now):
            try:
                ok, pairs = await client.reserve(keys, args)
            except Exception as err:  # RedisError, OSError, TimeoutError: the policy decides
                self._redis_failed(client, "reserve", err)
            else:
                states = [
                    BucketState(d, n, n / limit.period, level, wait)
                    for (d, _), n, (level, wait) in zip(amounts, limits, pairs, strict=True)
                ]
                return self._decide(inference, limit, "redis", amounts, ok, states)
        self._count(self.degraded, limit.ref, self.policy)
        if self.policy == "local":
            return self._reserve_local(inference, limit, amounts)
        if self.policy == "closed":
            raise GatewayError(
                503,
                f"the token rate limit of {limit.ref} cannot be checked (Redis at "
                f"{limit.redis} is unreachable); retry later",
                "rate_limit_unavailable",
                retry_after=client.retry_interval,
            )
        return Reservation(limit, "none", amounts)

    def _redis_failed(self, client: RedisBuckets, op: str, err: BaseException) -> None:
        self._count(self.redis_errors, op)
        if client.available(self.clock()):
            log.warning(
                "rate limits: Redis %s %s failed (%s: %s); policy %s for %.1f s",
                client.address,
                op,
                type(err).__name__,
                err,
                self.policy,
                client.retry_interval,
            )
        client.failed(self.clock())

    def _decide(
        self,
        inference: InferenceRequest,
        limit: RouteLimit,
        mode: str,
        amounts: list[tuple[str, int]],
        ok: bool,
        states: list[BucketState],
    ) -> Reservation:
        if ok:
            return Reservation(limit, mode, amounts, rate_headers(states))
        blocking = max(states, key=lambda s: s.wait)
        for s in states:
            if s.wait > 0:
                self._count(self.rejections, limit.ref, s.direction, "exhausted")
        wait = retry_after(states)
        asked = dict(amounts)
        used = max(0, blocking.limit - blocking.remaining)
        raise RateLimitError(
            f"Rate limit reached for model {inference.model!r} on {blocking.direction} tokens "
            f"per {limit.unit} ({limit.ref}): Limit {blocking.limit}, Used {used}, Requested "
            f"{asked[blocking.direction]}. Please try again in {duration(blocking.wait)}.",
            retry_after=wait,
            headers=rate_headers(states, blocking),
        )

    async def settle(
        self,
        inference: InferenceRequest,
        decision: Decision,
        reservation: Reservation | None,
        usage: Usage | None,
        status: int,
    ) -> None:
        if reservation is None or reservation.mode == "none":
            return
        prompt = completion = None
        if usage is not None:
            prompt, completion = usage.prompt_tokens, usage.completion_tokens
        deltas = settle_deltas(reservation.amounts, prompt, completion, status)
        if not deltas:
            return
        limit = reservation.limit
        if reservation.mode == "local":
            now = self.clock()
            for direction, delta in deltas:
                self._bucket(limit, direction, limit.limit(direction) or 0).adjust(delta, now)
            return
        # Redis: off the response path (the client does not wait for it).
        task = asyncio.ensure_future(self._settle_redis(limit, deltas))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle_redis(self, limit: RouteLimit, deltas: list[tuple[str, int]]) -> None:
        assert limit.redis is not None
        client = self._redis(limit.redis)
        keys, args = [], []
        for direction, delta in deltas:
            tokens = limit.limit(direction) or 0
            keys.append(redis_key(limit, direction))
            args += [tokens / limit.period, tokens, delta]
        try:
            await client.settle(keys, args)
        except Exception as err:
            self._redis_failed(client, "settle", err)

    async def drain(self) -> None:
        """Wait for the Redis settlements still running."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        await self.drain()
        for client in self.redis.values():
            try:
                await client.close()
            except Exception:  # closing a pool whose server is gone
                log.debug("rate limits: closing Redis %s", client.address, exc_info=True)
        self.redis.clear()
