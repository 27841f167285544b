"""Rendering resources for people: kubectl-like tables, ages, and the printer-column JSONPaths."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import yaml

_FILTER = re.compile(r'^(\w+)\[\?\(@\.(\w+)=="([^"]*)"\)\]$')
_INDEX = re.compile(r"^(\w+)\[(\d+)\]$")


def jsonpath(obj: Any, path: str) -> Any:
    """The subset of JSONPath that CRD printer columns use: ``.a.b``, ``.a[0].c`` and
    ``.a[?(@.k=="v")].c``."""
    current = obj
    for part in _split(path):
        if current is None:
            return None
        index = _INDEX.match(part)
        match = _FILTER.match(part)
        if index:
            field, i = index.group(1), int(index.group(2))
            items = current.get(field) if isinstance(current, dict) else None
            current = items[i] if isinstance(items, list) and i < len(items) else None
        elif match:
            field, key, value = match.groups()
            items = current.get(field) if isinstance(current, dict) else None
            current = next(
                (i for i in items or [] if isinstance(i, dict) and str(i.get(key)) == value), None
            )
        elif isinstance(current, dict):
            current = current.get(part)
        else:
            return None
    return current


def _split(path: str) -> list[str]:
    parts, depth, buf = [], 0, ""
    for ch in path.lstrip("."):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "." and depth == 0:
            parts.append(buf)
            buf = ""
        else:
            buf += ch
    if buf:
        parts.append(buf)
    return parts


def age(timestamp: str | None, now: datetime | None = None) -> str:
    """kubectl's short age: 45s, 12m, 3h, 5d."""
    if not timestamp:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    seconds = int(((now or datetime.now(UTC)) - then).total_seconds())
    seconds = max(seconds, 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "d" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def cell(value: Any) -> str:
    if value is None:
        return "<none>"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | dict):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value)


class _Dumper(yaml.SafeDumper):
    """Block-style YAML with multi-line strings kept readable."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def to_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
