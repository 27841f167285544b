"""``RateLimiter``: the request hook that reserves requests and tokens before scheduling and
settles them with the engine's usage afterwards (see the package docstring), and its 429."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.hooks import Reservation, Usage
from llmplane.gateway.http_server import Response
from llmplane.gateway.observability import Counter
from llmplane.gateway.protocols import generates
from llmplane.gateway.ratelimit.buckets import (
    BucketState,
    TokenBucket,
    duration,
    rate_headers,
    reserve_local,
    retry_after,
    settle_deltas,
)
from llmplane.gateway.ratelimit.limits import (
    BUDGET,
    OUTPUT,
    REQUESTS,
    RouteLimit,
    output_reservation,
    route_limits,
    tenant_limits,
)
from llmplane.gateway.ratelimit.redis_store import RedisBuckets
from llmplane.gateway.ratelimit.usage_filter import ask_stream_usage
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.tokens import TokenCounter

if TYPE_CHECKING:
    from llmplane.gateway.config import GatewayConfig
    from llmplane.gateway.context import RequestContext

log = logging.getLogger("llmplane.gateway")

FAILURE_POLICIES = ("open", "local", "closed")


class RateLimitError(GatewayError):
    """429 in OpenAI's shape: ``{"error": {"message", "type": "tokens" | "requests",
    "param": null, "code": "rate_limit_exceeded"}}`` with ``Retry-After`` (whole seconds,
    rounded up) and the ``x-ratelimit-*`` headers."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None,
        headers: dict[str, str],
        kind: str = "tokens",
    ) -> None:
        super().__init__(429, message, ErrorCode.RATE_LIMIT_EXCEEDED, retry_after=retry_after)
        self.headers = headers
        self.kind = kind

    @property
    def type(self) -> str:
        return self.kind

    def response(self) -> Response:
        response = super().response()
        response.headers.update(self.headers)
        if self.retry_after is not None:
            response.headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        return response


@dataclass(slots=True)
class Taken:
    """What one limit (a route's or a tenant's) took for a request."""

    limit: RouteLimit
    mode: str  # local | redis | none (Redis failed, admitted without a reservation)
    amounts: list[tuple[str, int]]


class LimitReservation(Reservation):
    """What ``reserve`` took, per limit (the gateway applies its ``response_headers`` and
    its ``stream_filter``, see ``llmplane.gateway.hooks``)."""

    __slots__ = ("taken",)

    def __init__(self, taken: list[Taken], response_headers: dict[str, str]) -> None:
        super().__init__(response_headers)
        self.taken = taken


def _what(direction: str) -> str:
    if direction == REQUESTS:
        return "requests"
    if direction == BUDGET:
        return "tokens (input + output, the token budget)"
    return f"{direction} tokens"


class RateLimiter:
    """The ``RequestHook`` enforcing ModelRoute and Tenant rate limits (the gateway installs
    one and calls ``update`` with the store objects whenever they change). A request of a
    tenant on a limited route takes from both, or from neither."""

    def __init__(
        self,
        config: GatewayConfig,
        clock: Callable[[], float] = time.monotonic,
        make_bucket: Callable[[str, float, float, float], TokenBucket] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        # (key, rate, burst, now) -> a bucket; with several workers one they all share.
        self.make_bucket = make_bucket or (
            lambda key, rate, burst, now: TokenBucket(rate, burst, now)
        )
        self.limits: dict[str, RouteLimit] = {}  # ModelRoute ref -> limit
        self.tenant_limits: dict[str, RouteLimit] = {}  # tenant name -> limit
        self.local: dict[tuple[str, str], TokenBucket] = {}  # by (limit key, direction)
        self.redis: dict[str, RedisBuckets] = {}  # by address
        self.counter = TokenCounter(config.rate_limit_tokenizers)
        self.policy = config.rate_limit_redis_failure
        if self.policy not in FAILURE_POLICIES:
            raise ValueError(
                f"rateLimitRedisFailure: {self.policy!r} is not one of {FAILURE_POLICIES}"
            )
        self._tasks: set[asyncio.Task[None]] = set()
        self.rejections = Counter(
            "llmplane_ratelimit_rejections",
            "Requests refused by a rate limit (route: the ModelRoute or Tenant; reason: "
            "exhausted = retry later, too_large = can never fit)",
            ("route", "direction", "reason"),
        )
        self.redis_errors = Counter(
            "llmplane_ratelimit_redis_errors",
            "Failed or timed-out Redis calls of global rate limits",
            ("op",),
        )
        self.degraded = Counter(
            "llmplane_ratelimit_degraded",
            "Requests decided by the Redis failure policy (open, local, closed)",
            ("route", "policy"),
        )

    def metrics(self) -> list[Counter]:
        return [self.rejections, self.redis_errors, self.degraded]

    def update(self, objects: Iterable[dict[str, Any]]) -> None:
        """New store objects: re-read every ModelRoute's and Tenant's rateLimit. A changed
        limit keeps the bucket's level (capped at the new burst)."""
        objects = list(objects)
        self.limits = route_limits(objects)
        self.tenant_limits = tenant_limits(objects)
        live = set()
        for limit in [*self.limits.values(), *self.tenant_limits.values()]:
            for direction, tokens in limit.tokens.items():
                live.add((limit.key, direction))
                bucket = self.local.get((limit.key, direction))
                if bucket is not None:
                    bucket.rate, bucket.burst = limit.rate(direction), tokens
        self.local = {key: bucket for key, bucket in self.local.items() if key in live}

    def _bucket(self, limit: RouteLimit, direction: str) -> TokenBucket:
        bucket = self.local.get((limit.key, direction))
        if bucket is None:
            bucket = self.local[(limit.key, direction)] = self.make_bucket(
                f"{limit.key}\n{direction}",
                limit.rate(direction),
                limit.limit(direction) or 0,
                self.clock(),
            )
        return bucket

    def _redis(self, address: str) -> RedisBuckets:
        client = self.redis.get(address)
        if client is None:
            c = self.config
            client = self.redis[address] = RedisBuckets(
                address,
                c.rate_limit_redis_timeout,
                c.rate_limit_redis_retry_interval,
                c.rate_limit_redis_max_connections,
            )
        return client

    def applicable(self, tenant: str | None, route: str) -> list[RouteLimit]:
        """The tenant's limit, then the route's (either may be missing)."""
        found = [self.tenant_limits.get(tenant)] if tenant is not None else []
        found.append(self.limits.get(route.partition("#")[0]))
        return [limit for limit in found if limit is not None]

    async def reserve(self, ctx: RequestContext) -> LimitReservation | None:
        """Take the request's amounts from the tenant's and the route's limit, from both or
        from neither (429 when one has not enough)."""
        inference, decision = ctx.inference, ctx.decision
        assert inference is not None and decision is not None
        limits = self.applicable(ctx.tenant_name, decision.route)
        if not limits:
            return None
        taken: list[Taken] = []
        states: list[BucketState] = []
        try:
            for limit, amounts in self._amounts(inference, decision.model, limits):
                mode, ok, part_states = await self._take(limit, amounts)
                if not ok:
                    raise self._exhausted(inference, limit, amounts, part_states)
                taken.append(Taken(limit, mode, amounts))
                states += part_states
        except BaseException:
            for part in taken:  # another limit refused: what the earlier ones took goes back
                self._apply(part, [(d, a) for d, a in part.amounts if a])
            raise
        if not taken:
            return None
        reservation = LimitReservation(taken, rate_headers(states))
        if inference.stream and any(d != REQUESTS for part in taken for d, _ in part.amounts):
            # Limited tokens of a stream: ask the engine for its usage (settled afterwards);
            # the usage-only chunk is then kept from a client that did not ask for it.
            reservation.stream_filter = ask_stream_usage(inference)
        return reservation

    def _amounts(
        self, inference: InferenceRequest, model: str, limits: list[RouteLimit]
    ) -> list[tuple[RouteLimit, list[tuple[str, int]]]]:
        """What each limit takes, as (direction, amount) pairs (limits taking nothing left
        out); the 429 of an amount larger than its bucket (it could never fit), before
        anything is taken. An embedding takes no output tokens; the input is counted once."""
        doc = inference.doc
        generating = generates(inference.path)  # not embeddings, count_tokens, tokenize
        counted = functools.cache(lambda: self.counter.count(doc, model, inference.model))
        default = self.config.rate_limit_default_output_tokens
        parts = []
        for limit in limits:
            amounts = []
            for direction, tokens in limit.tokens.items():
                if direction == REQUESTS:
                    amount = 1
                elif direction == OUTPUT:
                    if not generating:
                        continue
                    amount = output_reservation(doc, default, tokens)
                else:
                    amount = counted()
                    if direction == BUDGET and generating:
                        amount += output_reservation(doc, default, tokens)
                if amount > tokens:
                    raise self._too_large(inference, limit, direction, amount)
                amounts.append((direction, amount))
            if amounts:
                parts.append((limit, amounts))
        return parts

    async def _take(
        self, limit: RouteLimit, amounts: list[tuple[str, int]]
    ) -> tuple[str, bool, list[BucketState]]:
        """Reserve every amount or none: (mode, admitted, the buckets' states). A limit in
        Redis is awaited; when Redis fails the policy decides."""
        if limit.redis is not None:
            client = self._redis(limit.redis)
            if client.available(self.clock()):
                try:
                    return "redis", *await client.reserve(limit, amounts)
                except Exception as err:  # RedisError, OSError, TimeoutError
                    self._redis_failed(client, "reserve", err)
            self.degraded.labels(limit.ref, self.policy).inc()
            if self.policy == "closed":
                raise GatewayError(
                    503,
                    f"the rate limit of {limit.ref} cannot be checked (Redis at "
                    f"{limit.redis} is unreachable); retry later",
                    ErrorCode.RATE_LIMIT_UNAVAILABLE,
                    retry_after=client.retry_interval,
                )
            if self.policy == "open":
                return "none", True, []
        buckets = [(d, self._bucket(limit, d), a) for d, a in amounts]
        return "local", *reserve_local(buckets, self.clock())

    def _redis_failed(self, client: RedisBuckets, op: str, err: BaseException) -> None:
        self.redis_errors.labels(op).inc()
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

    def _too_large(
        self, inference: InferenceRequest, limit: RouteLimit, direction: str, amount: int
    ) -> RateLimitError:
        """The 429 without Retry-After of an amount larger than its bucket (counted)."""
        self.rejections.labels(limit.ref, direction, "too_large").inc()
        tokens = limit.tokens[direction]
        state = BucketState(direction, tokens, limit.rate(direction), tokens)
        reduce = " (max_tokens, prompts or n)" if direction in (OUTPUT, BUDGET) else ""
        return RateLimitError(
            f"Request too large for model {inference.model!r} on {_what(direction)} "
            f"per {limit.unit_of(direction)} ({limit.ref}): Limit {tokens}, Requested "
            f"{amount}. The tokens{reduce} must be reduced for this request to ever "
            "be admitted.",
            retry_after=None,
            headers=rate_headers([state], state),
        )

    def _exhausted(
        self,
        inference: InferenceRequest,
        limit: RouteLimit,
        amounts: list[tuple[str, int]],
        states: list[BucketState],
    ) -> RateLimitError:
        """The 429 of a reservation that did not fit now (counted per blocking direction)."""
        blocking = max(states, key=lambda s: s.wait)
        for s in states:
            if s.wait > 0:
                self.rejections.labels(limit.ref, s.direction, "exhausted").inc()
        used = max(0, blocking.limit - blocking.remaining)
        where = f"model {inference.model!r} on " if limit.ref.startswith("ModelRoute/") else ""
        return RateLimitError(
            f"Rate limit reached for {where}{_what(blocking.direction)} per "
            f"{limit.unit_of(blocking.direction)} ({limit.ref}): Limit {blocking.limit}, Used "
            f"{used}, Requested {dict(amounts)[blocking.direction]}. Please try again in "
            f"{duration(blocking.wait)}.",
            retry_after=retry_after(states),
            headers=rate_headers(states, blocking),
            kind="requests" if blocking.direction == REQUESTS else "tokens",
        )

    def settle(
        self, ctx: RequestContext, reservation: LimitReservation | None, usage: Usage | None
    ) -> None:
        """Give back what the request did not use, debit what it used beyond its reservation
        (never waits: Redis settles in a task)."""
        if reservation is None:
            return
        prompt = usage.prompt_tokens if usage is not None else None
        completion = usage.completion_tokens if usage is not None else None
        for part in reservation.taken:
            deltas = settle_deltas(part.amounts, prompt, completion, ctx.status)
            if deltas:
                self._apply(part, deltas)

    def _apply(self, part: Taken, deltas: list[tuple[str, int]]) -> None:
        """Give back (> 0) or debit (< 0) tokens of what ``part`` took."""
        if part.mode == "local":
            now = self.clock()
            for direction, delta in deltas:
                self._bucket(part.limit, direction).adjust(delta, now)
        elif part.mode == "redis":  # off the response path (the client does not wait for it)
            task = asyncio.ensure_future(self._settle_redis(part.limit, deltas))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _settle_redis(self, limit: RouteLimit, deltas: list[tuple[str, int]]) -> None:
        assert limit.redis is not None
        client = self._redis(limit.redis)
        try:
            await client.settle(limit, deltas)
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
