"""The APIs the gateway serves beside OpenAI's chat, completions and embeddings: the Responses
API (``responses.py``), the Messages API (``messages.py``) and vLLM's ``/tokenize`` /
``/detokenize``. Here is what they share: which path is which API, which paths generate, which
engines lack which path, and usage in either API's fields."""

from __future__ import annotations

from typing import Any

from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.http_server import Response
from llmplane.gateway.protocols import messages, responses

TOKENIZE_PATHS = ("/tokenize", "/detokenize")
# Served like /v1/chat/completions (routed by the body's model, tenants, limits, scheduling).
PATHS = (*responses.PATHS, *messages.PATHS, *TOKENIZE_PATHS)
# Paths whose streams carry usage only when asked (``stream_options.include_usage``).
USAGE_ASKED = ("/v1/chat/completions", "/v1/completions")
# Paths that generate nothing: a token limit reserves no output tokens for them.
_NOT_GENERATING = ("/v1/embeddings", "/v1/messages/count_tokens", *TOKENIZE_PATHS)

# Engines known to lack a path (``Endpoint.engine``): llama.cpp's server (and the
# llama-cpp-python one ``llmplane up`` runs without it) has neither API, and tokenizes at other
# paths with other bodies (docs/engines.md).
_UNSERVED = {"llamacpp": frozenset(PATHS)}


def check(path: str, doc: dict[str, Any]) -> None:
    """The API's own checks of the fields the gateway acts on (400)."""
    if path in responses.PATHS:
        responses.check(doc)
    elif path in messages.PATHS:
        messages.check(doc, path)


def prompt_text(path: str, doc: dict[str, Any]) -> str | None:
    """The text a prefix cache sees for a Responses or Messages body; None for other paths
    (``request.prompt_text`` reads those)."""
    if path in responses.PATHS:
        return responses.prompt_text(doc)
    if path in messages.PATHS:
        return messages.prompt_text(doc)
    return None


def generates(path: str) -> bool:
    return path not in _NOT_GENERATING


def error_response(path: str, err: GatewayError) -> Response:
    """The gateway's error for a request to ``path``, in that API's shape."""
    if path in messages.PATHS:
        return messages.error_response(err)
    return err.response()


def unserved(engine: str, path: str, model: str) -> GatewayError | None:
    """The error for a request to ``path`` picked onto an engine that has no such path."""
    if path not in _UNSERVED.get(engine, ()):
        return None
    return GatewayError(
        501,
        f"model {model!r} is served by {engine}, which does not serve {path} "
        "(docs/engines.md); use /v1/chat/completions or /v1/completions",
        ErrorCode.UNSUPPORTED_PATH,
    )


def usage_counts(usage: dict[str, Any]) -> tuple[int, int]:
    """(input, output) tokens from a Responses or Messages ``usage`` object: Anthropic counts
    cache reads and writes apart from ``input_tokens``; they are input all the same."""
    total = 0
    for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        value = usage.get(key)
        if type(value) is int:
            total += value
    output = usage.get("output_tokens")
    return total, output if type(output) is int else 0
