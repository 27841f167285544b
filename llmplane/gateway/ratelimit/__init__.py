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

A request reserves before scheduling (1 request, its input tokens counted by
``llmplane.gateway.tokens``, and the output it may generate: ``limits.output_reservation``) and
settles after the response with the engine's ``usage`` (what it did not use goes back, overuse
is debited; a failed request gets everything back). What a user sees of it, the 429 and the
``x-ratelimit-*`` headers: docs/tenants.md.

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
