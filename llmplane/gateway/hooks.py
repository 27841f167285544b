"""Hooks around each proxied request: the place token rate limits plug in.

``reserve(ctx)`` runs after routing and before admission and scheduling, with the request's
``RequestContext`` (its parsed body ``ctx.inference``, its ``ctx.tenant``, the routing table's
``ctx.decision``): it may read (and change) ``ctx.inference.doc`` — for instance to inject
``stream_options.include_usage`` so the output tokens of a stream can be counted; call
``inference.mark_dirty()`` after a change and the body is re-encoded once together with any
model rewrite — and may refuse with ``GatewayError(429, ..., retry_after=seconds)``. Whatever
it returns is handed back to ``settle(ctx, reservation, usage)`` when the response has ended
(always called once per successful ``reserve``, also for failed requests; ``ctx.status`` is
what the client got), with the usage the engine reported (None if it reported none).
``settle`` is a plain function: the request has ended, nothing may hold its end up (a hook
with I/O to do then starts a task, as the limiter does for Redis).

A hook that shapes the response returns a ``Reservation`` (or a subclass): its
``response_headers`` are added to the proxied response (e.g. ``x-ratelimit-*``) and the
streamed body passes through its ``stream_filter`` (e.g. to drop a usage chunk the client did
not ask for; usage is read from the bytes before the filter).
Anything else it returns is only handed back to ``settle``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from llmplane.gateway.protocols import usage_counts

if TYPE_CHECKING:
    from llmplane.gateway.context import RequestContext


@dataclass(slots=True)
class Usage:
    """Token counts of one response (one per request: not frozen, which costs a call a field)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def of(cls, doc: dict[str, Any] | None) -> Usage | None:
        if not isinstance(doc, dict):
            return None
        prompt = doc.get("prompt_tokens")
        completion = doc.get("completion_tokens")
        if prompt is None and "input_tokens" in doc:  # Responses / Messages usage
            return cls(*usage_counts(doc))
        return cls(
            prompt if isinstance(prompt, int) else 0,
            completion if isinstance(completion, int) else 0,
        )


class StreamFilter(Protocol):
    """Rewrites a streamed body on its way to the client."""

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class Reservation:
    """What a hook returns when it adds response headers or filters the stream."""

    __slots__ = ("response_headers", "stream_filter")

    def __init__(
        self,
        response_headers: dict[str, str] | None = None,
        stream_filter: StreamFilter | None = None,
    ) -> None:
        self.response_headers = response_headers
        self.stream_filter = stream_filter


@runtime_checkable
class RequestHook(Protocol):
    async def reserve(self, ctx: RequestContext) -> object: ...

    def settle(self, ctx: RequestContext, reservation: Any, usage: Usage | None) -> None: ...
