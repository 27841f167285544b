"""What the supervisor sets up before it forks (``Share``) and one worker's place in it
(``Seat``): the listening sockets, the shared tables, each worker's report and the private
directory of the workers' sockets (docs/gateway.md, "Workers")."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Awaitable, Callable, Iterable

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.ratelimit.buckets import TokenBucket
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.workers.buckets import SharedBuckets
from llmplane.gateway.workers.inflight import InflightTable
from llmplane.gateway.workers.metrics import MetricsPeer
from llmplane.gateway.workers.picks import PickFeed, PickRings
from llmplane.gateway.workers.scrapes import (
    ScrapeFollower,
    ScrapePublisher,
    ScrapeTable,
)
from llmplane.gateway.workers.shm import Document, Locks
from llmplane.gateway.workers.wake import Waker, WakeTable
from llmplane.runtime.endpoint import Endpoint

SCRAPER = 0  # the worker that scrapes the engines for all (its replacement takes over)
ENDPOINT_CAPACITY = 16_384  # endpoint addresses one gateway run can see
BUCKET_CAPACITY = 4_096  # rate-limit buckets (route x direction)
REPORT_BYTES = 64 * 1024  # a worker's report at the most (pages are touched only as written)


def listen(host: str, port: int, count: int, backlog: int = 2048) -> list[socket.socket]:
    """``count`` listening sockets on one address, one per worker, joined by ``SO_REUSEPORT``:
    the kernel spreads new connections over them by a hash of the connection's addresses
    (docs/gateway.md, "Workers"). Port 0 binds the first to any free port and the rest to it.

    ``SO_REUSEPORT`` lets any socket of this user with the option join a group on the port,
    so a fixed port is first checked free by a plain bind (``EADDRINUSE`` if anything
    listens there, another gateway's group included) rather than silently shared."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if port:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as create_server's: IPv6 only
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            probe.bind((host, port))
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(
                socket.create_server((host, port), family=family, backlog=backlog, reuse_port=True)
            )
            port = socks[0].getsockname()[1]
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


class Share:
    def __init__(
        self,
        workers: int,
        socks: list[socket.socket],
        endpoint_capacity: int = ENDPOINT_CAPACITY,
        bucket_capacity: int = BUCKET_CAPACITY,
    ) -> None:
        self.workers = workers
        # Worker i serves socks[i] alone; the supervisor keeps them all open, so while a dead
        # worker is replaced its connections wait in its socket's backlog.
        self.socks = socks
        self.locks = Locks()
        self.inflight = InflightTable(workers, endpoint_capacity, self.locks)
        self.scrapes = ScrapeTable(endpoint_capacity)
        self.buckets = SharedBuckets(bucket_capacity, self.locks)
        self.picks = PickRings(workers)
        # Each worker's report, read by the others without asking it (console/stats.py).
        self.reports = [Document(REPORT_BYTES) for _ in range(workers)]
        self.wake = WakeTable(workers)
        self.dir = tempfile.mkdtemp(prefix="llmplane-workers-")  # 0700: ours alone
        self.socket_paths = [os.path.join(self.dir, f"metrics-{i}.sock") for i in range(workers)]

    def seat(self, index: int) -> Seat:
        return Seat(self, index)

    def keep_only(self, index: int) -> None:
        """In worker ``index`` after the fork: close the other workers' listening sockets (a
        worker must never hold a peer's, or that peer's replacement would share its queue)."""
        for i, sock in enumerate(self.socks):
            if i != index:
                sock.close()

    def reaped(self, index: int) -> None:
        """Worker ``index`` is gone: its in-flight and waiting requests with it."""
        self.inflight.clear(index)
        self.wake.clear(index)

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
        self.wake.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Seat:
    """Worker ``index``'s view of the share (what ``Gateway`` takes as ``seat``)."""

    def __init__(self, share: Share, index: int) -> None:
        self.share = share
        self.index = index
        self.workers = share.workers
        self.sock = share.socks[index]
        self.metrics = MetricsPeer(share.socket_paths, index)
        self.picks: PickFeed = share.picks.feed(index)
        # Requests waiting in this worker's flow control, woken by the others' completions.
        self.waker: Waker = share.wake.waker(index)
        # Whether this worker scrapes every endpoint (over its proxy's pool, which keeps its
        # connections to all of them warm); the others prefer endpoints they hold one to.
        self.scrapes = index == SCRAPER
        # More commands this worker answers on its private socket (``MetricsPeer.start``):
        # ``llmplane up``'s platform worker answers console requests and wake-ups.
        self.handlers: dict[bytes, Callable[[bytes], Awaitable[bytes]]] = {}

    async def ask(
        self, index: int, what: bytes, payload: bytes = b"", quiet: bool = False
    ) -> bytes | None:
        """Send a command to worker ``index`` (one of ``handlers`` there): ``MetricsPeer.ask``."""
        return await self.metrics.ask(index, what, payload, quiet)

    def report(self, data: bytes) -> bool:
        """Publish this worker's report (False if too large)."""
        return self.share.reports[self.index].write(data)

    def report_reader(self) -> ReportReader:
        """A reader of the other workers' reports."""
        return ReportReader({i: d for i, d in enumerate(self.share.reports) if i != self.index})

    def endpoint_state(self, endpoint: Endpoint) -> EndpointState:
        return self.share.inflight.state(endpoint, self.index)

    def share_scrapes(
        self,
        config: GatewayConfig,
        states: Callable[[], Iterable[EndpointState]],
        on_changed: Callable[[], None],
        on_models_changed: Callable[[], None],
    ) -> ScrapePublisher | ScrapeFollower:
        """Worker ``SCRAPER`` scrapes every endpoint and publishes (the returned publisher
        beats the heartbeat); every other worker follows what it publishes (the returned
        follower, calling ``on_changed`` and ``on_models_changed``). Either is the
        ``Scraper``'s ``sharing``, to start and close."""
        table = self.share.scrapes
        if self.index == SCRAPER:
            return ScrapePublisher(table, states, max(config.metrics_staleness / 2, 0.01))
        return ScrapeFollower(
            table,
            states,
            config.scrape_interval / 2,
            on_changed,
            config.metrics_staleness,
            on_models_changed,
        )

    def bucket(self, key: str, rate: float, burst: float, now: float) -> TokenBucket:
        return self.share.buckets.bucket(key, rate, burst, now)


class ReportReader:
    """One process's latest whole copy of each report in ``docs`` (worker index -> document;
    a report being written right now reads as its previous copy)."""

    def __init__(self, docs: dict[int, Document]) -> None:
        self.docs = docs
        self._seen: dict[int, tuple[int, bytes]] = {}

    def read(self) -> list[tuple[int, bytes]]:
        """(worker index, latest report) of every worker that has reported."""
        seen = self._seen
        for index, doc in self.docs.items():
            got = doc.read(seen[index][0] if index in seen else 0)
            if got is not None:
                seen[index] = got
        return [(index, seen[index][1]) for index in self.docs if index in seen]
