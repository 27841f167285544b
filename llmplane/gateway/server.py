"""The gateway: an OpenAI-compatible HTTP server that routes each request to the best replica
(docs/gateway.md). ``Gateway.handle`` reads one request's stages top to bottom.

The routing table is immutable and rebuilt whenever a routing object in the store or the
endpoint list changes; the reference is swapped atomically, so in-flight requests finish on
the table they started with. The standalone command is ``cli.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from llmplane.aio import call_on
from llmplane.gateway.activator import Activator
from llmplane.gateway.adapters import Adapters
from llmplane.gateway.admission import Admission
from llmplane.gateway.auth import KIND as TENANT_KIND
from llmplane.gateway.auth import SECRET_KIND, Authenticator
from llmplane.gateway.clip import clip
from llmplane.gateway.config import GatewayConfig, client_connection_limit
from llmplane.gateway.context import RequestContext, milliseconds
from llmplane.gateway.discovery import CombinedDiscovery, Discovery, Following
from llmplane.gateway.errors import (
    ErrorCode,
    GatewayError,
    ModelNotFound,
    NotReady,
    Overloaded,
    too_large,
)
from llmplane.gateway.exposure import is_loopback, make_guard
from llmplane.gateway.flowcontrol import FlowControl, Limits
from llmplane.gateway.hooks import RequestHook, Reservation
from llmplane.gateway.http_server import Handler, HttpRequest, HttpServer, Response, StreamResponse
from llmplane.gateway.kvcache.routing import PreciseRouting
from llmplane.gateway.kvcache.subscriber import KVEventSubscriber
from llmplane.gateway.observability import GatewayMetrics, access_log, write_access
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.pd import PrefillDecode
from llmplane.gateway.protocols import PATHS as API_PATHS
from llmplane.gateway.protocols import error_response, responses
from llmplane.gateway.proxy import Proxy
from llmplane.gateway.ratelimit import RateLimiter
from llmplane.gateway.registry import EndpointRegistry, EndpointState
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.routing import (
    ROUTE_KINDS,
    RouteDecision,
    RoutingTable,
    build_table,
    model_not_found,
)
from llmplane.gateway.scheduler.config import PluginHandle, build_scheduler
from llmplane.gateway.scheduler.framework import SchedulingContext
from llmplane.gateway.scheduler.precise_prefix import ModelTokens, SimTokens, TokenSources
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


@dataclass(frozen=True, slots=True)
class GatewayView:
    """What the gateway shows of its load, read at one moment: for the web console, ``llmplane
    up``'s status and the autoscaling signals (``signals.py``), which read nothing else."""

    endpoints: list[EndpointState]  # with in-flight counts and scraped engine metrics
    metrics_staleness: float  # seconds after which scraped metrics are too old to use
    requests: dict[str, float]  # requests answered so far, by endpoint address
    queued: dict[str, float]  # waiting in flow control, shared out over their endpoints
    held: dict[str, int]  # waiting at the activator, by workload (namespace/name)
    kv_index: Any = None  # which replica holds which KV block (kvcache/index.py), if any


class Gateway:
    def __init__(
        self,
        store: Store | None,
        discovery: Discovery,
        config: GatewayConfig | None = None,
        seat: Seat | None = None,
        wake: Callable[[str], None] | None = None,
        extensions: Sequence[Callable[[Gateway], Extension]] = (),
    ) -> None:
        """``wake(workload)``: called when a request starts waiting at the activator for a
        Playground scaled to zero (what scales it up); ``extensions`` made from the gateway
        (``llmplane.console.Console``)."""
        self.config = config or GatewayConfig()
        self.store = store
        self.discovery = discovery
        # One of several worker processes (llmplane/gateway/workers): in-flight counts, token
        # buckets and /metrics shared with the others.
        self.seat = seat
        self._warm: Callable[[str], bool] | None = None  # set at start (a worker's own pool)
        self.registry = EndpointRegistry(seat.endpoint_state if seat else EndpointState)
        # The replicas' KV events, into the index the precise prefix scorers read, and the
        # token ids they key a request by (gateway/kvcache/routing.py).
        subscriber, tokens = KVEventSubscriber(), TokenSources(SimTokens())
        self.scheduler = build_scheduler(
            self.config.scheduler,
            PluginHandle(seat.picks if seat else None, subscriber.index, tokens),
        )
        self.metrics = GatewayMetrics(lambda: self.registry.states.values())
        self.kv = PreciseRouting(
            self.scheduler, subscriber, tokens, self.metrics.registry, not self.config.scheduler
        )
        self.outliers = Outliers(self.config, self.metrics.ejections)
        self.admission = Admission(self.config, self.outliers)
        c = self.config
        self.flow = FlowControl(
            self.admission,
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
            peers=seat.waker if seat is not None else None,
        )
        self.metrics.registry.register(self.flow.metrics)  # type: ignore[arg-type]
        self.scrape_follower = (
            seat.share_scrapes(
                self.config,
                lambda: self.registry.states.values(),
                self.flow.pump,
                self._rebuild,
            )
            if seat is not None
            else None
        )
        self.scraper = Scraper(
            self.config,
            on_models_changed=self._rebuild,
            on_scraped=self.flow.pump,  # fresh load: flow control may dispatch
            upstream=lambda: self.proxy.pool,  # scrapes keep routed connections warm
            sharing=self.scrape_follower,
        )
        self.adapters = Adapters(self.scraper.client)
        self.auth = Authenticator(self.config.admin_key_hash)
        self.metrics.add([self.auth.requests])
        self.activator = Activator(self.config, wake=wake)
        self.metrics.registry.register(self.activator.metrics)  # type: ignore[arg-type]
        self.proxy = Proxy(
            self.config,
            self.outliers,
            self.scheduler,
            self.metrics.retries,
            self.metrics.stalls,
            self.metrics.resends,
            on_first_chunk=self.prefilled,
        )
        self.metrics.add(self.proxy.migrator.metrics())  # MIGRATION (gateway/migration.py)
        self.pd = PrefillDecode(
            self.config, self.proxy, self.scheduler, self.outliers, self.metrics
        )
        # Rate limits (ModelRoute and Tenant rateLimit) run as the first request hook, then
        # the tenants' usage counters (what a rate limit refused is not usage).
        self.ratelimiter = RateLimiter(self.config, make_bucket=seat.bucket if seat else None)
        self.metrics.add(self.ratelimiter.metrics())
        self.usage = TenantUsage(
            usage_log_for(store, self.config.usage_log), self.config.usage_flush_interval
        )
        self.metrics.add(self.usage.metrics())
        # The engines' token ids per model (precise prefix-cache routing) and the canary check
        # of the model's own tokenizer against each engine's /tokenize.
        self.tokenization = Tokenization()
        self.kv.add_tokens(ModelTokens(self.tokenization))  # before the sim's own
        self.metrics.add(self.tokenization.metrics())
        self.hooks: list[RequestHook] = [self.ratelimiter, self.usage, *self.config.hooks]
        # The autoscaler's signals (this process's and, as one of several workers, its peers').
        self.signals = GatewaySignals(self.view, seat.metrics if seat is not None else None)
        self.table = RoutingTable()
        self._objects: dict[Any, dict[str, Any]] = {}
        self._follower: StoreFollower | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.http: HttpServer | None = None
        self.port = 0
        self.host = "127.0.0.1"
        self._leaving: dict[str, EndpointState] = {}
        # (model, route, endpoint, status) -> the request metrics' children for it: one
        # lookup per request instead of four label lookups.
        self._series: dict[tuple[str, str, str, int], tuple[Any, Any, Any, Any]] = {}
        self._tenant_series: dict[tuple[str, int], Any] = {}  # (tenant, status) -> its child
        self._scheduling = self.metrics.scheduling.labels()  # unlabelled: its one child
        self.extensions = [make(self) for make in extensions]

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
            self.seat.handlers.setdefault(b"handover", self._handover_asked)
            await self.seat.metrics.start(
                self.metrics.render, self.signals.parts, self.seat.handlers
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

    def view(self) -> GatewayView:
        """The gateway's load now (``GatewayView``)."""
        requests: dict[str, float] = {}
        for labels, child in list(self.metrics.requests.children.items()):
            address = labels[2]  # (model, route, endpoint, status)
            requests[address] = requests.get(address, 0.0) + child.value
        return GatewayView(
            list(self.registry.states.values()),
            self.config.metrics_staleness,
            requests,
            self.flow.queued_by_endpoint(),
            self.activator.held_by_workload(),
            self.kv.subscriber.index,
        )

    def inflight(self, address: str) -> int:
        """Requests this gateway has in flight to ``address``, also after it stopped being an
        endpoint: the runtime drains a replica until this reaches 0."""
        state = self.registry.states.get(address) or self._leaving.get(address)
        if state is None:
            return 0
        if state.inflight == 0 and address in self._leaving:
            del self._leaving[address]
        return state.inflight

    def migrations(self) -> list[dict[str, Any]]:
        """This process's stream migrations per route (``Migrator.summary``)."""
        return self.proxy.migrator.summary()

    def handover(self, address: str) -> int:
        """Hand the streams running on ``address`` (a replica being drained) over to other
        replicas now; how many (``Proxy.handover``)."""
        return self.proxy.handover(address)

    async def _handover_asked(self, payload: bytes) -> bytes:
        """``up``'s gateway (worker 0) asks this worker to hand a drained replica's over."""
        return str(self.handover(payload.decode("utf-8", "replace"))).encode()

    def _rebuild(self) -> None:
        self.table = build_table(self._objects.values(), self.registry.states.values(), self.config)
        self.activator.release(self.table.activatable.__contains__)
        self.flow.pump()  # new endpoints: requests waiting in flow control may go

    def prefilled(self) -> None:
        """A stream's first chunk arrived (its endpoint's prefill is over): with
        ``saturation_max_prefilling``, requests waiting in flow control may go."""
        if self.config.saturation_max_prefilling:
            self.flow.pump()

    # --- request path -----------------------------------------------------------------------------

    async def handle(self, request: HttpRequest) -> StreamResponse:
        """One inference request, stage by stage; each stage fills in its part of ``ctx`` or
        refuses with a ``GatewayError`` (the API's JSON error, its status)."""
        ctx = RequestContext(request)
        try:
            self.parse(ctx, request.body)  # 413 over the limit, 400 not an API request
            self.authenticate(ctx)  # 401 no live key, 403 a model the key may not use
            await self.route(ctx)  # 404 / 503; a model scaled to zero waits for a replica
            await self.reserve(ctx)  # the request hooks: rate limits (429), tenant usage
            await self.admit(ctx)  # 503 none ready; all saturated: wait in flow control
            if self.disaggregated(ctx):  # a prefill replica, then a decode replica (pd.py)
                response = await self.pd.serve(ctx)
            else:
                self.schedule(ctx, self.fallbacks(ctx))  # filters, scorers, picker
                response = await self.proxy.serve(ctx)  # retries on the next endpoint
            ctx.status = response.status
            return response
        except GatewayError as err:
            self.refused(ctx, err)
            return error_response(request.path, err)  # in the API's own shape
        except asyncio.CancelledError:
            ctx.status = 499
            raise
        finally:
            self.settle(ctx)  # the hooks on the usage the engine reported, the seat
            self.observe(ctx)  # metrics, one access-log line

    # The stages, in order. The endpoint picker (llmplane/epp) runs the same ones on Envoy's
    # ext_proc stream (it does not proxy: Envoy sends the request where the pick says).

    def parse(self, ctx: RequestContext, body: bytes) -> None:
        """``ctx.inference``: the body parsed once (413 when the HTTP server found it over
        the limit, 400 when it is not an API request)."""
        request = ctx.request
        if request.too_large:
            raise too_large(self.config.max_body_bytes, request.content_length)
        ctx.inference = InferenceRequest(request.path, request.headers, body)

    def authenticate(self, ctx: RequestContext) -> None:
        """``ctx.tenant``: the caller (401 without a live key while authentication is on;
        403 for a model its key may not use)."""
        assert ctx.inference is not None
        tenant = ctx.tenant = self.auth.authenticate(ctx.request.headers)
        if tenant is not None and ctx.inference.model:  # (without one: the route's, in route)
            self.auth.permit(tenant, ctx.inference.model)

    async def route(self, ctx: RequestContext) -> None:
        """``ctx.decision`` from the routing table (404 / 503) and the request's level; a
        model without a ready replica that may get one (a Playground scaled to zero or
        starting) is held at the activator until one is ready, then resolved again. The
        route's model is what goes upstream."""
        inference, tenant = ctx.inference, ctx.tenant
        assert inference is not None
        model, headers, table = inference.model, ctx.request.headers, self.table
        try:
            try:
                decision = table.resolve(model, inference.path, headers)
            except NotReady:
                if model not in table.activatable:
                    raise
                decision = await self._hold(inference, headers)
            if not decision.backend.candidates and model in self.table.activatable:
                # A ModelRoute / InferenceModel whose targets select no replica yet: its
                # Playground is scaled to zero, starting or restarting (routing.py).
                decision = await self._hold(inference, headers)
        except ModelNotFound:
            if tenant is None:
                raise
            # A key is told only about the models it may use.
            names = [n for n in self.table.model_names() if tenant.allows(n)]
            raise model_not_found(model, names) from None
        if not model and tenant is not None:  # a catch-all rewrite's target
            self.auth.permit(tenant, decision.model)
        ctx.decision = decision
        if decision.priority is not None:
            ctx.level = decision.priority
        else:
            ctx.level = decision.criticality or (tenant.criticality if tenant else "Default")
        if decision.model != model:
            inference.rewrite_model(decision.model)
            ctx.sent_model = decision.model

    async def _hold(self, inference: InferenceRequest, headers: Any) -> RouteDecision:
        """Hold the request at the activator until the Playground serving its model (or its
        route's target) has a ready replica, then resolve again."""
        workload = self.table.activatable[inference.model]
        await self.activator.hold(inference.model, workload, len(inference.body))
        return self.table.resolve(inference.model, inference.path, headers)

    async def reserve(self, ctx: RequestContext) -> None:
        """Each request hook's reservation, kept in ``ctx.reservations`` for ``settle``; the
        headers and stream filter of those that shape the response."""
        for hook in self.hooks:
            reservation = await hook.reserve(ctx)
            ctx.reservations.append((hook, reservation))
            if isinstance(reservation, Reservation):
                ctx.adopt(reservation)

    async def admit(self, ctx: RequestContext) -> None:
        """``ctx.candidates``: the endpoints admission lets the request use (503 none ready;
        every one saturated: wait in flow control, or 429 for Sheddable with it off), with a
        declared LoRA adapter loaded first where no replica holds it yet; and
        ``ctx.scheduling``, what the scheduler's plugins read."""
        inference, decision, tenant = ctx.inference, ctx.decision, ctx.tenant
        assert inference is not None and decision is not None
        name, weight = (tenant.name, tenant.weight) if tenant is not None else (None, 1)
        candidates, ctx.seat, ctx.waited, now = await self.flow.admit(
            inference.model, decision.backend, ctx.level, name, weight, len(inference.body)
        )
        if decision.load is not None:
            candidates = await self.adapters.ensure(decision.load, candidates)
            self._rebuild()
        if decision.backend.pd is None:  # (pairs: pd.py picks each role among its own)
            candidates = self.admission.with_room(candidates)
        ctx.candidates = candidates
        ctx.scheduling = SchedulingContext(
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
        # Token ids from an engine's /tokenize where only it can tokenize (bounded wait).
        profile = self.scheduler.profile(decision.backend.profile)
        await self.kv.prepare(ctx.scheduling, candidates, profile)

    def disaggregated(self, ctx: RequestContext) -> bool:
        """Served by a prefill/decode pair (``pd.py``): the route's backend has one, and the
        request generates (embeddings have no decode)."""
        assert ctx.decision is not None and ctx.inference is not None
        return ctx.decision.backend.pd is not None and not ctx.inference.path.endswith(
            "/embeddings"
        )

    def fallbacks(self, ctx: RequestContext) -> int:
        """How many endpoints the pick orders: the first and the ones retries go to."""
        assert ctx.decision is not None
        retries = max(0, ctx.decision.backend.retry_attempts)
        return min(len(ctx.candidates), max(self.config.fallbacks, retries + 1))

    def schedule(self, ctx: RequestContext, n: int) -> None:
        """``ctx.pick``: the scheduler's ordered pick of ``n`` of the candidates (timed). A
        Responses request goes to the replica holding its previous response, and its own
        response is named after the replica it goes to (``protocols/responses.py``)."""
        decision, scheduling, inference = ctx.decision, ctx.scheduling, ctx.inference
        assert decision is not None and scheduling is not None and inference is not None
        ts = time.perf_counter()
        candidates, stored = ctx.candidates, inference.path in responses.PATHS
        if stored:
            candidates = responses.holders(inference.doc, candidates, decision.backend.address)
        pick = ctx.pick = self.scheduler.pick(scheduling, candidates, n, decision.backend.profile)
        if stored and pick.endpoints:
            responses.name_response(inference, decision.backend.address(pick.endpoints[0]))
        if decision.lora and pick.endpoints:
            self.adapters.touch(pick.endpoints[0].address, decision.model)
        elapsed = time.perf_counter() - ts
        self._scheduling.observe(elapsed)
        ctx.sched_ms = milliseconds(elapsed)

    def sent_to(self, ctx: RequestContext, state: EndpointState) -> None:
        """``ctx`` goes to ``state`` (the endpoint picker's data plane proxies it): the
        scheduler's plugins that learn from where requests go (the prefix index) learn it."""
        assert ctx.decision is not None and ctx.scheduling is not None
        self.scheduler.profile(ctx.decision.backend.profile).on_pick(ctx.scheduling, state)

    def answered(self, state: EndpointState, ok: bool) -> None:
        """How a request went on ``state`` (not ``ok``: it failed or was passed over), for
        outlier ejection."""
        if ok:
            self.outliers.success(state)
        else:
            self.outliers.failure(state)

    def refused(self, ctx: RequestContext, err: GatewayError) -> None:
        """Note a request answered with ``err`` instead of being served."""
        ctx.status = err.status
        if ctx.error is None:
            ctx.error = err.message
        if isinstance(err, Overloaded) and ctx.inference is not None:
            self.metrics.shed.labels(ctx.inference.model).inc()

    def settle(self, ctx: RequestContext) -> None:
        """Give the flow-control seat back, and settle each hook's reservation on the usage
        the engine reported (``ctx.usage``)."""
        self.flow.done(ctx.seat)
        ctx.seat = None
        for hook, reservation in ctx.reservations:
            try:
                hook.settle(ctx, reservation, ctx.usage)
            except Exception:
                log.exception("request hook settle failed")

    def observe(self, ctx: RequestContext) -> None:
        """The request's metrics and its access-log line."""
        usage = ctx.usage
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
            tenant = ctx.tenant.name
            tenant_series = self._tenant_series.get((tenant, ctx.status))
            if tenant_series is None:
                tenant_series = self._tenant_series[(tenant, ctx.status)] = (
                    self.auth.requests.labels(tenant, str(ctx.status))
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

    # --- other endpoints -------------------------------------------------------------------------

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

    def _not_admin(self, request: HttpRequest) -> Response | None:
        """The 401 for a request to an admin path without the admin key, if configured."""
        refusal = self.auth.admin_refusal(request.headers)
        return GatewayError(401, refusal, ErrorCode.INVALID_API_KEY).response() if refusal else None

    async def prometheus(self, request: HttpRequest) -> Response:
        if refused := self._not_admin(request):
            return refused
        body = self.metrics.render()
        if self.seat is not None:
            body = await self.seat.metrics.aggregate(body)
        return Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def autoscaling_signals(self, request: HttpRequest) -> Response:
        """Per-workload load for the in-cluster autoscaler (``gateway/signals.py``)."""
        if refused := self._not_admin(request):
            return refused
        peers = await self.seat.metrics.signals() if self.seat is not None else []
        body = orjson.dumps(self.signals.snapshot(peers))
        return Response(body=body, content_type="application/json")

    async def not_found(self, request: HttpRequest) -> Response:
        return GatewayError(
            404, f"no such path: {request.method} {clip(request.path)}", ErrorCode.NOT_FOUND
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
    wake: Callable[[str], None] | None = None,
) -> Gateway:
    """Start a gateway on ``host:port`` (0 = any free port; see ``gateway.port``); as worker
    ``seat`` of several on the supervisor's socket."""
    gateway = Gateway(store, discovery, config, seat, wake, extensions)
    try:
        await gateway.start(host, port)
    except BaseException:
        await gateway.close()
        raise
    return gateway
