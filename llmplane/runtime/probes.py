"""HTTP checks the local runtime makes against an engine: probes and the running-requests gauge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import aiohttp

from llmplane.controlplane.plan import HttpProbe

USER_AGENT = "llmplane-probe/1"
# Gauges of requests an engine is working on, by engine. Draining waits for their sum to be 0.
RUNNING_REQUESTS_METRICS = ("vllm:num_requests_running", "sglang:num_running_reqs")


async def http_ok(session: aiohttp.ClientSession, url: str, timeout: float) -> tuple[bool, str]:
    """One probe attempt: GET ``url``; success is a 200-399 answer within ``timeout`` seconds.

    Redirects are not followed (a 3xx is already a success), as with the kubelet.
    """
    try:
        async with session.get(
            url,
            timeout=aiohttp.ClientTimeout(total=timeout),
            allow_redirects=False,
            headers={"User-Agent": USER_AGENT},
        ) as resp:
            if 200 <= resp.status < 400:
                return True, ""
            return False, f"GET {url}: HTTP {resp.status}"
    except TimeoutError:
        return False, f"GET {url}: no answer within {timeout:g}s"
    except (aiohttp.ClientError, OSError) as err:
        return False, f"GET {url}: {err or type(err).__name__}"


async def running_requests(
    session: aiohttp.ClientSession, address: str, timeout: float
) -> int | None:
    """Requests the engine at ``address`` reports running, or None when it does not tell."""
    try:
        async with session.get(
            f"http://{address}/metrics",
            timeout=aiohttp.ClientTimeout(total=timeout),
            headers={"User-Agent": USER_AGENT},
        ) as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
    except (TimeoutError, aiohttp.ClientError, OSError, UnicodeDecodeError):
        return None
    return parse_running_requests(text)


def parse_running_requests(text: str) -> int | None:
    """Sum of the running-requests gauges in a Prometheus text exposition (None if absent)."""
    total: float | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        for name in RUNNING_REQUESTS_METRICS:
            if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
                rest = line[len(name) :]
                if rest.startswith("{"):
                    rest = rest.rsplit("}", 1)[-1]
                try:
                    value = float(rest.split()[0])
                except (ValueError, IndexError):
                    continue
                total = (total or 0.0) + value
    return None if total is None else round(total)


# While a replica is not ready yet, probes also run this often between their own ticks, so Ready
# follows the engine's readiness within a fraction of a second instead of up to a period later.
FAST_PERIOD = 0.25


async def schedule(
    probe: HttpProbe,
    started: float,
    not_before: float,
    hurry: Callable[[], bool] | None = None,
    fast: float = FAST_PERIOD,
) -> AsyncIterator[bool]:
    """Yield when a probe attempt is due, in event-loop time: True on the probe's own ticks.

    The first tick is ``initial_delay_seconds`` after the process started (and not before
    ``not_before``: readiness and liveness wait for the startup probe), then one every
    ``period_seconds``; a tick that overruns its period skips the missed ones. While ``hurry()``
    is true, extra attempts run every ``fast`` seconds in between and yield False: their successes
    count, their failures do not towards ``failureThreshold``, so giving up takes as long as the
    BackendRuntime says (period x threshold) however often the engine is asked.
    """
    loop = asyncio.get_running_loop()
    period = probe.period_seconds if probe.period_seconds > 0 else 10
    tick = max(started + max(probe.initial_delay_seconds, 0), not_before)
    last: float | None = None
    while True:
        due = tick
        if hurry is not None and last is not None and fast < period and hurry():
            due = min(tick, last + fast)
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        now = loop.time()
        counted = now >= tick
        if counted:
            while tick <= now:
                tick += period
        yield counted
        last = loop.time()
