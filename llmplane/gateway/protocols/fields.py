"""The 400 for a field the gateway acts on, worded as vLLM words its schema errors."""

from __future__ import annotations

from typing import Any

from llmplane.gateway.clip import shown
from llmplane.gateway.errors import ErrorCode, GatewayError

_NAMES = {str: "'string'", list: "'array'", int: "'integer'"}


def invalid(param: str, message: str) -> GatewayError:
    return GatewayError(400, message, ErrorCode.INVALID_TYPE, param=param)


def wrong_type(param: str, value: Any, kind: str = "'boolean'") -> GatewayError:
    return invalid(param, f"{shown(value)} is not of type {kind} - '{param}'")


def typed(doc: dict[str, Any], key: str, *types: type, required: bool = False) -> Any:
    """``doc[key]``, or the 400 when it is not of one of ``types`` (absent: only if required)."""
    value = doc.get(key)
    if (value is None and not required) or type(value) in types:
        return value
    raise wrong_type(key, value, " or ".join(_NAMES[t] for t in types))


def positive(doc: dict[str, Any], key: str, required: bool = False) -> None:
    """The 400 when ``doc[key]`` is not a positive integer."""
    value = typed(doc, key, int, required=required)
    if value is not None and value < 1:
        raise invalid(key, f"{value} is less than the minimum of 1 - '{key}'")
