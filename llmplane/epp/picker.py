"""The ext_proc service: one gRPC stream per HTTP request, run through the gateway's stages.

Envoy sends the request headers, then the body, then the response headers and each response
body chunk: the body BUFFERED and the response STREAMED (``llmplane.epp.envoy``'s default), or
both FULL_DUPLEX_STREAMED (what Gateway API implementations configure; the picker then holds
its answer to the headers until the body is in, and sends every body chunk back itself). On
the whole body the picker runs the gateway's own stages (``Gateway.route`` / ``admit`` /
``schedule`` / ``finish`` on one ``RequestContext``): parse the body once (model, stream) ->
resolve the route (InferenceModel / ModelRoute rules, weighted splits, criticality) -> request
hooks reserve (token rate limits) -> admission (no ready endpoint 503, Sheddable shed 429, a
declared LoRA adapter loaded) -> scheduler pick (the prefix index learns the chosen
endpoint) -> answer with the destination and, when the body changed (model rewrite,
``stream_options``), the new body. Refusals are immediate responses. The response
side reads the status and the usage (the last ``usage`` object of the body or of the SSE
stream) so the hooks settle on real token counts; the endpoint's in-flight count is released
when the stream ends, however it ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from llmplane.epp import protocol
from llmplane.gateway.context import RequestContext
from llmplane.gateway.errors import ErrorCode, GatewayError, too_large
from llmplane.gateway.hooks import Usage
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.response_usage import StreamScanner, extract_usage
from llmplane.gateway.server import Gateway
from llmplane.gateway.tokens import sent_prompt_tokens

log = logging.getLogger("llmplane.epp")

ENDPOINT_HEADER = "x-llmplane-endpoint"


class EnvoyRequest:
    """The request line and headers as Envoy forwarded them (what ``RequestContext`` and the
    access log read of a request)."""

    __slots__ = ("headers", "method", "path", "path_qs")
    too_large = False  # (a body over the limit is refused as it streams in: ``_too_large``)

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self.method = headers.get(":method", "POST")
        self.path_qs = headers.get(":path", "/")
        self.path = self.path_qs.partition("?")[0]


def in_subset(
    candidates: Sequence[EndpointState], subset: frozenset[str], address: Callable[[Any], str]
) -> Sequence[EndpointState]:
    """The candidates the data plane's subset hint allows; 503 when it allows none."""
    kept = [s for s in candidates if address(s) in subset]
    if not kept:
        raise GatewayError(
            503,
            "no eligible endpoint in the data plane's subset hint "
            f"({len(subset)} address{'es' if len(subset) != 1 else ''})",
            ErrorCode.NO_READY_ENDPOINT,
        )
    return kept


class _Exchange:
    """One HTTP request as the picker follows it over its ext_proc stream."""

    __slots__ = (
        "body",
        "body_size",
        "ctx",
        "duplex_request",
        "duplex_response",
        "finished",
        "picked",
        "prefilling",
        "prompt_at",
        "prompt_tokens",
        "response_body",
        "routed",
        "scanner",
        "state",
        "subset",
    )

    def __init__(self) -> None:
        self.ctx: RequestContext | None = None
        self.body: list[bytes] = []
        self.body_size = 0
        self.state: EndpointState | None = None  # the chosen endpoint, while counted in flight
        self.picked: dict[str, EndpointState] = {}  # address -> state, the named endpoints
        self.prefilling: EndpointState | None = None  # a stream's, until its first chunk
        # Where the prompt's tokens are counted (``prefill_tokens``) until the first byte.
        self.prompt_at: EndpointState | None = None
        self.prompt_tokens = 0
        self.scanner: StreamScanner | None = None
        self.response_body: list[bytes] | None = None
        self.subset: frozenset[str] | None = None  # the data plane's subset hint
        # FULL_DUPLEX_STREAMED bodies (else request BUFFERED, response STREAMED).
        self.duplex_request = False
        self.duplex_response = False
        self.routed = False  # the body arrived and went through the stages
        self.finished = False


class EndpointPickerService:
    """``envoy.service.ext_proc.v3.ExternalProcessor`` over a gateway's routing state."""

    def __init__(self, gateway: Gateway, fallbacks: int = 0) -> None:
        self.gateway = gateway
        self.fallbacks = max(0, fallbacks)

    async def Process(  # the gRPC method's name
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        ex = _Exchange()
        try:
            async for message in requests:
                kind = message.WhichOneof("request")
                if kind == "request_headers":
                    ex.ctx = RequestContext(
                        EnvoyRequest(protocol.headers_of(message.request_headers))  # type: ignore[arg-type]
                    )
                    ex.subset = protocol.subset_hint(message)
                    ex.duplex_request, ex.duplex_response = protocol.full_duplex(message)
                    if not ex.duplex_request or message.request_headers.end_of_stream:
                        yield protocol.CONTINUE_REQUEST_HEADERS
                    # Full duplex: the headers' answer waits for the body (it carries the
                    # destination), as the protocol allows.
                elif kind == "request_body":
                    part = message.request_body
                    if ex.routed:  # refused already (too large): nothing more to answer
                        continue
                    ex.body.append(part.body)
                    ex.body_size += len(part.body)
                    if ex.body_size > self.gateway.config.max_body_bytes:
                        yield self._too_large(ex)
                    elif part.end_of_stream:
                        for reply in await self._route(ex):
                            yield reply
                    elif not ex.duplex_request:
                        yield protocol.CONTINUE_REQUEST_BODY
                elif kind == "request_trailers":
                    if ex.duplex_request and not ex.routed:  # the body ended with trailers
                        for reply in await self._route(ex):
                            yield reply
                    yield protocol.CONTINUE_REQUEST_TRAILERS
                elif kind == "response_headers":
                    self._served(ex, protocol.served_endpoint(message))
                    yield self._response_headers(ex, message.response_headers)
                elif kind == "response_body":
                    part = message.response_body
                    reply = self._response_chunk(ex, part.body, part.end_of_stream)
                    if part.end_of_stream:
                        # Settled before Envoy lets the last bytes go: a client's next
                        # request sees this one's tokens counted.
                        await self._finish(ex)
                    yield reply
                elif kind == "response_trailers":
                    if ex.duplex_response and not ex.finished:
                        await self._finish(ex)  # the body ended with trailers
                    yield protocol.CONTINUE_RESPONSE_TRAILERS
        finally:
            ctx = ex.ctx
            if ctx is not None and not ex.finished:
                if ex.state is not None:  # Envoy ended the stream before the response ended
                    if ctx.upstream_status is None:
                        ctx.status = 499
                    ctx.error = "the stream ended early (client went away or upstream broke)"
                await self._finish(ex)

    # --- request -----------------------------------------------------------------------------

    def _too_large(self, ex: _Exchange) -> Any:
        """413 for a body over the gateway's limit (Envoy streams a FULL_DUPLEX_STREAMED body
        without a limit of its own); what was read is dropped."""
        err = too_large(self.gateway.config.max_body_bytes)
        ex.body = []
        ex.routed = True
        if ex.ctx is not None:
            self.gateway.refused(ex.ctx, err)
        return protocol.immediate(err, ex.ctx.request.path if ex.ctx is not None else "")

    async def _route(self, ex: _Exchange) -> list[Any]:
        """The answers that route the request (or refuse it) once its body is complete."""
        gw = self.gateway
        ctx = ex.ctx
        if ctx is None:  # a body before any headers: not what Envoy does
            return [protocol.CONTINUE_REQUEST_BODY]
        body = ex.body[0] if len(ex.body) == 1 else b"".join(ex.body)
        ex.body = []
        ex.routed = True
        try:  # the gateway's stages (Gateway.handle), but Envoy proxies
            gw.parse(ctx, body)
            gw.authenticate(ctx)
            await gw.route(ctx)
            await gw.reserve(ctx)
            await gw.admit(ctx)
            inference, decision = ctx.inference, ctx.decision
            assert inference is not None and decision is not None
            backend = decision.backend
            if ex.subset is not None:
                ctx.candidates = in_subset(ctx.candidates, ex.subset, backend.address)
            gw.schedule(ctx, min(len(ctx.candidates), 1 + self.fallbacks))
        except GatewayError as err:
            gw.refused(ctx, err)
            return [protocol.immediate(err, ctx.request.path)]
        pick = ctx.pick
        assert pick is not None
        chosen = pick.endpoints[0]
        gw.sent_to(ctx, chosen)  # the prefix index
        chosen.add_inflight(1)
        ex.state = chosen
        if inference.stream:  # counted until its first chunk (saturationMaxPrefilling)
            chosen.add_prefilling(1)
            ex.prefilling = chosen
        ex.prompt_tokens = sent_prompt_tokens(inference, ctx.scheduling)
        chosen.add_prefill_tokens(ex.prompt_tokens)
        ex.prompt_at = chosen
        ctx.endpoint = backend.address(chosen)
        ctx.attempts = 1
        ex.picked = {backend.address(e): e for e in pick.endpoints}
        addresses = list(ex.picked)
        if ex.duplex_request:
            return protocol.route_to_streamed(addresses, inference.final_body())
        sent = inference.final_body() if inference.dirty else None
        return [protocol.route_to(addresses, sent)]

    # --- response ----------------------------------------------------------------------------

    def _served(self, ex: _Exchange, address: str | None) -> None:
        """The data plane went down the list to ``address``: count that endpoint instead."""
        ctx, state = ex.ctx, ex.state
        if address is None or ctx is None or state is None or address == ctx.endpoint:
            return
        served = ex.picked.get(address)
        if served is None:  # not one the picker named: keep the accounting as it is
            return
        state.add_inflight(-1)
        self.gateway.answered(state, ok=False)  # passed over: it failed to connect or answer
        served.add_inflight(1)
        ex.state = served
        if ex.prefilling is not None:
            ex.prefilling.add_prefilling(-1)
            served.add_prefilling(1)
            ex.prefilling = served
        if ex.prompt_at is not None:
            ex.prompt_at.add_prefill_tokens(-ex.prompt_tokens)
            served.add_prefill_tokens(ex.prompt_tokens)
            ex.prompt_at = served
        ctx.failed(ctx.endpoint or "", "the data plane went on to the next endpoint")
        ctx.endpoint = address
        ctx.attempts += 1

    def _response_headers(self, ex: _Exchange, message: Any) -> Any:
        ctx = ex.ctx
        if ctx is None or ex.state is None:  # not a request the picker routed (or refused)
            return protocol.CONTINUE_RESPONSE_HEADERS
        headers = protocol.headers_of(message)
        status = headers.get(":status", "")
        ctx.status = ctx.upstream_status = int(status) if status.isdigit() else 0
        if "text/event-stream" in headers.get("content-type", ""):
            ex.scanner = StreamScanner()
        else:
            ex.response_body = []
            self._first_chunk(ex)  # no stream after all (an error): nothing to prefill
        extra = {ENDPOINT_HEADER: ctx.endpoint or ""}
        if ctx.response_headers:
            extra.update(ctx.response_headers)
        return protocol.response_headers(extra)

    def _response_chunk(self, ex: _Exchange, chunk: bytes, end: bool) -> Any:
        ctx, scanner = ex.ctx, ex.scanner
        data: bytes | None = None  # the bytes to send on instead of ``chunk``
        if ctx is None:
            pass
        elif scanner is not None:
            if ctx.ttft is None and chunk:
                ctx.ttft = time.perf_counter() - ctx.t0
                self._first_chunk(ex)
            scanner.feed(chunk)
            if end:
                scanner.feed(b"\n\n")  # an unterminated last event still counts
                ctx.end = time.perf_counter()
            relay = ctx.stream_filter  # a hook's (drops an injected usage chunk)
            if relay is not None:
                data = relay.feed(chunk)
                if end:
                    data += relay.flush()
        elif ex.response_body is not None:
            ex.response_body.append(chunk)
        if ex.duplex_response:  # Envoy forwards only what comes back
            body = chunk if data is None else data
            return protocol.pb.ProcessingResponse(response_body=protocol.streamed_chunk(body, end))
        if data is not None:
            return protocol.response_chunk(data)
        return protocol.CONTINUE_RESPONSE_BODY

    def _first_chunk(self, ex: _Exchange) -> None:
        """The stream's prefill is over: uncount it, and let flow control release a waiter
        (the hook the proxy calls on a first chunk, set with saturationMaxPrefilling)."""
        self._prompt_answered(ex)
        state, ex.prefilling = ex.prefilling, None
        if state is not None:
            state.add_prefilling(-1)
            self.gateway.prefilled()

    @staticmethod
    def _prompt_answered(ex: _Exchange) -> None:
        """The first byte came back (or the request ended): its prompt is no longer waiting."""
        state, ex.prompt_at = ex.prompt_at, None
        if state is not None:
            state.add_prefill_tokens(-ex.prompt_tokens)

    # --- end ---------------------------------------------------------------------------------

    async def _finish(self, ex: _Exchange) -> None:
        """Release the endpoint, settle the hooks on the usage seen, observe (once)."""
        ctx = ex.ctx
        if ex.finished or ctx is None:
            return
        ex.finished = True
        gw = self.gateway
        if ex.prefilling is not None:  # ended before its first chunk
            ex.prefilling.add_prefilling(-1)
            ex.prefilling = None
        self._prompt_answered(ex)
        state = ex.state
        if state is not None:
            state.add_inflight(-1)
            if ctx.status >= 500:
                gw.answered(state, ok=False)
            elif ctx.upstream_status:
                gw.answered(state, ok=True)
        if ex.scanner is not None:
            ctx.usage = Usage.of(ex.scanner.usage)
            ctx.events = ex.scanner.events
        elif ex.response_body and ctx.status < 400:
            data = b"".join(ex.response_body)
            if b'"usage"' in data:
                ctx.usage = Usage.of(extract_usage(data))
        if not ex.routed:  # a request without a body (GET /v1/models): Envoy's routes serve it
            return
        gw.settle(ctx)
        gw.observe(ctx)
