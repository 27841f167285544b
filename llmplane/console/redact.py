"""Credentials never reach the console: values are masked by what they are for.

A value is a credential when its name says so (``secret_key``: the last word of the name is
``key``, ``token``, ``secret``, ``password``, ``credential``...), wherever the name is:

- a mapping's key (``apiKey: ...``; a Tenant key's ``salt`` and ``hash`` too);
- the ``name`` beside a ``value`` (Kubernetes-style env lists: ``{name: HF_TOKEN, value: ...}``);
- a command-line flag (``--api-key X``, ``--hf-token=X``, in argv lists and in log text);
- ``name=value`` / ``name: value`` in text (Python reprs in engine logs, URL query strings);
- a URL's user information (``https://user:pass@host``), always.

Text is also searched for the shapes of well-known keys (llmplane's own ``llmp-...``, Hugging
Face ``hf_...``, OpenAI ``sk-...``, GitHub ``ghp_...``, JWTs), whatever their name. A Secret
object's ``data`` and ``stringData`` are masked whole.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "********"
# The last word of a name that holds a credential (``aws_secret_access_key`` -> ``key``).
_WORDS = frozenset({"key", "salt", "hash", "sig", "signature", "cookie", "passphrase"})
_ENDINGS = (
    "apikey",
    "token",
    "password",
    "passwd",
    "pwd",
    "secret",
    "authorization",
    "credential",
    "credentials",
)
_SPLIT = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#'\"]+@")
_FLAG = re.compile(r"(--[A-Za-z0-9][\w.-]*)(?:=(\S*)|([ \t]+)(?!-)(\S+))")
_ASSIGNED = re.compile(
    r"([A-Za-z0-9_.-]*[A-Za-z0-9])(['\"]?[ \t]*(?:=|:(?!//))[ \t]*['\"]?)"
    r"((?:bearer|basic)[ \t]+)?([^\s'\",;&?)}\]]+)",
    re.IGNORECASE,
)
_SHAPES = re.compile(
    r"\bllmp-[A-Za-z0-9]{6,}-[A-Za-z0-9_-]{16,}"
    r"|\bhf_[A-Za-z0-9]{20,}"
    r"|\bsk-[A-Za-z0-9_-]{20,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
)


def secret_key(name: str) -> bool:
    """True for a name that holds a credential: ``apiKey``, ``HF_TOKEN``, ``--api-key``,
    ``AWS_SECRET_ACCESS_KEY``, ``password``, ``key`` ... (``secretRef``, ``keyName``,
    ``tokens`` or ``monkey``, which name no credential, are not)."""
    words = _SPLIT.findall(name)
    if not words:
        return False
    last = words[-1].lower()
    return last in _WORDS or last.endswith(_ENDINGS)


def _flag(match: re.Match[str]) -> str:
    if not secret_key(match[1]):
        return match[0]
    if match[3] is None:
        return f"{match[1]}={MASK}"
    return f"{match[1]}{match[3]}{MASK}"


def _assigned(match: re.Match[str]) -> str:
    if not secret_key(match[1]):
        return match[0]
    return f"{match[1]}{match[2]}{match[3] or ''}{MASK}"


def redact_text(text: str) -> str:
    """``text`` (a log, a message, a string field) with every credential in it masked."""
    text = _USERINFO.sub(rf"\1{MASK}@", text)
    text = _FLAG.sub(_flag, text)
    text = _ASSIGNED.sub(_assigned, text)
    return _SHAPES.sub(MASK, text)


def _masked(value: Any) -> Any:
    return MASK if isinstance(value, str | int | float) and value != "" else redact(value)


def _argv(items: list[Any]) -> list[Any]:
    """A list, with the value after a secret flag of its own (``["--api-key", "X"]``) masked."""
    out: list[Any] = []
    secret_next = False
    for item in items:
        if secret_next and isinstance(item, str):
            out.append(MASK)
        else:
            out.append(redact(item))
        secret_next = (
            isinstance(item, str)
            and item.startswith("-")
            and "=" not in item
            and secret_key(item.lstrip("-"))
        )
    return out


def redact(value: Any) -> Any:
    """A copy of ``value`` with every credential in it masked (see the module's docstring)."""
    if isinstance(value, dict):
        if value.get("kind") == "Secret":
            return {
                k: {f: _masked(v) for f, v in (d or {}).items()}
                if k in ("data", "stringData") and isinstance(d, dict)
                else redact(d)
                for k, d in value.items()
            }
        name = value.get("name")
        env_secret = isinstance(name, str) and "value" in value and secret_key(name)
        return {
            k: _masked(v) if (env_secret and k == "value") or secret_key(str(k)) else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return _argv(value)
    if isinstance(value, str):
        return redact_text(value)
    return value
