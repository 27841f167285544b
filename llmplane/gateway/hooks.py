"""Hooks around each proxied request: the place token rate limits plug in.

``reserve`` runs after routing and before admission and scheduling: it may read (and change)
``inference.doc`` — for instance to inject ``stream_options.include_usage`` so the output
tokens of a stream can be counted; call ``inference.mark_dirty()`` after a change and the body
is re-encoded once together with any model rewrite — and may refuse with
``GatewayError(429, ..., retry_after=seconds)``. Whatever it returns is handed back to
``settle`` when the response has ended (always called once per successful ``reserve``, also
for failed requests), with the usage the engine reported (None if it reported none).

A hook that shapes the response returns a ``Reservation`` (or a subclass): its
``response_headers`` (or ``response_lines``, the same already rendered as header lines: for a
hook that makes many on every request) are added to the proxied response (e.g.
``x-ratelimit-*``) and the streamed body passes through its ``stream_filter`` (e.g. to drop a
usage chunk the client did not ask for; usage is read from the bytes before the filter).
Anything else it returns is only handed back to ``settle``.

A hook whose work rarely or never waits may also define ``reserve_now`` and ``settle_now``
(``SyncRequestHook``): plain functions the gateway calls instead, saving a coroutine per
hook and request. ``reserve_now`` returns the reservation, or ``LATER`` when it cannot decide
without waiting (the gateway then awaits ``reserve``); ``settle_now`` must never wait.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from llmplane.gateway.protocols import usage_counts
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
    """What a hook returns when it adds response headers or filters the stream.
    ``response_lines``: CRLF-terminated ``name: value`` lines (ASCII), appended to the
    response head as they are; when set, the gateway ignores ``response_headers`` (which
    then reads as those lines' pairs, made when asked for)."""

    __slots__ = ("_headers", "response_lines", "stream_filter")

    def __init__(
        self,
        response_headers: dict[str, str] | None = None,
        stream_filter: StreamFilter | None = None,
        response_lines: bytes | None = None,
    ) -> None:
        self._headers = response_headers
        self.stream_filter = stream_filter
        self.response_lines = response_lines

    @property
    def response_headers(self) -> dict[str, str] | None:
        if self._headers is None and self.response_lines:
            self._headers = header_pairs(self.response_lines)
        return self._headers

    @response_headers.setter
    def response_headers(self, value: dict[str, str] | None) -> None:
        self._headers = value


def header_pairs(lines: bytes) -> dict[str, str]:
    """Rendered header lines as a dict (for a reader that needs one, e.g. the endpoint
    picker, which hands Envoy header mutations)."""
    pairs = {}
    for line in lines.decode("latin-1").split("\r\n"):
        if line:
            name, _, value = line.partition(":")
            pairs[name] = value.strip()
    return pairs


class _Later:
    __slots__ = ()

    def __repr__(self) -> str:
        return "LATER"


LATER: Any = _Later()  # reserve_now's "await reserve for this request"


@runtime_checkable
class RequestHook(Protocol):
    async def reserve(self, inference: InferenceRequest, decision: Decision) -> object: ...

    async def settle(
        self,
        inference: InferenceRequest,
        decision: Decision,
        reservation: Any,
        usage: Usage | None,
        status: int,
    ) -> None: ...


@runtime_checkable
class SyncRequestHook(RequestHook, Protocol):
    """A ``RequestHook`` that can mostly decide without a coroutine (see the module doc)."""

    def reserve_now(self, inference: InferenceRequest, decision: Decision) -> object: ...

    def settle_now(
        self,
        inference: InferenceRequest,
        decision: Decision,
        reservation: Any,
        usage: Usage | None,
        status: int,
    ) -> None: ...


SettleNow = Callable[[InferenceRequest, Decision, Any, Usage | None, int], None]
# What a request holds of each hook until it ends: the hook, its ``settle_now`` (looked up
# once per hook list, None for a hook without one) and the reservation ``reserve`` made.
Held = tuple[RequestHook, SettleNow | None, object]
