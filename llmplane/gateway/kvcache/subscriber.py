"""The gateway's subscriptions to its replicas' KV events, feeding one ``BlockIndex``
(docs/gateway.md, "Events in").

One task per replica whose ``Endpoint`` names an events address, following the batches'
sequence numbers: a gap is asked from the replica's replay endpoint, and where that cannot
fill it, or the connection drops, or the numbers start again, the replica's blocks are
forgotten: under-predicting is safe, predicting blocks that are gone is not. Nothing from a
payload becomes a metric label; refused messages are dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import zmq
import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from zmq.utils.monitor import parse_monitor_message

from llmplane.gateway.kvcache.events import BadPayload, EventLimits, decode_batch
from llmplane.gateway.kvcache.index import BlockIndex
from llmplane.runtime.endpoint import Endpoint, valid_events_address

log = logging.getLogger("llmplane.gateway.kvcache")

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def replica_model(endpoint: Endpoint) -> str:
    """The model a replica's blocks are indexed under: the name it serves."""
    return endpoint.model_name or min(endpoint.served_names(), default="")


class Feed:
    """One replica's subscription (see the module docstring)."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        replica: str,
        events: str,
        replay: str,
        index: BlockIndex,
        limits: EventLimits,
        replay_timeout: float,
    ) -> None:
        self.ctx = ctx
        self.replica = replica
        self.events = events
        self.replay = replay
        self.index = index
        self.limits = limits
        self.replay_timeout = replay_timeout
        self.expected: int | None = None  # the next sequence number; None: none seen yet
        self.replayed = range(0)  # numbers a replay applied that may still arrive live
        self.lag = 0.0  # seconds between the engine's timestamp and the batch's arrival
        self.batches = 0
        self.gaps_replayed = 0
        self.gaps_lost = 0
        self.resets = 0
        self.dropped: Counter[str] = Counter()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"kv {self.replica}")

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 2 * self.limits.message_bytes)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        return sock

    async def _run(self) -> None:
        sub = self._socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        sub.connect(self.events)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    event = parse_monitor_message(await monitor.recv_multipart())
                    if event["event"] == zmq.EVENT_DISCONNECTED:
                        self._reset("the events connection dropped")
                    elif event["event"] == zmq.EVENT_CONNECTED and self.expected is None:
                        await self._replay(0)
                if sub in ready:
                    await self._message(await sub.recv_multipart())
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("KV events of %s: the subscription failed", self.replica)
        finally:
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)

    def _reset(self, why: str) -> None:
        if self.expected is not None or self.index.held(self.replica):
            log.info("KV events of %s: %s; its blocks are forgotten", self.replica, why)
            self.resets += 1
        self.index.clear(self.replica)
        self.expected = None
        self.replayed = range(0)

    async def _message(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self.dropped["frames"] += 1
            return
        seq = int.from_bytes(frames[1], "big")
        expected = self.expected
        if expected is not None and seq < expected:
            if seq in self.replayed:
                return  # applied by a replay already
            self._reset("its sequence numbers started again")
            expected = None
        if expected is None and seq > 0:
            await self._replay(0, seq)
        elif expected is not None and seq > expected:
            await self._replay(expected, seq)
        if self.expected is None or seq >= self.expected:
            self._apply(seq, frames[2])

    def _apply(self, seq: int, payload: bytes) -> None:
        self.expected = seq + 1
        try:
            batch = decode_batch(payload, self.limits)
        except BadPayload as err:
            self.dropped[err.reason] += 1
            return
        if batch.skipped:
            self.dropped["event"] += batch.skipped
        self.index.apply(self.replica, batch)
        self.batches += 1
        self.lag = max(0.0, time.time() - batch.ts)

    async def _replay(self, start: int, upto: int | None = None) -> None:
        """Batches from ``start`` on, as the replay endpoint returns them, applied in order.
        ``upto``: the live number that showed a gap (None: catching up after connecting).
        A gap not filled up to ``upto`` forgets the replica's blocks."""
        gap = upto is not None and self.expected is not None
        complete = hole = False
        if self.replay:
            dealer = self._socket(zmq.DEALER)
            dealer.connect(self.replay)
            try:
                complete, hole = await self._fetch(dealer, start)
            finally:
                dealer.close(0)
        if gap:
            assert upto is not None and self.expected is not None
            if complete and not hole and self.expected >= upto:
                self.gaps_replayed += 1
            else:
                why = "no replay endpoint" if not self.replay else "the replay missed batches"
                log.warning(
                    "KV events of %s: a gap, %s; its blocks are forgotten", self.replica, why
                )
                self.gaps_lost += 1
                self.index.clear(self.replica)
        if self.expected is not None and self.expected > start:
            # Numbers the replay applied may still arrive live (queued meanwhile): not a reset.
            self.replayed = range(start, self.expected)

    async def _fetch(self, dealer: zmq.asyncio.Socket, start: int) -> tuple[bool, bool]:
        """(whether the end marker came, whether batches were missing on the way)."""
        await dealer.send_multipart((b"", start.to_bytes(8, "big")))
        deadline = time.monotonic() + self.replay_timeout
        hole = False
        while (left := deadline - time.monotonic()) > 0:
            if not await dealer.poll(left * 1000):
                return False, hole
            frames = await dealer.recv_multipart()
            # vLLM 0.32: [b"", topic, seq, payload]; earlier releases: [b"", seq, payload].
            if len(frames) == 4:
                frames = [frames[0], frames[2], frames[3]]
            if len(frames) != 3 or len(frames[1]) != 8:
                self.dropped["frames"] += 1
                return False, hole
            if frames[1] == END_SEQ:
                return True, hole
            seq = int.from_bytes(frames[1], "big")
            following = start if self.expected is None else self.expected
            if seq < following:
                continue
            if seq > following and self.expected is not None:
                hole = True  # the engine no longer buffers what was missed
                self.index.clear(self.replica)
            self._apply(seq, frames[2])
        return False, hole


class KVEventSubscriber:
    """Feeds for every endpoint that publishes KV events, into one ``BlockIndex``."""

    def __init__(
        self,
        index: BlockIndex | None = None,
        limits: EventLimits = EventLimits(),
        replay_timeout: float = 1.0,
    ) -> None:
        self.index = index if index is not None else BlockIndex()
        self.limits = limits
        self.replay_timeout = replay_timeout
        self.feeds: dict[str, Feed] = {}
        self._ctx: zmq.asyncio.Context | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self._refused: set[tuple[str, tuple[str, str]]] = set()  # warned about once
        self._closed = False  # no feed starts once close() has begun

    def sync(self, endpoints: Iterable[Endpoint]) -> None:
        """Subscribe to new publishers, drop the ones gone (call on the event loop)."""
        if self._closed:
            return
        wanted = {e.address: e for e in endpoints if e.kv_events}
        for replica, feed in list(self.feeds.items()):
            endpoint = wanted.get(replica)
            if endpoint is None or (feed.events, feed.replay) != (
                endpoint.kv_events,
                endpoint.kv_events_replay,
            ):
                self._drop(replica)
        for replica, endpoint in wanted.items():
            if replica in self.feeds:
                continue
            addresses = (endpoint.kv_events, endpoint.kv_events_replay)
            if not all(valid_events_address(a) for a in addresses if a):
                if (replica, addresses) not in self._refused:
                    self._refused.add((replica, addresses))
                    log.warning("endpoint %s: KV events address not tcp:// or ipc://", replica)
                continue
            if self._ctx is None:
                self._ctx = zmq.asyncio.Context()
            self.index.add_replica(replica, replica_model(endpoint))
            feed = Feed(
                self._ctx,
                replica,
                endpoint.kv_events,
                endpoint.kv_events_replay,
                self.index,
                self.limits,
                self.replay_timeout,
            )
            self.feeds[replica] = feed
            feed.start()

    def _drop(self, replica: str) -> None:
        feed = self.feeds.pop(replica)
        stopping = asyncio.get_running_loop().create_task(feed.stop())
        self._stopping.add(stopping)  # (a task nothing refers to may be collected)
        stopping.add_done_callback(self._stopping.discard)
        self.index.remove_replica(replica)

    async def close(self) -> None:
        """Stop every feed; endpoints that appear meanwhile (replicas still starting while the
        platform stops) get none, and the context is destroyed without waiting on any socket
        (``term`` alone blocks the event loop while a socket is open)."""
        self._closed = True
        feeds, self.feeds = list(self.feeds.values()), {}
        for feed in feeds:
            await feed.stop()
        for task in list(self._stopping):
            await task
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def collect(self) -> Iterator[Metric]:
        """Per replica (labelled by its address): blocks indexed, event lag, gaps, drops."""
        feeds = self.feeds.values()

        def family(kind: Any, name: str, doc: str, value: Callable[[Feed], float]) -> Metric:
            metric = kind(name, doc, labels=["endpoint"])
            for feed in feeds:
                metric.add_metric([feed.replica], value(feed))
            return metric

        yield family(
            GaugeMetricFamily,
            "llmplane_gateway_endpoint_kv_blocks",
            "KV blocks the gateway's index holds for the endpoint (from its KV events)",
            lambda feed: self.index.held(feed.replica),
        )
        yield family(
            GaugeMetricFamily,
            "llmplane_gateway_endpoint_kv_event_lag_seconds",
            "Age of the endpoint's last KV event batch when it arrived",
            lambda feed: feed.lag,
        )
        yield family(
            CounterMetricFamily,
            "llmplane_gateway_kv_gaps_replayed",
            "Gaps in an endpoint's KV events filled from its replay endpoint",
            lambda feed: feed.gaps_replayed,
        )
        yield family(
            CounterMetricFamily,
            "llmplane_gateway_kv_gaps_lost",
            "Gaps in an endpoint's KV events that could not be replayed (its blocks forgotten)",
            lambda feed: feed.gaps_lost,
        )
        yield family(
            CounterMetricFamily,
            "llmplane_gateway_kv_resets",
            "Times an endpoint's blocks were forgotten: restart, dropped connection",
            lambda feed: feed.resets,
        )
        dropped = CounterMetricFamily(
            "llmplane_gateway_kv_events_dropped",
            "KV event messages (or single events: reason 'event') refused",
            labels=["endpoint", "reason"],
        )
        for feed in feeds:
            for reason, count in feed.dropped.items():
                dropped.add_metric([feed.replica, reason], count)
        yield dropped
