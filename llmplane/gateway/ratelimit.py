"""Token rate limits for Kthena ``ModelRoute.spec.rateLimit`` (a request hook).

One token bucket per ModelRoute (namespace/name) and direction (input, output): rate =
limit / unit, burst = limit, unit second | minute | hour | day | month (30 days). Without
``global`` the buckets live in this process (monotonic clock); with ``global.redis`` they
live in Redis and every gateway process shares them: reserve and settle are Lua scripts,
atomic over both directions, timed by Redis ``TIME`` (never a gateway's clock).

A request on a limited route:

1. **reserve** (before scheduling): input tokens counted by ``llmplane.gateway.tokens``
   (the model's tokenizer, else ``ceil(chars / 4)``); output tokens reserved up to
   ``max_completion_tokens`` / ``max_tokens`` times ``n`` (without either:
   ``rate_limit_default_output_tokens``, never more than the bucket). Both buckets are taken
   together or not at all. A reservation larger than a bucket can never fit: 429 at once,
   without ``Retry-After``. Otherwise, when it does not fit now: 429 with ``Retry-After``
   (whole seconds until it would fit) and OpenAI's ``x-ratelimit-*-tokens`` headers.
   Streams get ``stream_options.include_usage=true`` when the client did not ask for usage,
   and the usage-only chunk is then removed from what the client receives.
2. **settle** (after the response): the engine's ``usage`` replaces the reservation in both
   directions: unused tokens go back, overuse is debited (the bucket may go below zero and
   later requests wait longer). A failed request (4xx/5xx, no usage) gets everything back;
   a successful response without usage, or a client that went away, keeps the reservation.

Redis unreachable (errors and timeouts are counted in ``llmplane_ratelimit_redis_errors_total``;
the client reconnects lazily, each call is bounded by ``rate_limit_redis_timeout`` and after a
failure Redis is not asked again for ``rate_limit_redis_retry_interval``):
``rate_limit_redis_failure`` = ``open`` (default: admit unlimited), ``local`` (this process's
own buckets) or ``closed`` (503 with Retry-After).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from llmplane.api.kthena import UNIT_SECONDS, RateLimit, split_host_port
from llmplane.gateway.errors import GatewayError
from llmplane.gateway.hooks import Reservation as HookReservation
from llmplane.gateway.http_server import Response
from llmplane.gateway.tokens import TokenCounter

log = logging.getLogger("llmplane.gateway")

INPUT = "input"
OUTPUT = "output"
FAILURE_POLICIES = ("open", "local", "closed")


# --- limits ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouteLimit:
    """A ModelRoute's rateLimit: tokens per ``period`` seconds in each limited direction."""

    ref: str  # ModelRoute/namespace/name (what Decision.route starts with)
    key: str  # namespace/name
    tokens: tuple[tuple[str, int], ...]  # (direction, tokens per unit), limited ones only
    unit: str
    period: float
    redis: str | None = None  # host:port of global.redis

    def limit(self, direction: str) -> int | None:
        for d, n in self.tokens:
            if d == direction:
                return n
        return None


def route_limits(objects: Iterable[dict[str, Any]]) -> dict[str, RouteLimit]:
    """ModelRoute ref -> its limit, for the routes in ``objects`` with a valid rateLimit."""
    limits: dict[str, RouteLimit] = {}
    for obj in objects:
        if obj.get("kind") != "ModelRoute":
            continue
        spec = obj.get("spec") or {}
        raw = spec.get("rateLimit") if isinstance(spec, dict) else None
        if not raw:
            continue
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        key = f"{namespace}/{meta.get('name')}"
        try:
            rl = RateLimit.model_validate(raw)
        except Exception as err:
            log.warning("rate limits: ModelRoute/%s: invalid rateLimit ignored: %s", key, err)
            continue
        tokens = tuple(
            (d, n)
            for d, n in ((INPUT, rl.input_tokens_per_unit), (OUTPUT, rl.output_tokens_per_unit))
            if n
        )
        if not tokens:
            continue
        redis = rl.global_.redis.address if rl.global_ and rl.global_.redis else None
        limits[f"ModelRoute/{key}"] = RouteLimit(
            ref=f"ModelRoute/{key}",
            key=key,
            tokens=tokens,
            unit=rl.unit,
            period=float(UNIT_SECONDS[rl.unit]),
            redis=redis,
        )
    return limits


# --- the bucket (local), and what both kinds report --------------------------------------------


class TokenBucket:
    """``burst`` tokens at most, refilled at ``rate`` per second. ``level`` may go below zero
    after an overuse debit: requests then wait until it has refilled far enough."""

    __slots__ = ("burst", "level", "rate", "stamp")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.level = float(burst)
        self.stamp = now

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
            self.stamp = now
        elif self.level > self.burst:  # the limit was lowered
            self.level = float(self.burst)

    def wait(self, amount: float) -> float:
        """Seconds until ``amount`` tokens are there (0 now); call ``refill`` first."""
        return 0.0 if self.level >= amount else (amount - self.level) / self.rate

    def adjust(self, delta: float, now: float) -> None:
        """Give back (``delta`` > 0, up to the burst) or debit (< 0, may go negative)."""
        self.refill(now)
        self.level = min(float(self.burst), self.level + delta)

    def state(self, direction: str, wait: float = 0.0) -> BucketState:
        return BucketState(direction, int(self.burst), self.rate, self.level, wait)


@dataclass(frozen=True)
class BucketState:
    direction: str
    limit: int  # the burst: tokens per unit
    rate: float  # tokens per second
    level: float  # tokens available now (after this reservation when it was admitted)
    wait: float = 0.0  # seconds until the request's amount fits (0: it did)

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.level))

    @property
    def reset(self) -> float:
        """Seconds until the bucket is full again (OpenAI's ``x-ratelimit-reset-tokens``)."""
        return max(0.0, (self.limit - self.level) / self.rate)


def reserve_local(
    buckets: list[tuple[str, TokenBucket, int]], now: float
) -> tuple[bool, list[BucketState]]:
    """Take every amount or none: (admitted, the buckets' states)."""
    for _, bucket, _ in buckets:
        bucket.refill(now)
    waits = [bucket.wait(amount) for _, bucket, amount in buckets]
    ok = all(w == 0.0 for w in waits)
    if ok:
        for _, bucket, amount in buckets:
            bucket.level -= amount
    return ok, [b.state(d, w) for (d, b, _), w in zip(buckets, waits, strict=True)]


def retry_after(states: Iterable[BucketState]) -> int:
    """Whole seconds until the reservation fits in every bucket (at least 1)."""
    return max(1, math.ceil(max((s.wait for s in states), default=0.0) - 1e-9))


def duration(seconds: float) -> str:
    """OpenAI's (Go's) duration format for ``x-ratelimit-reset-tokens``: ``250ms``, ``6s``,
    ``1.5s``, ``6m0s``, ``2h3m4s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours >= 1:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes >= 1:
        return f"{int(minutes)}m{text}"
    return text


def rate_headers(states: list[BucketState], main: BucketState | None = None) -> dict[str, str]:
    """``x-ratelimit-{limit,remaining,reset}-tokens`` for ``main`` (by default the direction
    with the smallest share left) and the same with ``-input`` / ``-output`` per direction."""
    if not states:
        return {}
    if main is None:
        main = min(states, key=lambda s: s.level / s.limit)
    headers = {
        "x-ratelimit-limit-tokens": str(main.limit),
        "x-ratelimit-remaining-tokens": str(main.remaining),
        "x-ratelimit-reset-tokens": duration(main.reset),
    }
    for s in states:
        headers[f"x-ratelimit-limit-tokens-{s.direction}"] = str(s.limit)
        headers[f"x-ratelimit-remaining-tokens-{s.direction}"] = str(s.remaining)
        headers[f"x-ratelimit-reset-tokens-{s.direction}"] = duration(s.reset)
    return headers


# --- the 429 ------------------------------------------------------------------------------------


class RateLimitError(GatewayError):
    """429 in OpenAI's shape for token limits: ``{"error": {"message", "type": "tokens",
    "param": null, "code": "rate_limit_exceeded"}}`` with ``Retry-After`` (whole seconds,
    rounded up) and the ``x-ratelimit-*`` headers."""

    def __init__(self, message: str, *, retry_after: float | None, headers: dict[str, str]) -> None:
        super().__init__(429, message, "rate_limit_exceeded", retry_after=retry_after)
        self.headers = headers

    @property
    def type(self) -> str:
        return "tokens"

    def body(self) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": None,
                    "code": self.code,
                }
            }
        )

    def response(self) -> Response:
        headers = dict(self.headers)
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        return Response(
            status=429, body=self.body(), content_type="application/json", headers=headers
        )


# --- streams: drop the usage chunk the client did not ask for -----------------------------------

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_USAGE = b'"usage"'


def _usage_only(event: bytes) -> bool:
    """An SSE event whose data is ``{..., "choices": [], "usage": {...}}``."""
    data = b"".join(
        line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")
    )
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(doc, dict) and doc.get("choices") == [] and isinstance(doc.get("usage"), dict)


class UsageChunkFilter:
    """Relays an SSE stream byte for byte except the usage-only event (injected
    ``include_usage``). Complete events go out at once; only an incomplete trailing event is
    held until its end arrives (``flush`` at the end of the stream releases it)."""

    __slots__ = ("dropped", "tail")

    def __init__(self) -> None:
        self.tail = b""
        self.dropped = 0

    def feed(self, chunk: bytes) -> bytes:
        buf = self.tail + chunk if self.tail else chunk
        if buf.endswith(b"\n\n"):
            end = len(buf)
        else:
            end = -1
            for m in _BOUNDARY.finditer(buf):
                end = m.end()
            if end == -1:
                self.tail = buf
                return b""
        self.tail = buf[end:]
        complete = buf[:end] if end != len(buf) else buf
        if _USAGE not in complete:
            return complete
        out = []
        start = 0
        for m in _BOUNDARY.finditer(complete):
            event = complete[start : m.end()]
            start = m.end()
            if _USAGE in event and _usage_only(event):
                self.dropped += 1
                continue
            out.append(event)
        return b"".join(out)

    def flush(self) -> bytes:
        tail, self.tail = self.tail, b""
        return tail


def wants_usage(doc: dict[str, Any]) -> bool:
    opts = doc.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


def inject_include_usage(doc: dict[str, Any]) -> bool:
    """Turn on ``stream_options.include_usage``; True if the doc was changed (the client did
    not ask for usage, so the usage chunk must be removed from its stream)."""
    if wants_usage(doc):
        return False
    opts = doc.get("stream_options")
    doc["stream_options"] = (
        {**opts, "include_usage": True} if isinstance(opts, dict) else {"include_usage": True}
    )
    return True


def output_reservation(doc: dict[str, Any], default: int, burst: int) -> int:
    """``max_completion_tokens`` (else ``max_tokens``) times ``n``; without either the default,
    capped at the bucket (the actual output is settled afterwards anyway)."""
    n = doc.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1
    for key in ("max_completion_tokens", "max_tokens"):
        value = doc.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value * choices
    return min(default * choices, burst)


# --- Redis ----------------------------------------------------------------------------------------

# KEYS: one hash per limited direction. ARGV: rate, burst, amount for each key.
# Takes every amount or none. Returns {admitted, level_1, wait_1, level_2, wait_2, ...}.
RESERVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local levels = {}
local ok = 1
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[3 * i - 2])
  local burst = tonumber(ARGV[3 * i - 1])
  local want = tonumber(ARGV[3 * i])
  local v = redis.call('HMGET', key, 'level', 'stamp')
  local level = tonumber(v[1])
  local stamp = tonumber(v[2])
  if level == nil or stamp == nil then
    level = burst
  elseif now > stamp then
    level = math.min(burst, level + (now - stamp) * rate)
  else
    level = math.min(burst, level)
  end
  levels[i] = level
  if level < want then ok = 0 end
end
local out = {tostring(ok)}
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[3 * i - 2])
  local burst = tonumber(ARGV[3 * i - 1])
  local want = tonumber(ARGV[3 * i])
  local level = levels[i]
  local wait = 0
  if level < want then wait = (want - level) / rate end
  if ok == 1 then
    level = level - want
    redis.call('HSET', key, 'level', string.format('%.17g', level),
               'stamp', string.format('%.17g', now))
    redis.call('PEXPIRE', key, math.ceil((burst - level) / rate * 1000) + 1000)
  end
  out[2 * i] = string.format('%.17g', level)
  out[2 * i + 1] = string.format('%.17g', wait)
end
return out
"""

# KEYS: one hash per direction. ARGV: rate, burst, delta for each key (delta > 0 gives back,
# < 0 debits). Returns the levels after.
SETTLE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local out = {}
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[3 * i - 2])
  local burst = tonumber(ARGV[3 * i - 1])
  local delta = tonumber(ARGV[3 * i])
  local v = redis.call('HMGET', key, 'level', 'stamp')
  local level = tonumber(v[1])
  local stamp = tonumber(v[2])
  if level == nil or stamp == nil then
    level = burst
  elseif now > stamp then
    level = level + (now - stamp) * rate
  end
  level = math.min(burst, math.min(burst, level) + delta)
  redis.call('HSET', key, 'level', string.format('%.17g', level),
             'stamp', string.format('%.17g', now))
  redis.call('PEXPIRE', key, math.ceil((burst - level) / rate * 1000) + 1000)
  out[i] = string.format('%.17g', level)
end
return out
"""


class RedisBuckets:
    """Buckets in one Redis (``global.redis.address``): a blocking connection pool (a call
    waits at most ``timeout`` for a free connection), no client-side retries, every call
    bounded by ``timeout``; after a failure the caller skips Redis for ``retry_interval``
    (``available``) and the next call reconnects."""

    def __init__(
        self, address: str, timeout: float, retry_interval: float, max_connections: int
    ) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        host, port = split_host_port(address)
        self.address = address
        self.timeout = timeout
        self.retry_interval = retry_interval
        no_retry = Retry(NoBackoff(), 0)
        self.pool = aioredis.BlockingConnectionPool(
            host=host.strip("[]"),
            port=port,
            max_connections=max_connections,
            timeout=timeout,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=no_retry,
        )
        self.client = aioredis.Redis(connection_pool=self.pool, retry=no_retry)
        self._reserve = self.client.register_script(RESERVE_LUA)
        self._settle = self.client.register_script(SETTLE_LUA)
        self.down_until = 0.0

    def available(self, now: float) -> bool:
        return now >= self.down_until

    def failed(self, now: float) -> None:
        self.down_until = now + self.retry_interval

    async def reserve(
        self, keys: list[str], args: list[float]
    ) -> tuple[bool, list[tuple[float, float]]]:
        async with asyncio.timeout(self.timeout):
            reply = await self._reserve(keys=keys, args=args)
        ok = reply[0] in (b"1", "1", 1)
        pairs = [(float(reply[2 * i + 1]), float(reply[2 * i + 2])) for i in range(len(keys))]
        return ok, pairs

    async def settle(self, keys: list[str], args: list[float]) -> list[float]:
        async with asyncio.timeout(self.timeout):
            reply = await self._settle(keys=keys, args=args)
        return [float(v) for v in reply]

    async def close(self) -> None:
        await self.client.aclose()
        await self.pool.disconnect()


def redis_key(limit: RouteLimit, direction: str) -> str:
    # The {hash tag} keeps a route's two buckets in one Redis Cluster slot (one script).
    return f"llmplane:ratelimit:{{{limit.key}}}:{direction}"


# --- the hook -----------------------------------------------------------------------------------


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


def settle_deltas(
    amounts: list[tuple[str, int]], prompt: int | None, completion: int | None, status: int
) -> list[tuple[str, int]]:
    """Tokens to give back (> 0) or debit (< 0) per direction once the response is known.

    With usage: reserved - used (input only when the engine reported prompt tokens). Without
    usage: a failed request (status >= 400, not a client that went away) gets everything
    back; otherwise the reservation stands."""
    if prompt is None and completion is None:
        if status >= 400 and status != 499:
            return [(d, a) for d, a in amounts if a]
        return []
    deltas = []
    for direction, amount in amounts:
        used = prompt if direction == INPUT else completion
        if direction == INPUT and not used:
            continue
        delta = amount - (used or 0)
        if delta:
            deltas.append((direction, delta))
    return deltas


class RateLimiter:
    """The ``RequestHook`` enforcing ModelRoute rate limits (the gateway installs one and
    calls ``update`` with the store objects whenever they change)."""

    def __init__(
        self,
        config: Any,
        registry: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.clock = clock
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
            from prometheus_client import Counter

            self.rejections = Counter(
                "llmplane_ratelimit_rejections",
                "Requests refused by a token rate limit (reason: exhausted = retry later, "
                "too_large = can never fit)",
                ["route", "direction", "reason"],
                registry=registry,
            )
            self.redis_errors = Counter(
                "llmplane_ratelimit_redis_errors",
                "Failed or timed-out Redis calls of global rate limits",
                ["op"],
                registry=registry,
            )
            self.degraded = Counter(
                "llmplane_ratelimit_degraded",
                "Requests decided by the Redis failure policy (open, local, closed)",
                ["route", "policy"],
                registry=registry,
            )

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
            bucket = self.local[(limit.key, direction)] = TokenBucket(
                tokens / limit.period, tokens, self.clock()
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

    async def reserve(self, request: Any, decision: Any) -> Reservation | None:
        if not self.limits:
            return None
        ref = decision.route.partition("#")[0]
        limit = self.limits.get(ref)
        if limit is None:
            return None
        doc = request.doc
        embeddings = request.path.endswith("/embeddings")
        amounts: list[tuple[str, int]] = []
        for direction, tokens in limit.tokens:
            if direction == INPUT:
                amount = self.counter.count(doc, decision.model, request.model)
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
                    f"Request too large for model {request.model!r} on {direction} tokens per "
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
            reservation = await self._reserve_redis(request, limit, amounts)
        else:
            reservation = self._reserve_local(request, limit, amounts)
        if request.stream and not embeddings and inject_include_usage(doc):
            request.mark_dirty()
            reservation.stream_filter = UsageChunkFilter()
        return reservation

    def _reserve_local(
        self, request: Any, limit: RouteLimit, amounts: list[tuple[str, int]]
    ) -> Reservation:
        buckets = [(d, self._bucket(limit, d, limit.limit(d) or 0), a) for d, a in amounts]
        ok, states = reserve_local(buckets, self.clock())
        return self._decide(request, limit, "local", amounts, ok, states)

    async def _reserve_redis(
        self, request: Any, limit: RouteLimit, amounts: list[tuple[str, int]]
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
                return self._decide(request, limit, "redis", amounts, ok, states)
        self._count(self.degraded, limit.ref, self.policy)
        if self.policy == "local":
            return self._reserve_local(request, limit, amounts)
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
        request: Any,
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
            f"Rate limit reached for model {request.model!r} on {blocking.direction} tokens "
            f"per {limit.unit} ({limit.ref}): Limit {blocking.limit}, Used {used}, Requested "
            f"{asked[blocking.direction]}. Please try again in {duration(blocking.wait)}.",
            retry_after=wait,
            headers=rate_headers(states, blocking),
        )

    async def settle(
        self,
        request: Any,
        decision: Any,
        reservation: Reservation | None,
        usage: Any,
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
