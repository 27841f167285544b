"""Hooks around each proxied request: the place token rate limits plug in (the contract:
docs/gateway.md, "Hook").

``settle`` is a plain function because the request has ended and nothing may hold its end up
(a hook with I/O to do then starts a task, as the limiter does for Redis). A hook that shapes
the response returns a ``Reservation``; anything else it returns is only handed back to
``settle``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

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


class RequestHook(Protocol):
    async def reserve(self, ctx: RequestContext) -> object: ...

    def settle(self, ctx: RequestContext, reservation: Any, usage: Usage | None) -> None: ...
