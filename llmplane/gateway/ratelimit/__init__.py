"""Rate limits for ModelRoute ``spec.rateLimit`` and Tenant ``spec.rateLimit`` (one request
hook; what a user sees of them: docs/tenants.md, how they work: docs/gateway.md, "Token rate
limits").

One token bucket per limit (a ModelRoute or a Tenant) and direction: requests, input, output,
budget. A request reserves before scheduling (1 request, its counted input tokens, the output
it may generate) from its tenant's and its route's limit, from both or from neither, and
settles after the response with the engine's ``usage``. Buckets live in this process (shared
by its workers) or, with ``global.redis``, in Redis, shared by every gateway replica and timed
by Redis' clock; when Redis is unreachable ``rate_limit_redis_failure`` decides (open, local,
closed).

Modules: ``limits`` (rateLimit -> ``RouteLimit``, the output reservation), ``buckets`` (the
token bucket, headers, settlement), ``redis_store`` (the shared buckets' Lua scripts),
``usage_filter`` (asking a stream for its usage) and ``limiter`` (``RateLimiter``, its 429).
"""

from llmplane.gateway.ratelimit.limiter import LimitReservation, RateLimiter, RateLimitError
from llmplane.gateway.ratelimit.redis_store import RedisBuckets

__all__ = ["LimitReservation", "RateLimitError", "RateLimiter", "RedisBuckets"]
