"""Rate limits for Kthena ``ModelRoute.spec.rateLimit`` and ``Tenant.spec.rateLimit`` (one
request hook).

One token bucket per ModelRoute (namespace/name) or Tenant and direction (input, output; a
Tenant also requests and budget = input + output tokens over the budget's own unit): rate =
limit / unit, burst = limit, unit second | minute | hour | day | month (30 days). A tenant's
request on a limited route takes from both limits or from neither (what the first took goes
back when the second refuses). Without
``global`` the buckets live in this process (monotonic clock); with ``global.redis`` they
live in Redis and every gateway process shares them: reserve and settle are Lua scripts,
atomic over both directions, timed by Redis ``TIME`` (never a gateway's clock).

A request on a limited route:

1. **reserve** (before scheduling): input tokens counted by ``llmplane.gateway.tokens``
   (the model's tokenizer, else ``ceil(chars / 4)``); output tokens reserved for every
   prompt and choice the engine generates, by the field it honours
   (``limits.output_reservation``; without one: ``rate_limit_default_output_tokens`` per
   sequence, never more than the bucket). Both buckets are taken
   together or not at all. A reservation larger than a bucket can never fit: 429 at once,
   without ``Retry-After``. Otherwise, when it does not fit now: 429 with ``Retry-After``
   (whole seconds until it would fit) and OpenAI's ``x-ratelimit-*-tokens`` headers.
   Streams get ``stream_options.include_usage=true`` when the client did not ask for usage,
   and the usage-only chunk is then removed from what the client receives.
2. **settle** (after the response): the engine's ``usage`` replaces the reservation in both
   directions: unused tokens go back, overuse is debited (the bucket may go below zero and
   later requests wait longer). A failed request (4xx/5xx, no usage) gets everything back;
   a successful response without usage, or a client that went away, keeps the reservation.
   A request counts as one request whatever it used.

Redis unreachable (errors and timeouts are counted in ``llmplane_ratelimit_redis_errors_total``;
the client reconnects lazily, each call is bounded by ``rate_limit_redis_timeout`` and after a
failure Redis is not asked again for ``rate_limit_redis_retry_interval``):
``rate_limit_redis_failure`` = ``open`` (default: admit unlimited), ``local`` (this process's
own buckets) or ``closed`` (503 with Retry-After).

Modules: ``limits`` (ModelRoute and Tenant rateLimit -> ``RouteLimit``), ``buckets`` (token-bucket maths,
``x-ratelimit-*`` headers, settlement), ``error`` (the 429), ``usage_filter`` (injecting
``include_usage`` and dropping the usage chunk), ``redis_store`` (the shared buckets' Lua
scripts) and ``limiter`` (``RateLimiter``, the hook).
"""

from llmplane.gateway.ratelimit.error import RateLimitError
from llmplane.gateway.ratelimit.limiter import LimitReservation, RateLimiter
from llmplane.gateway.ratelimit.redis_store import RedisBuckets

__all__ = ["LimitReservation", "RateLimitError", "RateLimiter", "RedisBuckets"]
