"""OpenAI's Responses API (``POST /v1/responses``), as vLLM 0.32 serves it.

The gateway reads from its body: ``model``, ``stream``, ``max_output_tokens`` (the output
tokens a token limit reserves) and the text a prefix cache sees: ``instructions`` then the
``input`` (a string, or items: messages with a ``role`` and ``content`` as a string or parts
with ``text``). Usage is the response's ``usage`` (``input_tokens``, ``output_tokens``); a
stream carries it in its ``response.completed`` event's ``response.usage``. Errors are OpenAI's
shape, the gateway's own (``GatewayError``).
"""

from __future__ import annotations

from typing import Any

from llmplane.gateway.clip import shown
from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.protocols.text import message_text

PATHS = ("/v1/responses",)


def _invalid(param: str, message: str) -> GatewayError:
    return GatewayError(400, message, ErrorCode.INVALID_TYPE, param=param)


def check(doc: dict[str, Any]) -> None:
    """400 for a field the gateway acts on with the wrong type (``stream`` and the common
    fields are checked with chat's, ``request.check_fields``)."""
    tokens = doc.get("max_output_tokens")
    if tokens is not None:
        if type(tokens) is not int:
            raise _invalid(
                "max_output_tokens",
                f"{shown(tokens)} is not of type 'integer' - 'max_output_tokens'",
            )
        if tokens < 1:
            raise _invalid(
                "max_output_tokens", f"{tokens} is less than the minimum of 1 - 'max_output_tokens'"
            )
    instructions = doc.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _invalid(
            "instructions", f"{shown(instructions)} is not of type 'string' - 'instructions'"
        )
    value = doc.get("input")
    if value is not None and not isinstance(value, str | list):
        raise _invalid("input", f"{shown(value)} is not of type 'string' or 'array' - 'input'")


def prompt_text(doc: dict[str, Any]) -> str:
    """The instructions, then each input item's role and text, in order."""
    parts: list[str] = []
    instructions = doc.get("instructions")
    if isinstance(instructions, str):
        parts += ("system:", instructions, "\n")
    value = doc.get("input")
    if isinstance(value, str):
        parts += ("user:", value, "\n")
    elif isinstance(value, list):
        for item in value:
            message_text(item, parts)
    return "".join(parts)
