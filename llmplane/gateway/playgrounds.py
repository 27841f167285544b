"""What the gateway reads from Playground objects: the model names they serve and whether their
engine is failing (for the 503 a client gets while no replica is ready)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def playground_models(spec: Mapping[str, Any]) -> list[str]:
    claim = spec.get("modelClaim")
    if isinstance(claim, Mapping) and claim.get("modelName"):
        return [claim["modelName"]]
    claims = spec.get("modelClaims")
    if isinstance(claims, Mapping):
        return [
            m["name"]
            for m in claims.get("models") or []
            if isinstance(m, Mapping) and m.get("name") and m.get("role", "main") == "main"
        ]
    return []


# Playground conditions that mean the engine cannot serve until someone acts (see runtime/status.py).
_FAILING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "StartupProbeFailed",
        "LivenessProbeFailed",
        "EngineNotInstalled",
        "NoLocalCommand",
    }
)


def failing_reason(playground: Mapping[str, Any]) -> str | None:
    """Why a Playground's engine is failing, from its Available condition; None if it is not."""
    conditions = (playground.get("status") or {}).get("conditions") or []
    available = next(
        (c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Available"), None
    )
    if available is None or available.get("reason") not in _FAILING_REASONS:
        return None
    meta = playground.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    where = f" -n {namespace}" if namespace != "default" else ""
    first = str(available.get("message") or "").split("\n", 1)[0]
    if "llmplane logs" not in first:
        first += f"; see `llmplane logs pl/{meta.get('name')}{where}`"
    return f"its engine is failing ({available['reason']}): {first}"
