"""Credentials never reach the console: values under secret-looking keys are masked."""

from __future__ import annotations

from typing import Any

_ENDINGS = (
    "apikey",
    "adminkey",
    "accesskey",
    "secretkey",
    "privatekey",
    "token",
    "password",
    "passwd",
    "secret",
    "authorization",
    "credentials",
)
MASK = "********"


def secret_key(name: str) -> bool:
    """True for a field name that holds a credential: ``apiKey``, ``api_key``, ``bearerToken``,
    ``password``, ``key`` ... (``secretRef`` or ``keyName``, references to one, stay visible)."""
    flat = "".join(c for c in name.lower() if c.isalnum())
    return flat == "key" or flat.endswith(_ENDINGS)


def redact(value: Any) -> Any:
    """A copy of ``value`` with every non-empty scalar under a secret-looking key masked."""
    if isinstance(value, dict):
        return {
            k: MASK
            if secret_key(str(k)) and isinstance(v, str | int | float) and v != ""
            else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value
