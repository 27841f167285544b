"""HTTP checks the local runtime makes against an engine: probes and the running-requests gauge."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import aiohttp

from llmplane.aio import PAGE_MAX_BYTES, read_bounded
from llmplane.controlplane.plan import HttpProbe
from llmplane.shortage import own_shortage

USER_AGENT = "llmplane-probe/1"
# Gauges of requests an engine is working on, by engine. Draining waits for their sum to be 0.
RUNNING_REQUESTS_METRICS = ("vllm:num_requests_running", "sglang:num_running_reqs")


class _StatusLine(asyncio.Protocol):
    """Sends one request and resolves ``status`` with the answer's status code (or an error)
    as soon as its status line is in; the connection is closed then."""

    def __init__(self, request: bytes, status: asyncio.Future[int]) -> None:
        self.request = request
        self.status = status
        self.head = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.head += data
        end = self.head.find(b"\r\n")
        if end == -1 and len(self.head) < 1024:
            return
        parts = self.head[: max(end, 0)].split(None, 2)
        if not self.status.done():
            if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
                self.status.set_result(int(parts[1]))
            else:
                self.status.set_exception(ValueError("not an HTTP answer"))
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.status.done():
            self.status.set_exception(exc or ConnectionResetError("closed without an answer"))


async def http_ok(url: str, timeout: float) -> tuple[bool | None, str]:
    """One probe attempt: GET ``url``; success is a 200-399 answer within ``timeout`` seconds.
    None instead of False when the attempt failed for want of our own resources
    (:func:`own_shortage`): the engine's state is unknown then, not bad.

    Redirects are not followed (a 3xx is already a success), as with the kubelet, and each
    attempt is a new connection, as the kubelet's are (an engine restarts on the same port).
    Only the status line is read, over a bare asyncio protocol: a fleet of hundreds of replicas
    is probed a few hundred times a second, and an HTTP client session per attempt cost the
    control plane a tenth of a core there.
    """
    parsed = urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    target = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
    request = (
        f"GET {target} HTTP/1.1\r\nHost: {parsed.netloc}\r\nUser-Agent: {USER_AGENT}\r\n"
        "Accept: */*\r\nConnection: close\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    status: asyncio.Future[int] = loop.create_future()
    transport: asyncio.BaseTransport | None = None
    try:
        async with asyncio.timeout(timeout):
            transport, _ = await loop.create_connection(
                lambda: _StatusLine(request, status), host, port
            )
            code = await status
    except TimeoutError:
        return False, f"GET {url}: no answer within {timeout:g}s"
    except (OSError, ValueError) as err:
        return None if own_shortage(err) else False, f"GET {url}: {err or type(err).__name__}"
    finally:
        if transport is not None:
            transport.close()
    if 200 <= code < 400:
        return True, ""
    return False, f"GET {url}: HTTP {code}"


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
            text = (await read_bounded(resp, PAGE_MAX_BYTES)).decode()
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
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


def spread(probe: HttpProbe) -> float:
    """A random phase for ``schedule``: up to one period."""
    return random.random() * (probe.period_seconds if probe.period_seconds > 0 else 10)


async def schedule(
    probe: HttpProbe,
    started: float,
    not_before: float,
    hurry: Callable[[], bool] | None = None,
    fast: float = FAST_PERIOD,
    phase: float = 0.0,
) -> AsyncIterator[bool]:
    """Yield when a probe attempt is due, in event-loop time: True on the probe's own ticks.

    The first tick is ``initial_delay_seconds`` after the process started (and not before
    ``not_before``: readiness and liveness wait for the startup probe), then one every
    ``period_seconds``; a tick that overruns its period skips the missed ones. While ``hurry()``
    is true, extra attempts run every ``fast`` seconds in between and yield False: their successes
    count, their failures do not towards ``failureThreshold``, so giving up takes as long as the
    BackendRuntime says (period x threshold) however often the engine is asked.

    ``phase`` seconds are added once, after the first tick: replicas started together would
    otherwise probe in step, and 200 probes in one event-loop turn stalled ``llmplane up``'s
    gateway for about 30 ms every period (docs/benchmarks.md, the 200-replica fleet).
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
            tick += phase
            phase = 0.0
        yield counted
        last = loop.time()
