"""Hooks around each proxied request: the place token rate limits plug in.

``reserve`` runs after routing and before admission and scheduling: it may read (and change)
``request.doc`` — for instance to inject ``stream_options.include_usage`` so the output tokens
of a stream can be counted; call ``request.mark_dirty()`` after a change and the body is
re-encoded once together with any model rewrite — and may refuse with
``GatewayError(429, ..., retry_after=seconds)``. Whatever it returns is handed back to
``settle`` when the response has ended (always called once per successful ``reserve``, also
for failed requests), with the usage the engine reported (None if it reported none).

The object ``reserve`` returns may carry two optional attributes the gateway applies:
``response_headers`` (a dict added to the proxied response, e.g. ``x-ratelimit-*``) and
``stream_filter`` (an object with ``feed(bytes) -> bytes`` and ``flush() -> bytes`` that the
streamed body passes through, e.g. to drop a usage chunk the client did not ask for; usage is
read from the bytes before the filter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.routing import Decision


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
        return cls(
            prompt if isinstance(prompt, int) else 0,
            completion if isinstance(completion, int) else 0,
        )


@runtime_checkable
class RequestHook(Protocol):
    async def reserve(self, request: InferenceRequest, decision: Decision) -> Any: ...

    async def settle(
        self,
        request: InferenceRequest,
        decision: Decision,
        reservation: Any,
        usage: Usage | None,
        status: int,
    ) -> None: ...
