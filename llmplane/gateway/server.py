"""The gateway: an OpenAI-compatible HTTP server that routes each request to the best replica.

A request goes: read the body (413 over the limit) -> parse it once (400) -> resolve the route
against the current routing table (404 / 503) -> request hooks reserve (rate limits) ->
admission (Sheddable traffic gets 429 when every candidate is saturated) -> scheduler (filters,
weighted scorers, picker: an ordered fallback list) -> proxy with timeout and retries on the
next endpoint while nothing has reached the client -> relay the upstream bytes untouched while
reading usage -> hooks settle, metrics, one access-log line.

The routing table is immutable and rebuilt whenever a routing object in the store or the
endpoint list changes; the reference is swapped atomically, so in-flight requests finish on
the table they started with.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from llmplane.gateway.config import ConfigFileError, GatewayConfig, load_checked
from llmplane.gateway.discovery import Discovery
from llmplane.gateway.errors import GatewayError
from llmplane.gateway.hooks import Usage
from llmplane.gateway.http_server import Handler, HttpServer, Request, Response, StreamResponse
from llmplane.gateway.observability import GatewayMetrics, log_access
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.pd import serve_pd
from llmplane.gateway.ratelimit import RateLimiter
from llmplane.gateway.registry import EndpointRegistry, EndpointState
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.routing import ROUTE_KINDS, Decision, RoutingTable, build_table
from llmplane.gateway.scheduler.config import build_scheduler
from llmplane.gateway.scheduler.framework import Pick, SchedulingContext
from llmplane.gateway.scraper import Scraper
from llmplane.gateway.store_follower import StoreFollower
from llmplane.gateway.upstream_client import (
    RawHeaders,
    UpstreamPool,
    UpstreamResponse,
    encode_request,
)
from llmplane.gateway.usage import StreamScanner, extract_usage

log = logging.getLogger("llmplane.gateway")

ENDPOINT_HEADER = "x-llmplane-endpoint"
INFERENCE_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")

# Not forwarded in either direction (RFC 9110 7.6.1), plus what aiohttp sets itself.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
    }
)
_HOP_RESPONSE = frozenset(
    name.encode() for name in (_HOP - {"accept-encoding"}) | {"server", "date"}
)


class _Failed(Exception):
    """One attempt failed in a way worth retrying elsewhere."""

    def __init__(
        self,
        kind: str,
        detail: str,
        status: int | None = None,
        body: bytes = b"",
        headers: Any = None,
    ):
        super().__init__(detail)
        self.kind = kind  # connect | timeout | status
        self.detail = detail
        self.status = status
        self.body = body
        self.headers = headers


class Gateway:
    def __init__(
        self, store: Any, discovery: Discovery, config: GatewayConfig | None = None
    ) -> None:
        self.config = config or GatewayConfig()
        self.store = store
        self.discovery = discovery
        self.registry = EndpointRegistry()
        self.scheduler = build_scheduler(self.config.scheduler)
        self.scraper = Scraper(self.config)
        self.metrics = GatewayMetrics(self)
        self.outliers = Outliers(
            self.config,
            on_eject=lambda s: self.metrics.ejections.labels(s.address).inc(),
        )
        # Token rate limits (ModelRoute.spec.rateLimit) run as the first request hook.
        self.ratelimiter = RateLimiter(self.config, self.metrics.registry)
        self.hooks = [self.ratelimiter, *self.config.hooks]
        self.table = RoutingTable()
        self._objects: dict[Any, dict[str, Any]] = {}
        self._follower: StoreFollower | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self.pool: UpstreamPool | None = None
        self.http: HttpServer | None = None
        self.port = 0
        self.host = "127.0.0.1"
        self._leaving: dict[str, EndpointState] = {}

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._loop = asyncio.get_running_loop()
        # Proxied requests go through this lean keep-alive client (see upstream.py).
        self.pool = UpstreamPool(
            limit=self.config.connection_limit,
            keepalive_timeout=self.config.keepalive_timeout,
            connect_timeout=self.config.connect_timeout,
        )
        self.discovery.subscribe(self._endpoints_changed)
        self._started = True
        self._sync_endpoints()
        if self.store is not None:
            self._follower = StoreFollower(self.store, ROUTE_KINDS, self._objects_changed)
            await self._follower.start()
        for source in self._discovery_sources():
            start = getattr(source, "start", None)
            if start is not None and asyncio.iscoroutinefunction(start):
                await start()
        self.http = HttpServer(
            routes(self),
            self.not_found,
            max_body=self.config.max_body_bytes,
            keepalive_timeout=self.config.client_keepalive_timeout,
            header_timeout=self.config.client_header_timeout,
            max_connections=self.config.max_client_connections,
        )
        self.host = host
        self.port = await self.http.start(host, port)
        log.info("gateway listening on %s:%d", host, self.port)

    def _discovery_sources(self) -> list[Any]:
        sources = getattr(self.discovery, "sources", None)
        return [*sources] if sources else [self.discovery]

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close(self.config.shutdown_grace)
            self.http = None
        if self._follower is not None:
            await self._follower.close()
        for source in self._discovery_sources():
            close = getattr(source, "close", None)
            if close is not None and asyncio.iscoroutinefunction(close):
                await close()
        await self.scraper.close()
        await self.ratelimiter.close()
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    # --- routing table -------------------------------------------------------------------------

    def _objects_changed(self, objects: dict[Any, dict[str, Any]]) -> None:
        self._objects = objects
        self.ratelimiter.update(objects.values())
        self._rebuild()

    def _endpoints_changed(self) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._sync_endpoints()
        else:  # a runtime thread told us
            loop.call_soon_threadsafe(self._sync_endpoints)

    def _sync_endpoints(self) -> None:
        added, removed = self.registry.sync(self.discovery.endpoints())
        for state in removed:
            self.scraper.remove(state)
            self.scheduler.on_remove(state)
            self._leaving[state.endpoint.address] = state  # still counted while draining
        for state in added:
            self.scraper.add(state)
        self._rebuild()

    def inflight(self, address: str) -> int:
        """Requests this gateway has in flight to ``address``, also after it stopped being an
        endpoint: the runtime drains a replica until this reaches 0."""
        state = self.registry.states.get(address) or self._leaving.get(address)
        if state is None:
            return 0
        if state.inflight == 0 and address in self._leaving:
            del self._leaving[address]
        return state.inflight

    def _rebuild(self) -> None:
        self.table = build_table(self._objects.values(), self.registry.states.values(), self.config)

    # --- request path -----------------------------------------------------------------------------

    def saturated(self, state: EndpointState, now: float) -> bool:
        c = self.config
        if state.has_load_metrics is False or (
            state.has_load_metrics is None and not state.scraped_at
        ):
            return state.inflight >= c.saturation_inflight
        if not state.metrics_fresh(c.metrics_staleness, now):
            return True
        return state.queue_estimate(c.metrics_staleness, now) > c.saturation_queue or (
            state.has_kv and state.kv_usage > c.saturation_kv
        )

    async def handle(self, request: Request) -> StreamResponse:
        t0 = time.perf_counter()
        record: dict[str, Any] = {"method": request.method, "path": request.path}
        status = 500
        decision: Decision | None = None
        req: InferenceRequest | None = None
        reservations: list[tuple[Any, Any]] = []
        outcome = _Outcome()
        try:
            body = self._body(request)
            req = InferenceRequest(request.path, request.headers, body)
            record["model"] = req.model
            record["stream"] = req.stream
            decision = self.table.resolve(req.model, request.path, request.headers)
            record["route"] = decision.route
            for hook in self.hooks:
                reservation = await hook.reserve(req, decision)
                reservations.append((hook, reservation))
                if reservation is not None:
                    outcome.adopt(reservation)
            if decision.model != req.model:
                req.rewrite_model(decision.model)
                record["sent_model"] = decision.model
            response = await self._serve(request, req, decision, record, outcome, t0)
            status = response.status
            return response
        except GatewayError as err:
            status = err.status
            record["error"] = err.message
            if err.code == "overloaded" and req is not None:
                self.metrics.shed.labels(req.model).inc()
            return err.response()
        except asyncio.CancelledError:
            status = 499
            raise
        finally:
            usage = Usage.of(outcome.usage)
            for hook, reservation in reservations:
                try:
                    await hook.settle(req, decision, reservation, usage, status)
                except Exception:
                    log.exception("request hook settle failed")
            self._observe(record, req, decision, outcome, status, usage, t0)

    def _body(self, request: Request) -> bytes:
        """The body, or 413 if the HTTP server found it over the limit (and did not keep it)."""
        if request.too_large:
            limit = self.config.max_body_bytes
            length = request.content_length
            size = f" ({length} bytes)" if length is not None else ""
            raise GatewayError(
                413,
                f"the request body{size} is over the limit of {limit} bytes",
                "request_too_large",
            )
        return request.body

    async def _serve(
        self,
        request: Request,
        req: InferenceRequest,
        decision: Decision,
        record: dict[str, Any],
        outcome: _Outcome,
        t0: float,
    ) -> StreamResponse:
        backend = decision.backend
        if not backend.candidates:
            raise GatewayError(
                503,
                f"model {req.model!r} has no ready endpoint ({backend.ref} selects none)",
                "no_ready_endpoint",
            )
        now = time.monotonic()
        candidates = self.outliers.available(backend.candidates, now)
        if decision.criticality == "Sheddable" and all(self.saturated(s, now) for s in candidates):
            raise GatewayError(
                429,
                f"model {req.model!r} is overloaded: every endpoint is saturated and this "
                "request is Sheddable; retry later",
                "overloaded",
                retry_after=self.config.shed_retry_after,
            )
        ts = time.perf_counter()
        ctx = SchedulingContext(
            decision.model,
            lambda: req.prompt,
            request.headers,
            decision.lora,
            self.config.metrics_staleness,
            now,
        )
        if backend.pd is not None and not req.path.endswith("/embeddings"):
            # Prefill/decode disaggregation (pd.py): a prefill replica, then a decode replica.
            return await serve_pd(
                self, request, req, decision, candidates, ctx, record, outcome, t0
            )
        attempts = max(0, backend.retry_attempts)
        n = min(len(candidates), max(self.config.fallbacks, attempts + 1))
        pick = self.scheduler.pick(ctx, candidates, n, backend.profile)
        sched = time.perf_counter() - ts
        self.metrics.scheduling.observe(sched)
        record["sched_ms"] = round(sched * 1000, 3)
        record["profile"] = pick.profile
        record["scores"] = pick.scores
        body = req.final_body()
        headers = forwarded_headers(request)
        return await self._proxy(
            request, req, decision, pick, ctx, body, headers, record, outcome, t0
        )

    async def _proxy(
        self,
        request: Request,
        req: InferenceRequest,
        decision: Decision,
        pick: Pick,
        ctx: SchedulingContext,
        body: bytes,
        headers: dict[str, str],
        record: dict[str, Any],
        outcome: _Outcome,
        t0: float,
    ) -> StreamResponse:
        backend = decision.backend
        order = pick.endpoints
        attempts = max(0, backend.retry_attempts)
        timeout = backend.timeout
        profile = self.scheduler.profile(backend.profile)
        last: _Failed | None = None
        tried = 0
        for attempt in range(attempts + 1):
            state = order[attempt % len(order)]
            if attempt:
                self.metrics.retries.labels(decision.route).inc()
                if backend.retry_interval > 0:
                    await asyncio.sleep(backend.retry_interval)
            tried += 1
            profile.on_pick(ctx, state)
            state.inflight += 1
            address = backend.address(state)
            outcome.endpoint = address
            wire = encode_request("POST", request.path_qs, address, headers, body)
            may_retry = attempt < attempts
            try:
                # Both release the in-flight count themselves, however they end.
                if req.stream:
                    response = await self._stream(
                        request, address, wire, timeout, state, outcome, t0, may_retry
                    )
                else:
                    response = await self._unary(address, wire, timeout, state, outcome, may_retry)
            except _Failed as failure:
                last = failure
                self.outliers.failure(state)
                record.setdefault("failures", []).append(f"{address}: {failure.detail}")
                continue
            if (outcome.status or 0) >= 500 or outcome.upstream_broken:
                self.outliers.failure(state)
            else:
                self.outliers.success(state)
            record["attempts"] = tried
            return response
        record["attempts"] = tried
        assert last is not None
        if last.kind == "timeout":
            raise GatewayError(
                504,
                f"model {req.model!r}: no response within {timeout} s "
                f"({tried} attempt{'s' if tried > 1 else ''}); last: {last.detail}",
                "upstream_timeout",
                endpoint=outcome.endpoint,
            )
        raise GatewayError(
            502,
            f"model {req.model!r}: could not get a response from any endpoint "
            f"({tried} attempt{'s' if tried > 1 else ''}); last: {last.detail}",
            "bad_gateway",
            endpoint=outcome.endpoint,
        )

    async def _unary(
        self,
        address: str,
        wire: bytes,
        timeout: float | None,
        state: EndpointState,
        outcome: _Outcome,
        may_retry: bool,
    ) -> Response:
        assert self.pool is not None
        try:
            try:
                status, upstream_headers, data = await self.pool.request(address, wire, timeout)
            except TimeoutError:
                raise _Failed("timeout", f"timed out after {timeout} s") from None
            except (aiohttp.ClientError, OSError) as err:
                raise _Failed("connect", f"{type(err).__name__}: {err}") from None
        finally:
            state.inflight -= 1
        if status >= 500 and may_retry:
            raise _Failed("status", f"HTTP {status}", status, data, upstream_headers)
        # On the last attempt an engine's own 5xx goes to the client as it is.
        outcome.status = status
        if status < 400 and b'"usage"' in data:
            outcome.usage = extract_usage(data)
        return Response(
            status=status,
            body=data,
            **_relayed(upstream_headers, outcome.endpoint, outcome.headers),
        )

    async def _stream(
        self,
        request: Request,
        address: str,
        wire: bytes,
        timeout: float | None,
        state: EndpointState,
        outcome: _Outcome,
        t0: float,
        may_retry: bool,
    ) -> StreamResponse:
        """The timeout covers connect + response headers + first chunk (time to first byte);
        once a byte has been sent to the client the request is never retried."""
        assert self.pool is not None
        resp: UpstreamResponse | None = None
        try:
            try:
                async with asyncio.timeout(timeout):
                    resp = await self.pool.open(address, wire)
                    if resp.status >= 500 and may_retry:
                        data = await resp.read()
                        raise _Failed(
                            "status", f"HTTP {resp.status}", resp.status, data, resp.headers
                        )
                    first = await resp.readany()
            except TimeoutError:
                raise _Failed("timeout", f"no first byte within {timeout} s") from None
            except (aiohttp.ClientError, OSError) as err:
                raise _Failed("connect", f"{type(err).__name__}: {err}") from None
        except BaseException:
            state.inflight -= 1
            if resp is not None:
                resp.release()
            raise
        try:
            outcome.ttft = time.perf_counter() - t0
            outcome.status = resp.status
            out = StreamResponse(
                status=resp.status,
                **_relayed(resp.headers, outcome.endpoint, outcome.headers),
            )
            await out.prepare(request)
            scanner = StreamScanner()
            relay = outcome.relay  # a hook's stream filter (drops an injected usage chunk)
            chunk = first
            while chunk:
                scanner.feed(chunk)
                data = chunk if relay is None else relay.feed(chunk)
                if data:
                    await out.write(data)  # a client that went away raises here
                try:
                    chunk = await resp.readany()
                except (aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as err:
                    # The replica broke mid-stream; the client sees a truncated stream.
                    outcome.error = f"stream broken: {type(err).__name__}: {err}"
                    outcome.upstream_broken = True
                    break
            if relay is not None and (rest := relay.flush()):
                await out.write(rest)
            outcome.usage = scanner.usage
            outcome.events = scanner.events
            if not outcome.upstream_broken:
                await out.write_eof()
            return out
        except (ConnectionResetError, ConnectionError) as err:
            outcome.error = f"client went away: {err}"
            return out
        finally:
            state.inflight -= 1
            outcome.end = time.perf_counter()
            resp.release()

    def _observe(
        self,
        record: dict[str, Any],
        req: InferenceRequest | None,
        decision: Decision | None,
        outcome: _Outcome,
        status: int,
        usage: Usage | None,
        t0: float,
    ) -> None:
        elapsed = time.perf_counter() - t0
        m = self.metrics
        model = req.model if req is not None else ""
        route = decision.route if decision is not None else ""
        m.requests.labels(model, route, outcome.endpoint or "", str(status)).inc()
        m.e2e.labels(model).observe(elapsed)
        if usage is not None:
            if usage.prompt_tokens:
                m.prompt_tokens.labels(model).inc(usage.prompt_tokens)
            if usage.completion_tokens:
                m.output_tokens.labels(model).inc(usage.completion_tokens)
        if outcome.ttft is not None:
            m.ttft.labels(model).observe(outcome.ttft)
            tokens = (
                usage.completion_tokens
                if usage is not None and usage.completion_tokens
                else outcome.events - 1
            )
            if tokens > 1 and outcome.end:
                m.tpot.labels(model).observe((outcome.end - t0 - outcome.ttft) / (tokens - 1))
        record["status"] = status
        record["endpoint"] = outcome.endpoint
        record["total_ms"] = round(elapsed * 1000, 3)
        if outcome.ttft is not None:
            record["ttft_ms"] = round(outcome.ttft * 1000, 3)
        if usage is not None:
            record["prompt_tokens"] = usage.prompt_tokens
            record["completion_tokens"] = usage.completion_tokens
        if outcome.error:
            record["error"] = outcome.error
        log_access(record)

    # --- other endpoints ---------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "llmplane"}
            for name in self.table.model_names()
        ]
        return Response(
            body=orjson.dumps({"object": "list", "data": data}), content_type="application/json"
        )

    async def health(self, request: Request) -> Response:
        return Response(body=b'{"status":"ok"}', content_type="application/json")

    async def prometheus(self, request: Request) -> Response:
        return Response(
            body=self.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"}
        )

    async def not_found(self, request: Request) -> Response:
        return GatewayError(
            404, f"no such path: {request.method} {request.path}", "not_found"
        ).response()


class _Outcome:
    __slots__ = (
        "end",
        "endpoint",
        "error",
        "events",
        "headers",
        "relay",
        "status",
        "ttft",
        "upstream_broken",
        "usage",
    )

    def __init__(self) -> None:
        self.endpoint: str | None = None
        self.usage: dict[str, Any] | None = None
        self.ttft: float | None = None
        self.end = 0.0
        self.events = 0
        self.status: int | None = None
        self.error: str | None = None
        self.upstream_broken = False
        self.headers: dict[str, str] | None = None  # added to the response by hooks
        self.relay: Any = None  # a hook's stream filter: feed(bytes) -> bytes, flush()

    def adopt(self, reservation: Any) -> None:
        """Take a hook reservation's ``response_headers`` and ``stream_filter``."""
        extra = getattr(reservation, "response_headers", None)
        if extra:
            self.headers = {**self.headers, **extra} if self.headers else extra
        relay = getattr(reservation, "stream_filter", None)
        if relay is not None:
            self.relay = relay


def forwarded_headers(request: Request) -> dict[str, str]:
    """The client's headers to send upstream: all but hop-by-hop ones (names are lower-case)."""
    return {k: v for k, v in request.headers.items() if k not in _HOP}


def _relayed(
    upstream: RawHeaders, endpoint: str | None, extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Keyword arguments for a Response relaying an upstream one: its header lines as they
    came (less hop-by-hop ones and those the gateway sets itself), plus the endpoint header
    and any a hook added."""
    headers = {ENDPOINT_HEADER: endpoint} if endpoint else {}
    if extra:
        headers.update(extra)
    return {"raw_headers": upstream.forward(_HOP_RESPONSE), "headers": headers}


def routes(gateway: Gateway) -> dict[tuple[str, str], Handler]:
    """(method, path) -> handler; anything else is ``gateway.not_found`` (HEAD follows GET)."""
    table: dict[tuple[str, str], Handler] = {
        ("POST", path): gateway.handle for path in INFERENCE_PATHS
    }
    table[("GET", "/v1/models")] = gateway.models
    table[("GET", "/health")] = gateway.health
    table[("GET", "/metrics")] = gateway.prometheus
    return table


async def start_gateway(
    store: Any,
    discovery: Discovery,
    host: str = "127.0.0.1",
    port: int = 0,
    config: GatewayConfig | None = None,
) -> Gateway:
    """Start a gateway on ``host:port`` (0 = any free port; see ``gateway.port``)."""
    gateway = Gateway(store, discovery, config)
    try:
        await gateway.start(host, port)
    except BaseException:
        await gateway.close()
        raise
    return gateway


# --- standalone ------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmplane gateway",
        description="Serve the OpenAI API and route to the endpoints registered in the store.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--state-dir", default=None, help="state directory (default $LLMPLANE_HOME or ~/.llmplane)"
    )
    parser.add_argument(
        "--config", default=None, help="scheduler.yaml (EndpointPickerConfig + gateway: settings)"
    )
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--no-access-log", action="store_true", help="do not print one JSON line per request"
    )
    kube = parser.add_argument_group("Kubernetes (in-cluster)")
    kube.add_argument(
        "--kubernetes",
        action="store_true",
        help="read routes from the Kubernetes API and route to ready Pods (in-cluster config, "
        "else kubeconfig) instead of the state directory",
    )
    kube.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="with --kubernetes: namespace to read (repeatable; default 'all')",
    )
    kube.add_argument("--kube-server", help=argparse.SUPPRESS)  # API server URL (development)
    return parser


class StartupError(Exception):
    """The gateway cannot start for a reason the user can fix (said in one line)."""


async def serve(args: argparse.Namespace, config: GatewayConfig) -> None:
    from llmplane.gateway.discovery.store_endpoints import StoreEndpoints
    from llmplane.store.paths import open_store

    if getattr(args, "kubernetes", False):
        from llmplane.gateway.discovery.pods import kubernetes_sources, parse_namespaces

        try:
            store, discovery = await kubernetes_sources(
                parse_namespaces(args.namespace), args.kube_server
            )
        except Exception as e:  # kubernetes_asyncio's config and connection errors
            raise StartupError(
                "--kubernetes: no usable Kubernetes API (in-cluster config, else kubeconfig): "
                f"{type(e).__name__}: {e}"
            ) from None
    else:
        store = open_store(args.state_dir)
        discovery = StoreEndpoints(store)

    async def close_store() -> None:
        aclose = getattr(store, "aclose", None)  # the Kubernetes store closes its API client
        await aclose() if aclose is not None else store.close()

    try:
        gateway = await start_gateway(store, discovery, args.host, args.port, config)
    except OSError as e:
        await close_store()
        raise StartupError(
            f"cannot listen on {args.host}:{args.port}: {e.strerror or e} "
            "(pass --port N, or --port 0 for any free port)"
        ) from None
    print(f"LISTENING {gateway.host}:{gateway.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await gateway.close()
        await close_store()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = GatewayConfig()
    if args.config is not None:
        try:
            config = load_checked(args.config)
        except ConfigFileError as e:
            print(f"llmplane gateway: {e}", file=sys.stderr)
            return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    access = logging.getLogger("llmplane.gateway.access")
    access.propagate = False
    if args.no_access_log:
        access.setLevel(logging.WARNING)
    else:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        access.addHandler(handler)
        access.setLevel(logging.INFO)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    try:
        with contextlib.suppress(KeyboardInterrupt):
            runner(serve(args, config))
    except StartupError as e:
        print(f"llmplane gateway: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
