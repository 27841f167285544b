"""The ext_proc service: one gRPC stream per HTTP request, run through the gateway's stages.

Envoy sends the request headers, then the whole body (BUFFERED), then the response headers and
each response body chunk (STREAMED). On the body the picker runs what the gateway runs before
it proxies: parse the body once (model, stream) -> resolve the route in the routing table
(InferenceModel / ModelRoute rules, weighted splits, criticality) -> request hooks reserve
(token rate limits) -> admission (no ready endpoint 503, Sheddable shed 429) -> scheduler pick
(the prefix index learns the chosen endpoint) -> answer with the destination and, when the
model was rewritten, the new body. Refusals are immediate responses. The response side reads
the status and the usage (the last ``usage`` object of the body or of the SSE stream) so the
hooks settle on real token counts; the endpoint's in-flight count is released when the stream
ends, however it ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from llmplane.epp import protocol
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.errors import GatewayError
from llmplane.gateway.hooks import RequestHook, Usage
from llmplane.gateway.observability import GatewayMetrics, log_access
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.routing import Decision, RoutingTable
from llmplane.gateway.scheduler.framework import Scheduler, SchedulingContext
from llmplane.gateway.usage import StreamScanner, extract_usage

log = logging.getLogger("llmplane.epp")

ENDPOINT_HEADER = "x-llmplane-endpoint"


class RoutingState(Protocol):
    """What the picker reads from the gateway's routing state (``Gateway`` provides it)."""

    config: GatewayConfig
    table: RoutingTable
    hooks: list[RequestHook]
    scheduler: Scheduler
    metrics: GatewayMetrics
    outliers: Outliers

    def admit(self, model: str, decision: Decision, now: float) -> Sequence[EndpointState]: ...


class _Exchange:
    """One HTTP request as the picker follows it."""

    __slots__ = (
        "body",
        "decision",
        "endpoint",
        "error",
        "events",
        "extra_headers",
        "finished",
        "headers",
        "inference",
        "relay",
        "reservations",
        "response_body",
        "scanner",
        "state",
        "status",
        "t0",
        "ttft",
        "usage",
    )

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.inference: InferenceRequest | None = None
        self.decision: Decision | None = None
        self.reservations: list[tuple[RequestHook, Any]] = []
        self.extra_headers: dict[str, str] = {}
        self.relay: Any = None  # a hook's stream filter
        self.state: EndpointState | None = None  # the chosen endpoint, while counted in flight
        self.endpoint: str | None = None
        self.status = 0  # what the client got; 0 until known
        self.scanner: StreamScanner | None = None
        self.response_body: list[bytes] | None = None
        self.usage: dict[str, Any] | None = None
        self.ttft: float | None = None
        self.events = 0
        self.error: str | None = None
        self.finished = False


class EndpointPickerService:
    """``envoy.service.ext_proc.v3.ExternalProcessor`` over llmplane's routing state."""

    def __init__(self, state: RoutingState, fallbacks: int = 0) -> None:
        self.state = state
        self.fallbacks = max(0, fallbacks)

    async def Process(  # the gRPC method's name
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        ex = _Exchange()
        try:
            async for message in requests:
                kind = message.WhichOneof("request")
                if kind == "request_headers":
                    ex.headers = protocol.headers_of(message.request_headers)
                    yield protocol.CONTINUE_REQUEST_HEADERS
                elif kind == "request_body":
                    part = message.request_body
                    ex.body.append(part.body)
                    if not part.end_of_stream:
                        yield protocol.CONTINUE_REQUEST_BODY
                        continue
                    yield await self._route(ex)
                elif kind == "response_headers":
                    yield self._response_headers(ex, message.response_headers)
                elif kind == "response_body":
                    part = message.response_body
                    reply = self._response_chunk(ex, part.body, part.end_of_stream)
                    if part.end_of_stream:
                        # Settled before Envoy lets the last bytes go: a client's next
                        # request sees this one's tokens counted.
                        await self._finish(ex)
                    yield reply
                elif kind == "request_trailers":
                    yield protocol.pb.ProcessingResponse(
                        request_trailers=protocol.pb.TrailersResponse()
                    )
                elif kind == "response_trailers":
                    yield protocol.pb.ProcessingResponse(
                        response_trailers=protocol.pb.TrailersResponse()
                    )
        finally:
            if not ex.finished:
                if not ex.status:
                    ex.status = 499  # Envoy ended the stream first (client went away)
                await self._finish(ex)

    # --- request -----------------------------------------------------------------------------

    async def _route(self, ex: _Exchange) -> Any:
        s = self.state
        try:
            path = ex.headers.get(":path", "/").partition("?")[0]
            body = b"".join(ex.body) if len(ex.body) != 1 else ex.body[0]
            ex.body = []
            inference = ex.inference = InferenceRequest(path, ex.headers, body)
            decision = ex.decision = s.table.resolve(inference.model, path, ex.headers)
            for hook in s.hooks:
                reservation = await hook.reserve(inference, decision)
                ex.reservations.append((hook, reservation))
                self._adopt(ex, reservation)
            if decision.model != inference.model:
                inference.rewrite_model(decision.model)
            now = time.monotonic()
            candidates = s.admit(inference.model, decision, now)
            ts = time.perf_counter()
            ctx = SchedulingContext(
                decision.model,
                lambda: inference.prompt,
                ex.headers,
                decision.lora,
                s.config.metrics_staleness,
                now,
            )
            backend = decision.backend
            n = min(len(candidates), 1 + self.fallbacks)
            pick = s.scheduler.pick(ctx, candidates, n, backend.profile)
            s.metrics.scheduling.observe(time.perf_counter() - ts)
            chosen = pick.endpoints[0]
            s.scheduler.profile(backend.profile).on_pick(ctx, chosen)  # the prefix index
            chosen.inflight += 1
            ex.state = chosen
            ex.endpoint = backend.address(chosen)
            addresses = [backend.address(e) for e in pick.endpoints]
            sent = inference.final_body() if inference.dirty else None
            return protocol.route_to(addresses, sent)
        except GatewayError as err:
            ex.status = err.status
            ex.error = err.message
            if err.code == "overloaded" and ex.inference is not None:
                s.metrics.shed.labels(ex.inference.model).inc()
            return protocol.immediate(err)

    @staticmethod
    def _adopt(ex: _Exchange, reservation: Any) -> None:
        extra = getattr(reservation, "response_headers", None)
        if extra:
            ex.extra_headers.update(extra)
        relay = getattr(reservation, "stream_filter", None)
        if relay is not None:
            ex.relay = relay

    # --- response ----------------------------------------------------------------------------

    def _response_headers(self, ex: _Exchange, message: Any) -> Any:
        headers = protocol.headers_of(message)
        try:
            ex.status = int(headers.get(":status", "0"))
        except ValueError:
            ex.status = 0
        if ex.state is None:  # not a request the picker routed (or refused)
            return protocol.CONTINUE_RESPONSE_HEADERS
        if "text/event-stream" in headers.get("content-type", ""):
            ex.scanner = StreamScanner()
        else:
            ex.response_body = []
        extra = dict(ex.extra_headers)
        if ex.endpoint:
            extra[ENDPOINT_HEADER] = ex.endpoint
        return protocol.response_headers(extra)

    def _response_chunk(self, ex: _Exchange, chunk: bytes, end: bool) -> Any:
        scanner = ex.scanner
        if scanner is not None:
            if ex.ttft is None and chunk:
                ex.ttft = time.perf_counter() - ex.t0
            scanner.feed(chunk)
            if end:
                scanner.feed(b"\n\n")  # an unterminated last event still counts
            if ex.relay is not None:
                data = ex.relay.feed(chunk)
                if end:
                    data += ex.relay.flush()
                return protocol.response_chunk(data)
        elif ex.response_body is not None:
            ex.response_body.append(chunk)
        return protocol.CONTINUE_RESPONSE_BODY

    # --- end ---------------------------------------------------------------------------------

    async def _finish(self, ex: _Exchange) -> None:
        """Release the endpoint, settle the hooks on the usage seen, observe (once)."""
        if ex.finished:
            return
        ex.finished = True
        s = self.state
        state = ex.state
        if state is not None:
            state.inflight -= 1
            if ex.status >= 500:
                s.outliers.failure(state)
            elif ex.status:
                s.outliers.success(state)
        if ex.scanner is not None:
            ex.usage = ex.scanner.usage
            ex.events = ex.scanner.events
        elif ex.response_body and ex.status < 400:
            data = b"".join(ex.response_body)
            if b'"usage"' in data:
                ex.usage = extract_usage(data)
        usage = Usage.of(ex.usage)
        for hook, reservation in ex.reservations:
            try:
                await asyncio.shield(
                    hook.settle(ex.inference, ex.decision, reservation, usage, ex.status)  # type: ignore[arg-type]
                )
            except Exception:
                log.exception("request hook settle failed")
        self._observe(ex, usage)

    def _observe(self, ex: _Exchange, usage: Usage | None) -> None:
        elapsed = time.perf_counter() - ex.t0
        m = self.state.metrics
        model = ex.inference.model if ex.inference is not None else ""
        route = ex.decision.route if ex.decision is not None else ""
        status = str(ex.status)
        m.requests.labels(model, route, ex.endpoint or "", status).inc()
        if ex.inference is None:
            return
        m.e2e.labels(model).observe(elapsed)
        if usage is not None:
            if usage.prompt_tokens:
                m.prompt_tokens.labels(model).inc(usage.prompt_tokens)
            if usage.completion_tokens:
                m.output_tokens.labels(model).inc(usage.completion_tokens)
        if ex.ttft is not None:
            m.ttft.labels(model).observe(ex.ttft)
        record: dict[str, Any] = {
            "path": ex.headers.get(":path", ""),
            "model": model,
            "stream": ex.inference.stream,
            "route": route,
            "status": ex.status,
            "endpoint": ex.endpoint,
            "total_ms": round(elapsed * 1000, 3),
        }
        if ex.decision is not None and ex.decision.model != model:
            record["sent_model"] = ex.decision.model
        if ex.ttft is not None:
            record["ttft_ms"] = round(ex.ttft * 1000, 3)
        if usage is not None:
            record["prompt_tokens"] = usage.prompt_tokens
            record["completion_tokens"] = usage.completion_tokens
        if ex.error:
            record["error"] = ex.error
        log_access(record)
