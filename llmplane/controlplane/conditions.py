"""Status conditions as Kubernetes keeps them: lastTransitionTime moves only on a status change."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

# llmaz's condition types and reasons.
PROGRESSING = "Progressing"
AVAILABLE = "Available"
READY = "Ready"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]] | None,
    type_: str,
    status: bool | str,
    reason: str,
    message: str = "",
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """A new list with ``type_`` set; keeps lastTransitionTime when the status did not change."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    out = [dict(c) for c in conditions or []]
    current = next((c for c in out if c.get("type") == type_), None)
    new: dict[str, Any] = {"type": type_, "status": value, "reason": reason, "message": message}
    if generation is not None:
        new["observedGeneration"] = generation
    if current is not None and current.get("status") == value:
        new["lastTransitionTime"] = current.get("lastTransitionTime") or now()
        out[out.index(current)] = new
    else:
        new["lastTransitionTime"] = now()
        if current is not None:
            out[out.index(current)] = new
        else:
            out.append(new)
    return out


def get_condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def is_true(obj: dict[str, Any], type_: str) -> bool:
    c = get_condition(obj, type_)
    return bool(c and c.get("status") == "True")
