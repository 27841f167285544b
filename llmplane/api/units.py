"""Kubernetes quantities (``8Gi``, ``500m``) and durations (``100ms``, ``1m30s``).

Both keep the user's spelling on the wire (so a round trip returns what was written) and
parse to numbers for comparisons and use.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkKMGTPE]i?|m)?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def parse_quantity(text: str | int | float) -> Decimal:
    """Value of a Kubernetes quantity in base units (cores, bytes, devices)."""
    if isinstance(text, bool):
        raise ValueError("must be a quantity such as 4, 500m or 8Gi, not a boolean")
    if isinstance(text, int | float):
        return Decimal(str(text))
    match = _QUANTITY.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a quantity (examples: 4, 500m, 1.5, 8Gi, 1e3)")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        value = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a quantity (examples: 4, 500m, 1.5, 8Gi)") from None
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    if suffix in _DECIMAL:
        return value * _DECIMAL[suffix]
    if suffix[:1] in "eE":
        return value * (Decimal(10) ** int(suffix[1:]))
    raise ValueError(f"{text!r} has an unknown suffix {suffix!r}")


def _quantity_in(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("must be a quantity such as 4, 500m or 8Gi")
    parse_quantity(value)
    return value


Quantity = Annotated[
    str | int | float,
    BeforeValidator(_quantity_in),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
        }
    ),
]

ResourceList = dict[str, Quantity]

_DURATION_PART = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_duration(text: str) -> float:
    """Seconds in a Go/Kubernetes duration (``1h2m3.5s``, ``100ms``); ``0`` is allowed."""
    s = text.strip()
    if s == "0":
        return 0.0
    sign = -1.0 if s.startswith("-") else 1.0
    s = s.lstrip("+-")
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(s):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(s) or not s:
        raise ValueError(
            f"{text!r} is not a duration (examples: 100ms, 30s, 1m30s, 2h; units ns us ms s m h)"
        )
    return sign * total


def _duration_in(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a duration string such as 100ms, 30s or 1m30s")
    parse_duration(value)
    return value


Duration = Annotated[
    str,
    BeforeValidator(_duration_in),
    PlainSerializer(lambda v: v, return_type=str),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": r"^(0|[-+]?(([0-9]*\.)?[0-9]+(ns|us|µs|ms|s|m|h))+)$",
        }
    ),
]
