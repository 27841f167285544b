"""Buckets shared by every gateway process: two Lua scripts in one Redis, timed by Redis ``TIME``."""

from __future__ import annotations

import asyncio

from llmplane.api.kthena import split_host_port
from llmplane.gateway.ratelimit.buckets import BucketState
from llmplane.gateway.ratelimit.limits import RouteLimit

# Both scripts: a bucket is a hash {level, stamp}, refilled at ``rate`` up to ``burst`` from
# ``stamp`` to Redis' own clock; a missing one is full. It expires once it would be full again.
_BUCKET_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function refilled(key, rate, burst)
  local v = redis.call('HMGET', key, 'level', 'stamp')
  local level = tonumber(v[1])
  local stamp = tonumber(v[2])
  if level == nil or stamp == nil then return burst end
  if now > stamp then level = level + (now - stamp) * rate end
  return math.min(burst, level)
end
local function store(key, level, rate, burst)
  redis.call('HSET', key, 'level', string.format('%.17g', level),
             'stamp', string.format('%.17g', now))
  redis.call('PEXPIRE', key, math.ceil((burst - level) / rate * 1000) + 1000)
end
"""

# KEYS: one hash per limited direction. ARGV: rate, burst, amount for each key.
# Takes every amount or none. Returns {admitted, level_1, wait_1, level_2, wait_2, ...}.
RESERVE_LUA = (
    _BUCKET_LUA
    + """
local levels = {}
local ok = 1
for i, key in ipairs(KEYS) do
  local level = refilled(key, tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1]))
  levels[i] = level
  if level < tonumber(ARGV[3 * i]) then ok = 0 end
end
local out = {tostring(ok)}
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[3 * i - 2])
  local want = tonumber(ARGV[3 * i])
  local level = levels[i]
  local wait = 0
  if level < want then wait = (want - level) / rate end
  if ok == 1 then
    level = level - want
    store(key, level, rate, tonumber(ARGV[3 * i - 1]))
  end
  out[2 * i] = string.format('%.17g', level)
  out[2 * i + 1] = string.format('%.17g', wait)
end
return out
"""
)

# KEYS: one hash per direction. ARGV: rate, burst, delta for each key (delta > 0 gives back,
# < 0 debits).
SETTLE_LUA = (
    _BUCKET_LUA
    + """
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[3 * i - 2])
  local burst = tonumber(ARGV[3 * i - 1])
  local level = math.min(burst, refilled(key, rate, burst) + tonumber(ARGV[3 * i]))
  store(key, level, rate, burst)
end
return 1
"""
)


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
        self, limit: RouteLimit, amounts: list[tuple[str, int]]
    ) -> tuple[bool, list[BucketState]]:
        """Take every (direction, amount) or none: admitted, and the buckets' states."""
        async with asyncio.timeout(self.timeout):
            reply = await self._reserve(*_script_args(limit, amounts))
        states = [
            BucketState(d, limit.limit(d) or 0, limit.rate(d), float(level), float(wait))
            for (d, _), level, wait in zip(amounts, reply[1::2], reply[2::2], strict=True)
        ]
        return reply[0] in (b"1", "1", 1), states

    async def settle(self, limit: RouteLimit, deltas: list[tuple[str, int]]) -> None:
        """Give back (> 0) or debit (< 0) each (direction, delta)."""
        async with asyncio.timeout(self.timeout):
            await self._settle(*_script_args(limit, deltas))

    async def close(self) -> None:
        await self.client.aclose()
        await self.pool.disconnect()


def _script_args(limit: RouteLimit, pairs: list[tuple[str, int]]) -> tuple[list[str], list[float]]:
    """A script's KEYS (one bucket per direction) and ARGV (rate, burst, amount per key)."""
    # The {hash tag} keeps a limit's buckets in one Redis Cluster slot (one script).
    keys = [f"llmplane:ratelimit:{{{limit.key}}}:{d}" for d, _ in pairs]
    args = [x for d, n in pairs for x in (limit.rate(d), limit.limit(d) or 0, n)]
    return keys, args
