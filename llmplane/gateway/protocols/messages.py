"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``), as vLLM
0.32 serves it.

The gateway reads from its body: ``model``, ``stream``, ``max_tokens`` (required to generate;
what a token limit reserves) and the text a prefix cache sees: ``system`` (a string or text
blocks), then each message's role and text. Usage is the message's ``usage``: input tokens are
``input_tokens`` plus ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` when an
engine splits them out (Anthropic counts cached input apart), output tokens
``output_tokens``; a stream carries the input in ``message_start`` and the output in
``message_delta`` (``response_usage.StreamScanner`` merges the two). Errors are Anthropic's
shape: ``{"type": "error", "error": {"type", "message"}}`` with the same status.
"""

from __future__ import annotations

from typing import Any

import orjson

from llmplane.gateway.clip import shown
from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.http_server import Response
from llmplane.gateway.protocols.text import content_text, messages_text

PATHS = ("/v1/messages", "/v1/messages/count_tokens")

# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def _invalid(param: str, message: str) -> GatewayError:
    return GatewayError(400, message, ErrorCode.INVALID_TYPE, param=param)


def check(doc: dict[str, Any], path: str) -> None:
    """400 for what the gateway acts on missing or of the wrong type: ``messages`` an array,
    ``system`` a string or an array, and (to generate) ``max_tokens`` a positive integer."""
    messages = doc.get("messages")
    if not isinstance(messages, list):
        raise _invalid("messages", f"{shown(messages)} is not of type 'array' - 'messages'")
    system = doc.get("system")
    if system is not None and not isinstance(system, str | list):
        raise _invalid("system", f"{shown(system)} is not of type 'string' or 'array' - 'system'")
    if path.endswith("/count_tokens"):
        return
    tokens = doc.get("max_tokens")
    if type(tokens) is not int:
        raise _invalid("max_tokens", f"{shown(tokens)} is not of type 'integer' - 'max_tokens'")
    if tokens < 1:
        raise _invalid("max_tokens", f"{tokens} is less than the minimum of 1 - 'max_tokens'")


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


def error_type(err: GatewayError) -> str:
    if err.status in _TYPES:
        return _TYPES[err.status]
    return "overloaded_error" if err.code == ErrorCode.OVERLOADED else "api_error"


def error_response(err: GatewayError) -> Response:
    """``err`` in Anthropic's shape, with the headers the gateway's own would carry
    (``Retry-After``, the rate limits', the endpoint's)."""
    response = err.response()
    response.body = orjson.dumps(
        {"type": "error", "error": {"type": error_type(err), "message": err.message}}
    )
    return response


def stream_error(message: str) -> bytes:
    """The event that ends a stream the gateway cuts short, as Anthropic sends one (the
    ``anthropic`` client raises it)."""
    data = orjson.dumps({"type": "error", "error": {"type": "api_error", "message": message}})
    return b"event: error\ndata: " + data + b"\n\n"
