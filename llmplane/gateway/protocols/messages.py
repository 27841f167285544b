"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``), as vLLM
serves it: the fields, prompt text, usage and error shape the gateway reads and writes are in
docs/gateway.md's table of APIs."""

from __future__ import annotations

from typing import Any

import orjson

from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.http_server import Response
from llmplane.gateway.protocols.fields import positive, typed
from llmplane.gateway.protocols.text import content_text, messages_text

PATHS = ("/v1/messages", "/v1/messages/count_tokens")

# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
          415: "invalid_request_error", 429: "rate_limit_error"}  # fmt: skip


def check(doc: dict[str, Any], path: str) -> None:
    """400 for ``messages`` not an array, ``system`` not a string or an array and (to
    generate) ``max_tokens`` not a positive integer."""
    typed(doc, "messages", list, required=True)
    typed(doc, "system", str, list)
    if not path.endswith("/count_tokens"):
        positive(doc, "max_tokens", required=True)


def prompt_text(doc: dict[str, Any]) -> str:
    """The system prompt, then each message's role and text, in order."""
    parts: list[str] = []
    system = doc.get("system")
    if system is not None:
        parts.append("system:")
        content_text(system, parts)
        parts.append("\n")
    messages_text(doc.get("messages"), parts)
    return "".join(parts)


def error_response(err: GatewayError) -> Response:
    """``err`` in Anthropic's shape, with the headers the gateway's own would carry
    (``Retry-After``, the rate limits', the endpoint's)."""
    kind = _TYPES.get(err.status)
    if kind is None:
        kind = "overloaded_error" if err.code == ErrorCode.OVERLOADED else "api_error"
    response = err.response()
    response.body = orjson.dumps({"type": "error", "error": {"type": kind, "message": err.message}})
    return response


def stream_error(message: str) -> bytes:
    """The event that ends a stream the gateway cuts short, as Anthropic sends one (the
    ``anthropic`` client raises it)."""
    data = orjson.dumps({"type": "error", "error": {"type": "api_error", "message": message}})
    return b"event: error\ndata: " + data + b"\n\n"
