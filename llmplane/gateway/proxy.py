"""The proxy: attempts on the picked endpoints, and the upstream answer relayed to the client.

A request's attempts run under one ``Attempts`` budget (the route's retry count): iterate it
for the attempt numbers; it counts and spaces the retries, keeps the failures for the access
log and, once spent, gives the 502 / 503 / 504 to answer with. An attempt fails
(``AttemptFailed``, worth retrying on another endpoint) on a connect error, a timeout or a 5xx
while more attempts are left; once a byte has been sent to the client it is never retried. A
connect that fails for the gateway's own shortage (out of descriptors or memory:
``llmplane.shortage``) is no replica's fault: it ends the attempts with a 503 and outlier
ejection does not count it. The plain path (``Proxy.serve``) and the prefill/decode path
(``pd.py``) send their attempts with ``Proxy.send``: unary answers are relayed whole, streams
chunk by chunk as they come, the upstream bytes untouched (a hook's stream filter aside) while
usage is read on the way.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import orjson

from llmplane.aio import BodyTooLarge
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.context import RequestContext
from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.flowcontrol.priority import prioritized_body
from llmplane.gateway.hooks import Usage
from llmplane.gateway.http_server import HttpRequest, Response, StreamResponse
from llmplane.gateway.migration import NO_REPLICA, Migrator
from llmplane.gateway.observability import Counter
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.protocols import unserved
from llmplane.gateway.protocols.messages import PATHS as MESSAGES_PATHS
from llmplane.gateway.protocols.messages import stream_error
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.response_usage import StreamScanner, extract_usage
from llmplane.gateway.scheduler.framework import Scheduler
from llmplane.gateway.scheduler.precise_prefix import predicted_cached_tokens
from llmplane.gateway.splice import Splice, failed_event
from llmplane.gateway.tokens import sent_prompt_tokens
from llmplane.gateway.upstream_client import (
    ConnectionLost,
    RawHeaders,
    ServerDisconnected,
    UpstreamPool,
    UpstreamResponse,
    encode_request,
)
from llmplane.shortage import own_shortage

ENDPOINT_HEADER = "x-llmplane-endpoint"

# Not forwarded in either direction (RFC 9110 7.6.1), plus what the upstream client sets itself.
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                  "trailer", "transfer-encoding", "upgrade", "host", "content-length",
                  "accept-encoding"})  # fmt: skip
# A Tenant's API key is the gateway's credential, never the engine's: a request a key
# authenticated goes upstream without it (engines log and may echo headers).
_HOP_AND_KEY = _HOP | {"authorization", "x-api-key"}
_HOP_RESPONSE = frozenset(
    name.encode() for name in (_HOP - {"accept-encoding"}) | {"server", "date"}
)


def forwarded_headers(request: HttpRequest, keyed: bool = False) -> dict[str, str]:
    """The client's headers to send upstream: all but hop-by-hop ones (names are lower-case),
    and without the API key when one authenticated the request (``keyed``). Without Tenants
    the client's ``Authorization`` goes through (e.g. an engine's own ``--api-key``)."""
    drop = _HOP_AND_KEY if keyed else _HOP
    return {k: v for k, v in request.headers.items() if k not in drop}


def relayed_headers(
    upstream: RawHeaders, endpoint: str | None, extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Keyword arguments for a Response relaying an upstream one: its header lines as they
    came (less hop-by-hop ones and those the gateway sets itself), then the endpoint header
    and any a hook added."""
    headers = {ENDPOINT_HEADER: endpoint} if endpoint else {}
    if extra:
        headers.update(extra)
    return {"raw_headers": upstream.forward(_HOP_RESPONSE), "headers": headers or None}


class StreamStalled(TimeoutError):
    """The upstream sent nothing for the route's stall timeout in the middle of a stream."""


class StreamDrained(ConnectionError):
    """The stream's replica is being drained: the stream moves to another replica."""


class _StreamWatch:
    """One stream the watchdog looks at: ``chunks`` moves while the upstream sends, and
    ``waiting`` is True only while the relay waits on the upstream (not on a slow client).
    ``address``: its replica's; ``movable``: it may continue elsewhere (a handover)."""

    __slots__ = ("address", "chunks", "drained", "movable", "resp", "seen", "since", "stall",
                 "stalled", "waiting")  # fmt: skip

    def __init__(self, resp: UpstreamResponse, stall: float, address: str, movable: bool) -> None:
        self.resp = resp
        self.stall = stall
        self.address = address
        self.movable = movable
        self.chunks = self.seen = 0
        self.since = 0.0  # (set by the watchdog's first look while the relay waits)
        self.waiting = self.stalled = self.drained = False


def stall_event(seconds: float, path: str = "") -> bytes:
    """The SSE events that end a stalled stream: an OpenAI-style error, then ``[DONE]`` (the
    Messages API: its own ``error`` event, ``protocols.messages.stream_error``)."""
    message = f"the model server sent nothing for {seconds:g} s; the stream was ended"
    if path in MESSAGES_PATHS:
        return stream_error(message)
    error = {"message": message, "type": "timeout_error", "code": ErrorCode.UPSTREAM_STALLED}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\ndata: [DONE]\n\n"


LOCAL = "local"  # an attempt's failure kind: the gateway's own shortage, not the replica's
# Seconds in the 503's Retry-After when the gateway itself was short of descriptors or memory:
# they come back as soon as requests in flight end.
LOCAL_RETRY_AFTER = 1.0


class AttemptFailed(Exception):
    """One attempt failed in a way worth retrying elsewhere (nothing reached the client)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        # connect | lost (after the request went out) | timeout | status | local (LOCAL)
        self.kind = kind
        self.detail = detail

    @property
    def blames_replica(self) -> bool:
        """Whether the replica tried is at fault (outlier ejection counts it)."""
        return self.kind != LOCAL


# A replica that had the request and broke off (killed, restarted) rather than one that never
# answered: with no other one left to send it to, the client may retry soon (503).
_LOST = (ServerDisconnected, ConnectionLost, ConnectionResetError)


def attempt_failure(
    err: BaseException, timeout: float | None, failure: type[AttemptFailed] = AttemptFailed
) -> AttemptFailed:
    """What a timeout or a connection error of an upstream exchange is, for the retry loop."""
    if isinstance(err, TimeoutError):
        return failure("timeout", f"timed out after {timeout or 0:.3g} s")
    if own_shortage(err):  # EMFILE, ENOMEM ... connecting: ours, whatever the replica
        return failure(LOCAL, f"{type(err).__name__}: {err}")
    kind = "lost" if isinstance(err, _LOST) else "connect"
    return failure(kind, f"{type(err).__name__}: {err}")


class Attempts:
    """The retry budget of one request: ``async for attempt in attempts`` gives 0, 1, ...
    (waiting the route's retry interval before each retry); ``exhausted()`` is the error to
    answer with when the loop ran out."""

    __slots__ = ("budget", "ctx", "interval", "last", "lost", "retries", "retry_after", "what")

    def __init__(
        self,
        ctx: RequestContext,
        retries: Counter,
        what: str = "any endpoint",
        retry_after: float = 5.0,
    ) -> None:
        assert ctx.decision is not None
        backend = ctx.decision.backend
        self.ctx = ctx
        self.budget = max(0, backend.retry_attempts)
        self.interval = backend.retry_interval
        self.retries = retries
        self.what = what  # what was tried, for the 502 message
        self.retry_after = retry_after  # seconds, in the 503 when the replicas were lost
        self.last: AttemptFailed | None = None
        self.lost = False  # a replica broke off the request (not only refused or timed out)

    def __aiter__(self) -> Attempts:
        return self

    async def __anext__(self) -> int:
        ctx = self.ctx
        n = ctx.attempts
        if n > self.budget:
            raise StopAsyncIteration
        ctx.attempts = n + 1
        if n:
            self.retries.labels(ctx.decision.route).inc()  # type: ignore[union-attr]
            if self.interval > 0:
                await asyncio.sleep(self.interval)
        return n

    @property
    def may_retry(self) -> bool:
        """Whether another attempt follows this one if it fails."""
        return self.ctx.attempts <= self.budget

    def failed(self, failure: AttemptFailed, where: str) -> None:
        self.last = failure
        self.lost = self.lost or failure.kind == "lost"
        self.ctx.failed(where, failure.detail)
        if failure.kind == LOCAL:
            # The gateway is short of descriptors or memory: another replica would fail the
            # same way, and each try takes what the requests in flight need.
            self.budget = 0

    def exhausted(self) -> GatewayError:
        ctx = self.ctx
        assert self.last is not None and ctx.decision is not None and ctx.inference is not None
        model, last = ctx.inference.model, self.last
        tried = f"({ctx.attempts} attempt{'s' if ctx.attempts > 1 else ''}); last: {last.detail}"
        if last.kind == LOCAL:
            return GatewayError(
                503,
                f"model {model!r}: the gateway is out of resources and could not connect to a "
                f"replica ({last.detail}); the replica is not at fault, retry later",
                ErrorCode.OUT_OF_RESOURCES,
                retry_after=LOCAL_RETRY_AFTER,
            )
        if last.kind == "timeout":
            return GatewayError(
                504,
                f"model {model!r}: no response within {ctx.decision.backend.timeout} s {tried}",
                ErrorCode.UPSTREAM_TIMEOUT,
                endpoint=ctx.endpoint,
            )
        if self.lost:  # the replicas it was sent to went away and none is left: retry soon
            return GatewayError(
                503,
                f"model {model!r}: the replica serving the request was lost and no other one "
                f"could take it {tried}",
                ErrorCode.REPLICA_LOST,
                retry_after=self.retry_after,
                endpoint=ctx.endpoint,
            )
        return GatewayError(
            502,
            f"model {model!r}: could not get a response from {self.what} {tried}",
            ErrorCode.BAD_GATEWAY,
            endpoint=ctx.endpoint,
        )


class Proxy:
    """Sends attempts upstream over one keep-alive pool and relays the answers."""

    WATCH_INTERVAL = 0.25  # how often the watchdog looks at the streams in flight

    def __init__(
        self,
        config: GatewayConfig,
        outliers: Outliers,
        scheduler: Scheduler,
        retries: Counter,
        stalls: Counter | None = None,
        resends: Counter | None = None,
        on_first_chunk: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.outliers = outliers
        self.scheduler = scheduler  # its profiles learn where each request went (on_pick)
        self.retries = retries
        self.stalls = stalls  # streams ended by the stall timeout, by route
        self.resends = resends  # requests sent again after a stale connection, by endpoint
        self.pool: UpstreamPool | None = None
        self._streams: set[_StreamWatch] = set()
        self._watchdog: asyncio.Task[None] | None = None
        # Called when a stream's first chunk arrived (an endpoint's prefill finished: flow
        # control may release a waiter, see ``saturation_max_prefilling``).
        self.on_first_chunk = on_first_chunk
        # MIGRATION: continues lost streams on another replica (gateway/migration.py).
        self.migrator = Migrator(scheduler, outliers, config.migration_max_sequence)

    def start(self) -> None:
        c, resends = self.config, self.resends
        self.pool = UpstreamPool(
            limit=c.connection_limit,
            keepalive_timeout=c.keepalive_timeout,
            connect_timeout=c.connect_timeout,
            on_resend=None if resends is None else lambda address: resends.labels(address).inc(),
        )
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def close(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        pool, self.pool = self.pool, None
        if pool is not None:
            await pool.close()

    async def _watch(self) -> None:
        """End streams whose upstream went quiet: one sweep for all of them, instead of a
        timer armed and cancelled per chunk."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.WATCH_INTERVAL)
            now = loop.time()
            for watch in list(self._streams):
                if not watch.waiting or watch.chunks != watch.seen:
                    watch.seen = watch.chunks
                    watch.since = now
                elif now - watch.since >= watch.stall and not watch.stalled:
                    watch.stalled = True
                    watch.resp.abort(StreamStalled(f"no bytes for {watch.stall:g} s"))

    def handover(self, address: str) -> int:
        """Move the streams on ``address`` (a replica being drained, its grace period over)
        that may continue elsewhere to other replicas now; how many. The others stay until
        the replica stops."""
        moved = 0
        for watch in list(self._streams):
            if watch.address == address and watch.movable and not watch.drained:
                watch.drained = True
                watch.resp.abort(StreamDrained(f"{address} is being drained"))
                moved += 1
        return moved

    def attempts(self, ctx: RequestContext, what: str = "any endpoint") -> Attempts:
        return Attempts(ctx, self.retries, what, self.config.activator_retry_after)

    async def serve(self, ctx: RequestContext) -> StreamResponse:
        """The plain path: the picked endpoints (``ctx.pick``) in order, one per attempt."""
        decision, pick, sched = ctx.decision, ctx.pick, ctx.scheduling
        assert decision is not None and ctx.inference is not None
        assert pick is not None and sched is not None
        backend = decision.backend
        profile = self.scheduler.profile(backend.profile)
        order = pick.endpoints
        headers = forwarded_headers(ctx.request, ctx.tenant is not None)
        body = ctx.inference.final_body()
        attempts = self.attempts(ctx)
        failed: set[str] = set()
        async for attempt in attempts:
            state = order[attempt % len(order)]
            if failed:  # a retry goes to a replica that has not failed this request, if any
                state = next((s for s in order if s.endpoint.address not in failed), state)
            profile.on_pick(sched, state)
            ctx.cached_predicted = predicted_cached_tokens(sched, state.key)
            address = backend.address(state)
            try:
                response = await self.send(ctx, state, address, headers, body, attempts.may_retry)
            except AttemptFailed as failure:
                self.outliers.attempt_failed(state, failure)
                attempts.failed(failure, address)
                failed.add(state.endpoint.address)
                if failure.kind == "timeout":
                    break  # the route's one timeout is spent
                continue
            self.judge(ctx, state)
            return response
        raise attempts.exhausted()

    def judge(self, ctx: RequestContext, state: EndpointState) -> None:
        """Tell outlier ejection how an attempt that reached the client went."""
        if (ctx.upstream_status or 0) >= 500 or ctx.upstream_broken:
            self.outliers.failure(state)
        elif not ctx.migrations:  # (a replica a stream moved away from was charged then)
            self.outliers.success(state)

    async def send(
        self,
        ctx: RequestContext,
        state: EndpointState,
        address: str,
        headers: dict[str, str],
        body: bytes,
        may_retry: bool,
    ) -> StreamResponse:
        """One attempt on ``state``, counted in flight until it ends however it ends."""
        assert ctx.decision is not None and ctx.inference is not None
        refusal = unserved(state.endpoint.engine, ctx.request.path, ctx.inference.model)
        if refusal is not None:  # an engine without this API (protocols/)
            raise refusal
        if state.endpoint.priority_scheduling:  # only then: the bytes relayed untouched
            body = prioritized_body(ctx, body)
        splice = None  # MIGRATION: a stream that may continue elsewhere asks for token ids
        if ctx.inference.stream and (spliced := self.migrator.splice(ctx, state, body)):
            splice, body = spliced
        # One timeout for all of a request's attempts, from the first one's start.
        timeout = ctx.decision.backend.timeout
        if timeout is not None:
            now = time.monotonic()
            if ctx.deadline is None:
                ctx.deadline = now + timeout
            else:
                timeout = ctx.deadline - now
                if timeout <= 0:
                    raise AttemptFailed("timeout", "the route's timeout was spent")
        wire = encode_request("POST", ctx.request.path_qs, address, headers, body)
        state.add_inflight(1)
        # Prefill work queued there until the first byte (the autoscaling signal).
        tokens = sent_prompt_tokens(ctx.inference, ctx.scheduling)
        state.add_prefill_tokens(tokens)
        ctx.endpoint = address
        if ctx.inference.stream:
            return await self._stream(
                ctx, address, wire, state, may_retry, timeout, splice, headers, tokens
            )
        try:
            status, upstream_headers, data = await self.fetch(address, wire, timeout)
        finally:
            state.add_inflight(-1)
            state.add_prefill_tokens(-tokens)
        if status >= 500 and may_retry:
            raise AttemptFailed("status", f"HTTP {status}")
        # On the last attempt an engine's own 5xx goes to the client as it is.
        ctx.upstream_status = status
        if status < 400:
            ctx.usage = Usage.of(extract_usage(data))
        return Response(
            status=status,
            body=data,
            **relayed_headers(upstream_headers, ctx.endpoint, ctx.response_headers),
        )

    async def fetch(
        self,
        address: str,
        wire: bytes,
        timeout: float | None,
        failure: type[AttemptFailed] = AttemptFailed,
    ) -> tuple[int, RawHeaders, bytes]:
        """A whole upstream response; a connect error or timeout raises ``failure``."""
        assert self.pool is not None
        try:
            return await self.pool.request(address, wire, timeout, self.config.max_response_bytes)
        except (TimeoutError, OSError) as err:
            raise attempt_failure(err, timeout, failure) from None
        except BodyTooLarge:  # not retried: another replica's answer would be as large
            raise GatewayError(
                502,
                f"the model server's answer is larger than maxResponseBytes "
                f"({self.config.max_response_bytes} bytes)",
                ErrorCode.RESPONSE_TOO_LARGE,
                endpoint=address,
            ) from None

    async def _stream(
        self,
        ctx: RequestContext,
        address: str,
        wire: bytes,
        state: EndpointState,
        may_retry: bool,
        timeout: float | None,
        splice: Splice | None,
        headers: dict[str, str],
        tokens: int,
    ) -> StreamResponse:
        """The timeout covers connect + response headers + first chunk (time to first byte);
        once a byte has been sent to the client the request is never retried. ``tokens``
        (the prompt's) are counted on ``state`` until the first chunk."""
        assert self.pool is not None and ctx.decision is not None
        resp: UpstreamResponse | None = None
        state.add_prefilling(1)  # until the first chunk: queued or in prefill in the engine
        try:
            with self.pool.deadlines.after(timeout):
                resp = await self.pool.open(address, wire)
                if resp.status >= 500 and may_retry:  # (its body unread: release closes it)
                    raise AttemptFailed("status", f"HTTP {resp.status}")
                chunk = await resp.readany()
        except BaseException as err:
            state.add_inflight(-1)
            if resp is not None:
                resp.release()
            if isinstance(err, (TimeoutError, OSError)):
                raise attempt_failure(err, timeout) from None
            raise
        finally:
            state.add_prefilling(-1)
            state.add_prefill_tokens(-tokens)
        if self.on_first_chunk is not None:
            self.on_first_chunk()
        stall = ctx.decision.backend.stall_timeout
        watch = _StreamWatch(resp, stall or math.inf, state.endpoint.address, splice is not None)
        if stall or splice is not None:  # (a movable stream: for a handover)
            self._streams.add(watch)
        try:
            out = StreamResponse(
                status=resp.status,
                **relayed_headers(resp.headers, ctx.endpoint, ctx.response_headers),
            )
            ctx.ttft = time.perf_counter() - ctx.t0
            ctx.upstream_status = resp.status
            scanner = StreamScanner()
            relay = ctx.stream_filter  # a hook's (drops an injected usage chunk)
            while True:  # MIGRATION: once per replica the stream runs on (one without it)
                lost: str | None = None
                while chunk:
                    if splice is not None:  # whole events only, as the client's stream
                        chunk = splice.feed(chunk)
                    scanner.feed(chunk)
                    data = chunk if relay is None else relay.feed(chunk)
                    # What has arrived goes now; the head with the first piece and, once the
                    # upstream's body has ended, the end of ours with its last: one write each.
                    last = relay is None and resp.ended and (splice is None or splice.done)
                    if not out.prepared:
                        await out.prepare(ctx.request, data, last)
                    elif data or last:
                        await out.write(data, last)  # a client that went away raises here
                    if last:
                        break
                    if splice is not None and splice.lost is not None:
                        ctx.error, lost = f"stream lost: {splice.lost}", "engine_error"
                        break
                    watch.chunks += 1
                    watch.waiting = True
                    try:
                        chunk = await resp.readany()
                    except OSError as err:  # (StreamStalled and StreamDrained among them)
                        # The replica broke mid-stream; the client sees a truncated stream.
                        ctx.error = f"stream broken: {type(err).__name__}: {err}"
                        ctx.upstream_broken = True
                        break
                    watch.waiting = False
                if splice is None or splice.done:
                    break
                if splice.finished:  # lost after its final chunk: only the end is missing
                    data = splice.ending()
                    scanner.feed(data)
                    await out.write(data if relay is None else relay.feed(data))
                    ctx.error, ctx.upstream_broken = None, False
                    break
                if watch.drained:
                    lost = "drained"  # (not the replica's failure)
                else:
                    if watch.stalled:
                        lost = "stalled"
                    self.outliers.failure(state)
                moved = await self.migrator.continue_on(
                    self.pool, ctx, splice, lost or "broken", state, headers
                )
                if isinstance(moved, str):  # the client gets an error event, the stream ends
                    ctx.error = f"{ctx.error or 'stream lost'}; not continued: {moved}"
                    data = (
                        splice.error_event + b"data: [DONE]\n\n"
                        if splice.error_event
                        else failed_event(
                            f"the model server was lost mid-stream and {moved}",
                            self.config.activator_retry_after if moved == NO_REPLICA else None,
                        )
                    )
                    await (out.write(data) if out.prepared else out.prepare(ctx.request, data))
                    ctx.upstream_broken = True
                    break
                state.add_inflight(-1)
                resp.release()
                state, resp, chunk = moved
                ctx.error, ctx.upstream_broken = None, False
                watch.resp, watch.address = resp, state.endpoint.address
                watch.stalled = watch.waiting = watch.drained = False
            if not out.prepared:  # an empty body
                await out.prepare(ctx.request)
            if relay is not None and (rest := relay.flush()):
                await out.write(rest)
            ctx.usage = Usage.of(scanner.usage)
            ctx.events = scanner.events
            if splice is None and watch.stalled:
                # A frozen replica: the client gets an error event and a complete response.
                ctx.error = f"stream stalled: no bytes for {watch.stall:g} s"
                if self.stalls is not None:
                    self.stalls.labels(ctx.decision.route).inc()
                await out.write(stall_event(watch.stall, ctx.request.path))
                await out.write_eof()
            elif splice is not None or not ctx.upstream_broken:
                # Complete (a spliced stream: its [DONE], or an error event and [DONE]); a
                # broken one gets no final chunk: the client sees it truncated.
                await out.write_eof()
            return out
        except ConnectionError as err:
            ctx.error = f"client went away: {err}"
            return out
        finally:
            self._streams.discard(watch)
            state.add_inflight(-1)
            ctx.end = time.perf_counter()
            resp.release()
