"""Buckets shared by every gateway process: one Lua script in one Redis, timed by Redis ``TIME``."""

from __future__ import annotations

import asyncio
from typing import Any

from llmplane.api.kthena import split_host_port
from llmplane.gateway.ratelimit.buckets import BucketState
from llmplane.gateway.ratelimit.limits import RouteLimit

# KEYS: one bucket per limited direction. ARGV[1]: take (every amount or none) or adjust (give
# back > 0, debit < 0, up to the burst); then rate, burst, amount for each key. A bucket is a
# hash {level, stamp}, refilled at rate up to burst from stamp to Redis' own clock (a missing
# one is full) and expiring once it would be full again. Returns {admitted, level_1, wait_1,
# level_2, wait_2, ...}: the levels after, or as they are when a take is refused.
BUCKETS_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local take = ARGV[1] == 'take'
local levels, ok = {}, 1
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  local v = redis.call('HMGET', key, 'level', 'stamp')
  local level, stamp = tonumber(v[1]), tonumber(v[2])
  if level == nil or stamp == nil then
    level = burst
  elseif now > stamp then
    level = level + (now - stamp) * rate
  end
  levels[i] = math.min(burst, level)
  if take and levels[i] < tonumber(ARGV[3 * i + 1]) then ok = 0 end
end
local out = {tostring(ok)}
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  local amount = tonumber(ARGV[3 * i + 1])
  local level, wait = levels[i], 0
  if not take then
    level = math.min(burst, level + amount)
  elseif level < amount then
    wait = (amount - level) / rate
  elseif ok == 1 then
    level = level - amount
  end
  if ok == 1 then
    redis.call('HSET', key, 'level', string.format('%.17g', level),
               'stamp', string.format('%.17g', now))
    redis.call('PEXPIRE', key, math.ceil((burst - level) / rate * 1000) + 1000)
  end
  out[2 * i] = string.format('%.17g', level)
  out[2 * i + 1] = string.format('%.17g', wait)
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
        self._script = self.client.register_script(BUCKETS_LUA)
        self.down_until = 0.0

    def available(self, now: float) -> bool:
        return now >= self.down_until

    def failed(self, now: float) -> None:
        self.down_until = now + self.retry_interval

    async def reserve(
        self, limit: RouteLimit, amounts: list[tuple[str, int]]
    ) -> tuple[bool, list[BucketState]]:
        """Take every (direction, amount) or none: admitted, and the buckets' states."""
        reply = await self._run("take", limit, amounts)
        states = [
            BucketState(d, limit.limit(d) or 0, limit.rate(d), float(level), float(wait))
            for (d, _), level, wait in zip(amounts, reply[1::2], reply[2::2], strict=True)
        ]
        return reply[0] in (b"1", "1", 1), states

    async def settle(self, limit: RouteLimit, deltas: list[tuple[str, int]]) -> None:
        """Give back (> 0) or debit (< 0) each (direction, delta)."""
        await self._run("adjust", limit, deltas)

    async def _run(self, op: str, limit: RouteLimit, pairs: list[tuple[str, int]]) -> list[Any]:
        # The {hash tag} keeps a limit's buckets in one Redis Cluster slot (one script).
        keys = [f"llmplane:ratelimit:{{{limit.key}}}:{d}" for d, _ in pairs]
        args = [op, *(x for d, n in pairs for x in (limit.rate(d), limit.limit(d) or 0, n))]
        async with asyncio.timeout(self.timeout):
            return await self._script(keys, args)

    async def close(self) -> None:
        await self.client.aclose()
        await self.pool.disconnect()
