"""HTTP checks the local runtime makes against an engine: probes and the running-requests gauge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

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


async def schedule(probe: HttpProbe, started: float, not_before: float) -> AsyncIterator[None]:
    """Yield when a probe attempt is due, in event-loop time.

    The first attempt is ``initial_delay_seconds`` after the process started (and not before
    ``not_before``: readiness and liveness wait for the startup probe), then every
    ``period_seconds``. An attempt that overruns its period skips the missed ticks.
    """
    loop = asyncio.get_running_loop()
    period = probe.period_seconds if probe.period_seconds > 0 else 10
    at = max(started + max(probe.initial_delay_seconds, 0), not_before)
    while True:
        delay = at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        yield
        at += period
        now = loop.time()
        while at < now:
            at += period
