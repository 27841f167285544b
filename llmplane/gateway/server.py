"""The gateway: an OpenAI-compatible HTTP server that routes each request to the best replica.

A request (``Gateway.handle``, one ``RequestContext`` carried through) goes: read the body
(413 over the limit) -> parse it once (400) -> resolve the route against the current routing
table (404 / 503) -> request hooks reserve (rate limits) -> admission (Sheddable traffic gets
429 when every candidate is saturated) -> scheduler (filters, weighted scorers, picker: an
ordered fallback list) -> proxy (``proxy.py``; prefill/decode pairs in ``pd.py``) with timeout
and retries on the next endpoint while nothing has reached the client, relaying the upstream
bytes untouched while reading usage -> hooks settle, metrics, one access-log line.

The routing table is immutable and rebuilt whenever a routing object in the store or the
endpoint list changes; the reference is swapped atomically, so in-flight requests finish on
the table they started with. The standalone command is ``cli.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from llmplane.aio import call_on
from llmplane.gateway.activator import Activator
from llmplane.gateway.adapters import Adapters
from llmplane.gateway.admission import Admission
from llmplane.gateway.auth import KIND as TENANT_KIND
from llmplane.gateway.auth import SECRET_KIND, Authenticator, Tenant
from llmplane.gateway.clip import clip
from llmplane.gateway.config import GatewayConfig, client_connection_limit
from llmplane.gateway.context import RequestContext
from llmplane.gateway.discovery import CombinedDiscovery, Discovery, Following
from llmplane.gateway.errors import GatewayError
from llmplane.gateway.exposure import is_loopback, make_guard
from llmplane.gateway.flowcontrol import FlowControl, Limits
from llmplane.gateway.flowcontrol.priority import level_of
from llmplane.gateway.hooks import LATER, Held, RequestHook, Reservation, Usage
from llmplane.gateway.http_server import Handler, HttpRequest, HttpServer, Response, StreamResponse
from llmplane.gateway.kvcache.routing import PreciseRouting
from llmplane.gateway.observability import GatewayMetrics, access_log, write_access
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.pd import PrefillDecode
from llmplane.gateway.protocols import PATHS as API_PATHS
from llmplane.gateway.protocols import error_response
from llmplane.gateway.proxy import Proxy
from llmplane.gateway.ratelimit import RateLimiter
from llmplane.gateway.registry import EndpointRegistry, EndpointState
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.routing import (
    ROUTE_KINDS,
    Decision,
    RoutingTable,
    build_table,
    model_not_found,
)
from llmplane.gateway.scheduler.config import build_scheduler
from llmplane.gateway.scheduler.framework import Pick, SchedulingContext
from llmplane.gateway.scheduler.precise_prefix import ModelTokens
from llmplane.gateway.scraper import Scraper
from llmplane.gateway.signals import GatewaySignals
from llmplane.gateway.store_follower import StoreFollower
from llmplane.gateway.tenant_usage import TenantUsage, usage_log_for
from llmplane.gateway.tokenization import Tokenization
from llmplane.store.base import Store

if TYPE_CHECKING:
    from llmplane.gateway.workers.share import Seat

log = logging.getLogger("llmplane.gateway")

INFERENCE_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", *API_PATHS)
UNKNOWN_MODEL = ""  # the metrics' model label for requests no route resolved


class Extension(Protocol):
    """More routes beside the API's, started and closed with the gateway (the web console,
    ``llmplane.console.api.Console``). Its routes never replace the gateway's own."""

    def routes(self) -> dict[tuple[str, str], Handler]: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class Gateway:
    def __init__(
        self,
        store: Store | None,
        discovery: Discovery,
        config: GatewayConfig | None = None,
        seat: Seat | None = None,
    ) -> None:
        self.config = config or GatewayConfig()
        self.store = store
        self.discovery = discovery
        # One of several worker processes (llmplane/gateway/workers): in-flight counts, token
        # buckets and /metrics shared with the others.
        self.seat = seat
        self._warm: Callable[[str], bool] | None = None  # set at start (a worker's own pool)
        self.registry = EndpointRegistry(seat.endpoint_state if seat else EndpointState)
        self.scheduler = build_scheduler(self.config.scheduler)
        self.metrics = GatewayMetrics(self)
        # The replicas' KV events and the precise prefix scorer (gateway/kvcache/routing.py).
        self.kv = PreciseRouting(self.scheduler, self.metrics.registry, not self.config.scheduler)
        if seat is not None:
            seat.picks.attach(self.scheduler.plugins)
        self.scraper = Scraper(self.config, on_models_changed=self._rebuild)
        self.adapters = Adapters(self.scraper.client)
        self.outliers = Outliers(
            self.config,
            on_eject=lambda s: self.metrics.ejections.labels(s.address).inc(),
        )
        self.admission = Admission(self.config, self.outliers)
        c = self.config
        self.flow = FlowControl(
            self.admission.all_saturated,
            enabled=c.flow_control,
            ttl=c.flow_control_ttl,
            limits=Limits(
                c.flow_control_band_requests,
                c.flow_control_band_bytes,
                c.flow_control_total_requests,
                c.flow_control_total_bytes,
            ),
            retry_after=c.shed_retry_after,
            reserve=c.flow_control_reserve,
            saturated_by=self.admission.saturated,
        )
        self.metrics.add(self.flow.metrics.all())
        self.metrics.registry.register(self.flow.collector)  # type: ignore[arg-type]
        self.scraper.on_scraped = self._capacity_changed
        self.scrape_follower = (
            seat.share_scrapes(
                self.scraper, lambda: self.registry.states.values(), self._capacity_changed
            )
            if seat is not None
            else None
        )
        self.auth = Authenticator(self.config.admin_key_hash)
        self.metrics.add([self.auth.requests])
        self.activator = Activator(self.config)
        self.metrics.add(self.activator.metrics.all())
        self.metrics.registry.register(self.activator.collector)  # type: ignore[arg-type]
        self.proxy = Proxy(
            self.config,
            self.outliers,
            self.metrics.retries,
            self.metrics.stalls,
            self.metrics.resends,
        )
        self.scraper.upstream = lambda: self.proxy.pool  # scrapes keep routed connections warm
        if self.config.saturation_max_prefilling:  # a first chunk frees a prefill's room
            self.proxy.first_chunk = self._capacity_changed
        self.pd = PrefillDecode(
            self.config, self.proxy, self.scheduler, self.outliers, self.metrics
        )
        # Rate limits (ModelRoute and Tenant rateLimit) run as the first request hook, then
        # the tenants' usage counters (what a rate limit refused is not usage).
        self.ratelimiter = RateLimiter(
            self.config, self.metrics.registry, make_bucket=seat.bucket if seat else None
        )
        self.usage = TenantUsage(
            usage_log_for(store, self.config.usage_log), self.config.usage_flush_interval
        )
        self.metrics.add(self.usage.metrics())
        # The engines' token ids per model (precise prefix-cache routing) and the canary check
        # of the model's own tokenizer against each engine's /tokenize.
        self.tokenization = Tokenization()
        self.kv.add_tokens(ModelTokens(self.tokenization))  # before the sim's own
        self.metrics.add(self.tokenization.metrics())
        self.hooks = [self.ratelimiter, self.usage, *self.config.hooks]
        self.table = RoutingTable()
        self._objects: dict[Any, dict[str, Any]] = {}
        self._follower: StoreFollower | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.http: HttpServer | None = None
        self.port = 0
        self.host = "127.0.0.1"
        self._leaving: dict[str, EndpointState] = {}
        self.extensions: list[Extension] = []  # the web console
        # (model, route, endpoint, status) -> the request metrics' children for it: one
        # lookup per request instead of four label lookups.
        self._series: dict[tuple[str, str, str, int], tuple[Any, Any, Any, Any]] = {}
        self._tenant_series: dict[tuple[str, int], Any] = {}  # (tenant, status) -> its child
        self._scheduling = self.metrics.scheduling.labels()  # unlabelled: its one child

    @property
    def hooks(self) -> list[RequestHook]:
        return self._hooks

    @hooks.setter
    def hooks(self, hooks: list[RequestHook]) -> None:
        """The request hooks, with each one's plain-function entries (``reserve_now`` /
        ``settle_now``, ``hooks.SyncRequestHook``) looked up once."""
        self._hooks = list(hooks)
        self._hook_calls = [
            (hook, getattr(hook, "reserve_now", None), getattr(hook, "settle_now", None))
            for hook in self._hooks
        ]

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        await self.start_routing()
        self.proxy.start()
        if self.seat is not None and not self.seat.scrapes and self.proxy.pool is not None:
            # Its pool is warm only to the endpoints it used lately (the scraping worker's
            # scrapes keep its own warm to all): among equally scored endpoints, prefer those.
            self._warm = self.proxy.pool.warm
        for extension in self.extensions:
            await extension.start()
        self.http = HttpServer(
            routes(self),
            self.not_found,
            max_body=self.config.max_body_bytes,
            max_body_total=self.config.max_body_bytes_total,
            keepalive_timeout=self.config.client_keepalive_timeout,
            header_timeout=self.config.client_header_timeout,
            body_timeout=self.config.client_body_timeout,
            max_connections=client_connection_limit(self.config),
            guard=make_guard(host, self.config.allowed_hosts, self.config.allowed_origins),
        )
        self.host = host
        self.auth.loopback = is_loopback(host)
        if self.seat is not None:
            await self.seat.metrics.start(
                self.metrics.render, GatewaySignals(self).parts, self.seat.handlers
            )
        self.port = await self.http.start(
            host, port, sock=self.seat.sock if self.seat is not None else None
        )
        log.info(
            "gateway listening on %s:%d (client connections at most %s)",
            host,
            self.port,
            self.http.max_connections or "unlimited",
        )
        if not self.auth.loopback and self.auth.table.tenants == 0:
            log.warning(
                "listening on %s, beyond loopback, and no Tenant exists: every inference "
                "request is refused (401) until one has a key (`llmplane keys create TENANT`); "
                "see docs/security.md",
                host,
            )

    async def start_routing(self) -> None:
        """The routing state without the HTTP server: follow the store and the endpoints,
        scrape them. The endpoint picker (``llmplane/epp``) runs on this alone."""
        self._loop = asyncio.get_running_loop()
        self.discovery.subscribe(self._endpoints_changed)
        self._sync_endpoints()
        if self.store is not None:
            self._follower = StoreFollower(
                self.store, (*ROUTE_KINDS, TENANT_KIND, SECRET_KIND), self._objects_changed
            )
            await self._follower.start()
        for source in self._following():
            await source.start()
        if self.scrape_follower is not None:
            self.scrape_follower.start()
        if self.seat is not None:
            self.seat.waker.start(self.flow.pump)
        self.usage.start()

    def _following(self) -> list[Following]:
        """The discovery sources that follow a watch of their own."""
        discovery = self.discovery
        sources = discovery.sources if isinstance(discovery, CombinedDiscovery) else (discovery,)
        return [s for s in sources if isinstance(s, Following)]

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close(self.config.shutdown_grace)
            self.http = None
        for extension in self.extensions:
            await extension.close()
        if self.seat is not None:
            await self.seat.metrics.close()
            self.seat.waker.close()
        if self._follower is not None:
            await self._follower.close()
        for source in self._following():
            await source.close()
        await self.scraper.close()
        if self.scrape_follower is not None:
            await self.scrape_follower.close()
        await self.ratelimiter.close()
        await self.usage.close()
        await self.tokenization.close()
        await self.kv.close()
        await self.proxy.close()

    # --- routing table -------------------------------------------------------------------------

    def _objects_changed(self, objects: dict[Any, dict[str, Any]]) -> None:
        self._objects = objects
        self.auth.update(objects.values())
        self.ratelimiter.update(objects.values())
        self._rebuild()

    def _endpoints_changed(self) -> None:
        call_on(self._loop, self._sync_endpoints)  # perhaps a runtime thread told us

    def _sync_endpoints(self) -> None:
        endpoints = self.discovery.endpoints()
        self.tokenization.follow(endpoints)
        added, removed = self.registry.sync(endpoints)
        self.kv.sync(endpoints)
        for state in removed:
            self.scraper.remove(state)
            self.adapters.forget(state.address)
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
        if self.activator.queues:
            self.activator.release(self.table.activatable.__contains__)
        self._capacity_changed()

    def _capacity_changed(self) -> None:
        """A request finished, an endpoint was scraped or the endpoints changed: requests
        waiting in flow control may go (one attribute read when none waits)."""
        if self.flow.queues:
            self.flow.pump()

    # --- request path -----------------------------------------------------------------------------

    async def handle(self, request: HttpRequest) -> StreamResponse:
        ctx = RequestContext(request)
        reservations: list[Held] = []
        try:
            body = self._body(request) if request.too_large else request.body
            ctx.inference = InferenceRequest(request.path, request.headers, body)
            pending = self.route_now(ctx, reservations)
            if pending is not None:
                await pending
            response = await self._serve(ctx)
            ctx.status = response.status
            return response
        except GatewayError as err:
            self.refused(ctx, err)
            return error_response(request.path, err)  # in the API's own shape
        except asyncio.CancelledError:
            ctx.status = 499
            raise
        finally:
            if not self.finish_now(ctx, reservations):
                await self.finish(ctx, reservations)

    # The stages below are shared with the endpoint picker (llmplane/epp), which runs them on
    # Envoy's ext_proc stream instead of an HTTP request.

    async def route(self, ctx: RequestContext, reservations: list[Held]) -> Decision:
        """Authenticate the caller (401 / 403, ``gateway/auth.py``), resolve ``ctx.inference``
        in the routing table (404 / 503; a route without a criticality takes the tenant's),
        let the request hooks reserve (429 from a route's or the tenant's rate limit; each
        reservation is appended for ``finish``), and rewrite the model the route sends."""
        pending = self.route_now(ctx, reservations)
        if pending is not None:
            await pending
        return ctx.decision  # type: ignore[return-value]

    def route_now(self, ctx: RequestContext, reservations: list[Held]) -> Awaitable[None] | None:
        """``route`` without a coroutine while nothing in it waits (a route with ready
        replicas, hooks that reserve by plain functions: the usual case); else the awaitable
        that does the rest (await it)."""
        inference = ctx.inference
        assert inference is not None
        tenant = self.auth.authenticate(ctx.request.headers)
        if tenant is not None:
            ctx.tenant = tenant.name
            ctx.weight = tenant.weight
            self.auth.permit(tenant, inference.model)
        try:
            decision = self.table.resolve(inference.model, inference.path, ctx.request.headers)
        except GatewayError as err:
            return self._route_held(ctx, reservations, tenant, err)
        if not decision.backend.candidates and inference.model in self.table.activatable:
            return self._route_held(ctx, reservations, tenant, None)
        self._decided(ctx, decision, tenant)
        return self._reserve(ctx, reservations, self._hook_calls, 0)

    async def _route_held(
        self,
        ctx: RequestContext,
        reservations: list[Held],
        tenant: Tenant | None,
        err: GatewayError | None,
    ) -> None:
        """``route_now`` for a model without a ready replica (``err``: the table's answer):
        held at the activator until one is ready, then the rest of the stage. A model that
        does not exist (or no longer, after the hold) is a 404 naming the caller's models."""
        inference = ctx.inference
        assert inference is not None
        headers = ctx.request.headers
        try:
            decision = (
                await self._activate(err, inference, headers)
                if err is not None
                else await self._hold(inference, headers)
            )
            if err is not None and (
                not decision.backend.candidates and inference.model in self.table.activatable
            ):
                # A ModelRoute / InferenceModel whose targets select no replica yet: its
                # Playground is scaled to zero, starting or restarting (routing.py's
                # activatable routes).
                decision = await self._hold(inference, headers)
        except GatewayError as refused:
            if tenant is None or refused.code != "model_not_found":
                raise
            # A key is told only about the models it may use.
            names = [n for n in self.table.model_names() if tenant.allows(n)]
            raise model_not_found(inference.model, names) from None
        self._decided(ctx, decision, tenant)
        pending = self._reserve(ctx, reservations, self._hook_calls, 0)
        if pending is not None:
            await pending

    def _decided(self, ctx: RequestContext, decision: Decision, tenant: Tenant | None) -> None:
        ctx.decision = decision
        if tenant is not None:
            decision.tenant = tenant.name
            if decision.criticality is None:
                decision.criticality = tenant.criticality
        elif decision.criticality is None:
            decision.criticality = "Default"

    def _reserve(
        self, ctx: RequestContext, reservations: list[Held], calls: list[Any], start: int
    ) -> Awaitable[None] | None:
        """The request hooks' reservations from ``calls[start]`` on (``_hook_calls``, kept
        across waits), then the model the route sends; at the first hook to be awaited, the
        awaitable that does the rest."""
        inference, decision = ctx.inference, ctx.decision
        assert inference is not None and decision is not None
        for i in range(start, len(calls)):
            hook, reserve_now, settle_now = calls[i]
            if reserve_now is None:
                return self._reserve_later(ctx, reservations, calls, i)
            reservation = reserve_now(inference, decision)
            if reservation is LATER:
                return self._reserve_later(ctx, reservations, calls, i)
            reservations.append((hook, settle_now, reservation))
            if isinstance(reservation, Reservation):
                ctx.adopt(reservation)
        if decision.model != inference.model:
            inference.rewrite_model(decision.model)
            ctx.sent_model = decision.model
        return None

    async def _reserve_later(
        self, ctx: RequestContext, reservations: list[Held], calls: list[Any], i: int
    ) -> None:
        """Hook ``calls[i]``'s reservation awaited, then the others (``_reserve``)."""
        hook, _, settle_now = calls[i]
        reservation = await hook.reserve(ctx.inference, ctx.decision)
        reservations.append((hook, settle_now, reservation))
        if isinstance(reservation, Reservation):
            ctx.adopt(reservation)
        pending = self._reserve(ctx, reservations, calls, i + 1)
        if pending is not None:
            await pending

    def refused(self, ctx: RequestContext, err: GatewayError) -> None:
        """Note a request answered with ``err`` instead of being served."""
        ctx.status = err.status
        if ctx.error is None:
            ctx.error = err.message
        if err.code == "overloaded" and ctx.inference is not None:
            self.metrics.shed.labels(ctx.inference.model).inc()

    async def finish(self, ctx: RequestContext, reservations: list[Held]) -> None:
        """Settle the hooks on the usage the engine reported, then metrics and the access log."""
        self._release(ctx)
        usage = Usage.of(ctx.usage)
        for hook, settle_now, reservation in reservations:
            try:
                if settle_now is not None:
                    settle_now(ctx.inference, ctx.decision, reservation, usage, ctx.status)
                else:
                    await hook.settle(
                        ctx.inference,  # type: ignore[arg-type]
                        ctx.decision,  # type: ignore[arg-type]
                        reservation,
                        usage,
                        ctx.status,
                    )
            except Exception:
                log.exception("request hook settle failed")
        self._observe(ctx, usage)

    def finish_now(self, ctx: RequestContext, reservations: list[Held]) -> bool:
        """``finish`` without a coroutine when every hook settles by a plain function
        (``settle_now``, as the built-in ones do); False, with nothing done, when one is to be
        awaited."""
        for held in reservations:
            if held[1] is None:
                return False
        self._release(ctx)
        usage = Usage.of(ctx.usage)
        for _, settle_now, reservation in reservations:
            try:
                settle_now(ctx.inference, ctx.decision, reservation, usage, ctx.status)
            except Exception:
                log.exception("request hook settle failed")
        self._observe(ctx, usage)
        return True

    def _release(self, ctx: RequestContext) -> None:
        """The request's flow-control seat back, and waiters let go if a slot freed."""
        if ctx.seat is not None:
            self.flow.release(ctx.seat)
            ctx.seat = None
        if self.flow.queues:  # a slot may have freed
            self.flow.pump()
        if self.seat is not None:  # for the other workers' waiting requests too
            self.seat.waker.wake_peers()

    async def _activate(
        self, err: GatewayError, inference: InferenceRequest, headers: Any
    ) -> Decision:
        """A model without a ready replica: hold the request at the activator until one is
        ready, then resolve again; anything else re-raises ``err``."""
        if err.code != "no_ready_endpoint" or inference.model not in self.table.activatable:
            raise err
        return await self._hold(inference, headers)

    async def _hold(self, inference: InferenceRequest, headers: Any) -> Decision:
        """Hold the request at the activator until the Playground serving its model (or its
        route's target) has a ready replica, then resolve again."""
        workload = self.table.activatable[inference.model]
        await self.activator.hold(inference.model, workload, len(inference.body))
        return self.table.resolve(inference.model, inference.path, headers)

    def _body(self, request: HttpRequest) -> bytes:
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

    def _serve(self, ctx: RequestContext) -> Awaitable[StreamResponse]:
        """Admission, the scheduler's pick and the proxy (await the result). Not a coroutine
        itself: a request that neither waits in flow control nor loads an adapter first (the
        usual case) gets the proxy's own, two coroutines less per request."""
        assert ctx.decision is not None
        now = time.monotonic()
        candidates, waits = self._admission(ctx, now)
        if waits or ctx.decision.load is not None:
            return self._serve_admitted(ctx, candidates, waits, now)
        return self._send(ctx, self._prefill_room(ctx, self._seated(ctx, candidates)), now)

    async def _serve_admitted(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], waits: bool, now: float
    ) -> StreamResponse:
        """``_serve`` for a request that waits in flow control or for an adapter first."""
        candidates = await self._admit_rest(ctx, candidates, waits)
        if ctx.waited is not None:
            now = time.monotonic()
        return await self._send(ctx, candidates, now)

    def _send(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now: float
    ) -> Awaitable[StreamResponse]:
        """The pick over the admitted ``candidates`` and its proxying (await the result)."""
        inference, decision = ctx.inference, ctx.decision
        assert inference is not None and decision is not None
        backend = decision.backend
        sched = self.scheduling_context(ctx, now)
        if backend.pd is not None and not inference.path.endswith("/embeddings"):
            # Prefill/decode disaggregation: a prefill replica, then a decode replica.
            return self.pd.serve(ctx, candidates, sched)
        n = min(len(candidates), max(self.config.fallbacks, max(0, backend.retry_attempts) + 1))
        pick = self.schedule(ctx, candidates, sched, n)
        return self.proxy.serve(ctx, pick, self.scheduler.profile(backend.profile), sched)

    async def admit(self, ctx: RequestContext, now: float) -> Sequence[EndpointState]:
        """The candidates admission lets the request use (503 none ready; every one saturated:
        wait in flow control, or 429 for Sheddable with it off), with a declared LoRA adapter
        loaded first where no replica holds it yet."""
        candidates, waits = self._admission(ctx, now)
        return await self._admit_rest(ctx, candidates, waits)

    def _admission(self, ctx: RequestContext, now: float) -> tuple[Sequence[EndpointState], bool]:
        """Admission's candidates (or its 503 / 429) and whether the request is to wait in
        flow control for them."""
        inference, decision = ctx.inference, ctx.decision
        assert inference is not None and decision is not None
        flow = self.flow
        level = level_of(decision)  # the objective's priority, else the criticality
        candidates = self.admission.admit(
            inference.model, decision, now, level, shed=not flow.enabled
        )
        key = decision.backend.ref
        waits = flow.enabled and flow.needed(key, candidates, now)
        if waits and flow.reserve:  # under its fair share: past the rule, within the reserve
            waits = not flow.reserved(key, candidates, level, ctx.tenant, ctx.weight, now)
        return candidates, waits

    async def _admit_rest(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], waits: bool
    ) -> Sequence[EndpointState]:
        """``admit`` after ``_admission``: the wait in flow control, the seat, the adapter."""
        inference, decision = ctx.inference, ctx.decision
        assert inference is not None and decision is not None
        if waits:
            level = level_of(decision)
            waker = self.seat.waker if self.seat is not None else None
            if waker is not None:
                waker.waiting(1)  # the other workers' completions wake it too
            try:
                ctx.waited = await self.flow.wait(
                    decision.backend.ref,
                    candidates,
                    level,
                    ctx.tenant,
                    ctx.weight,
                    len(inference.body),
                )
            finally:
                if waker is not None:
                    waker.waiting(-1)
            # Ejections may have changed while it waited.
            candidates = self.admission.admit(
                inference.model, decision, time.monotonic(), level, shed=False
            )
        candidates = self._seated(ctx, candidates)
        if decision.load is not None:
            candidates = await self.adapters.ensure(decision.load, candidates)
            self._rebuild()
        return self._prefill_room(ctx, candidates)

    def _seated(
        self, ctx: RequestContext, candidates: Sequence[EndpointState]
    ) -> Sequence[EndpointState]:
        """Where requests are counted for their flow's fair share (a reserve, engines that
        order by priority): the request's seat in its flow, and the candidates with room."""
        flow = self.flow
        if flow.counts(candidates):
            ctx.seat = flow.seat(ctx.decision.backend.ref, ctx.tenant, ctx.weight)
            candidates = flow.room(candidates, time.monotonic())
        return candidates

    def _prefill_room(
        self, ctx: RequestContext, candidates: Sequence[EndpointState]
    ) -> Sequence[EndpointState]:
        if self.config.saturation_max_prefilling and ctx.decision.backend.pd is None:
            # (Prefill/decode pairs: pd.py picks each role among its own endpoints.)
            candidates = self.admission.with_prefill_room(candidates)
        return candidates

    def scheduling_context(self, ctx: RequestContext, now: float) -> SchedulingContext:
        inference, decision = ctx.inference, ctx.decision
        assert inference is not None and decision is not None
        return SchedulingContext(
            decision.model,
            lambda: inference.prompt,
            ctx.request.headers,
            decision.lora,
            self.config.metrics_staleness,
            now,
            self._warm,
            inference.prompt_bound(),
            inference,
        )

    def schedule(
        self,
        ctx: RequestContext,
        candidates: Sequence[EndpointState],
        sched: SchedulingContext,
        n: int,
    ) -> Pick:
        """The scheduler's ordered pick of ``n`` of the admitted candidates (timed)."""
        assert ctx.decision is not None
        ts = time.perf_counter()
        pick = self.scheduler.pick(sched, candidates, n, ctx.decision.backend.profile)
        if ctx.decision.lora and pick.endpoints:
            self.adapters.touch(pick.endpoints[0].address, ctx.decision.model)
        elapsed = time.perf_counter() - ts
        self._scheduling.observe(elapsed)
        ctx.sched_ms = round(elapsed * 1000, 3)
        ctx.profile = pick.profile
        ctx.scores = pick.scores
        return pick

    def _observe(self, ctx: RequestContext, usage: Usage | None) -> None:
        elapsed = time.perf_counter() - ctx.t0
        m = self.metrics
        # Label values only from the routing table: a request that resolved names a model the
        # table knows; every other name a client sends shares one value (no label per typo).
        model = (
            ctx.inference.model
            if ctx.inference is not None and ctx.decision is not None
            else UNKNOWN_MODEL
        )
        route = ctx.decision.route if ctx.decision is not None else ""
        key = (model, route, ctx.endpoint or "", ctx.status)
        series = self._series.get(key)
        if series is None:  # a label set's first request: its children, kept for the next
            series = self._series[key] = (
                m.requests.labels(model, route, key[2], str(ctx.status)),
                m.e2e.labels(model),
                m.prompt_tokens.labels(model),
                m.output_tokens.labels(model),
            )
        series[0].value += 1
        if ctx.tenant is not None:
            tenant_series = self._tenant_series.get((ctx.tenant, ctx.status))
            if tenant_series is None:
                tenant_series = self._tenant_series[(ctx.tenant, ctx.status)] = (
                    self.auth.requests.labels(ctx.tenant, str(ctx.status))
                )
            tenant_series.value += 1
        series[1].observe(elapsed)
        if usage is not None:
            if usage.prompt_tokens:
                series[2].value += usage.prompt_tokens
            if usage.completion_tokens:
                series[3].value += usage.completion_tokens
        if ctx.ttft is not None:
            m.ttft.labels(model).observe(ctx.ttft)
            tokens = (
                usage.completion_tokens
                if usage is not None and usage.completion_tokens
                else ctx.events - 1
            )
            if tokens > 1 and ctx.end:
                m.tpot.labels(model).observe((ctx.end - ctx.t0 - ctx.ttft) / (tokens - 1))
        if access_log.isEnabledFor(logging.INFO):
            prompt = completion = None
            if usage is not None:
                prompt, completion = usage.prompt_tokens, usage.completion_tokens
            record = ctx.access_record(elapsed, prompt, completion)
            if self.seat is not None:
                record["worker"] = self.seat.index
            write_access(record)

    # --- other endpoints ---------------------------------------------------------------------------

    async def models(self, request: HttpRequest) -> Response:
        names = self.table.model_names()
        if self.auth.enabled:  # a key sees the models it may use, and nothing else
            try:
                tenant = self.auth.caller(request.headers)
            except GatewayError as err:
                return err.response()
            names = [n for n in names if tenant.allows(n)]
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "llmplane"} for name in names
        ]
        return Response(
            body=orjson.dumps({"object": "list", "data": data}), content_type="application/json"
        )

    async def health(self, request: HttpRequest) -> Response:
        return Response(body=b'{"status":"ok"}', content_type="application/json")

    async def prometheus(self, request: HttpRequest) -> Response:
        refusal = self.auth.admin_refusal(request.headers)
        if refusal is not None:
            return GatewayError(401, refusal, "invalid_api_key").response()
        body = self.metrics.render()
        if self.seat is not None:
            body = await self.seat.metrics.aggregate(body)
        return Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def autoscaling_signals(self, request: HttpRequest) -> Response:
        """Per-workload load for the in-cluster autoscaler (``gateway/signals.py``)."""
        refusal = self.auth.admin_refusal(request.headers)
        if refusal is not None:
            return GatewayError(401, refusal, "invalid_api_key").response()
        peers = await self.seat.metrics.signals() if self.seat is not None else []
        body = orjson.dumps(GatewaySignals(self).snapshot(peers))
        return Response(body=body, content_type="application/json")

    async def not_found(self, request: HttpRequest) -> Response:
        return GatewayError(
            404, f"no such path: {request.method} {clip(request.path)}", "not_found"
        ).response()


def routes(gateway: Gateway) -> dict[tuple[str, str], Handler]:
    """(method, path) -> handler; anything else is ``gateway.not_found`` (HEAD follows GET)."""
    table: dict[tuple[str, str], Handler] = {
        ("POST", path): gateway.handle for path in INFERENCE_PATHS
    }
    table[("GET", "/v1/models")] = gateway.models
    table[("GET", "/health")] = gateway.health
    table[("GET", "/metrics")] = gateway.prometheus
    table[("GET", "/autoscaling/signals")] = gateway.autoscaling_signals
    for extension in gateway.extensions:
        for key, handler in extension.routes().items():
            table.setdefault(key, handler)  # never in place of the API's own
    return table


async def start_gateway(
    store: Store | None,
    discovery: Discovery,
    host: str = "127.0.0.1",
    port: int = 0,
    config: GatewayConfig | None = None,
    extensions: Sequence[Callable[[Gateway], Extension]] = (),
    seat: Seat | None = None,
) -> Gateway:
    """Start a gateway on ``host:port`` (0 = any free port; see ``gateway.port``), with
    ``extensions`` made from it (``llmplane.console.Console``); as worker ``seat`` of several
    on the supervisor's socket."""
    gateway = Gateway(store, discovery, config, seat)
    gateway.extensions = [make(gateway) for make in extensions]
    try:
        await gateway.start(host, port)
    except BaseException:
        await gateway.close()
        raise
    return gateway
