"""What the gateway reads from Playground objects and endpoints' model lists: the model names a
Playground serves, whether its engine is failing (for the 503 while no replica is ready), and
its LoRA adapters (reported by replicas, declared in ``spec.loraAdapters``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from llmplane.gateway.registry import EndpointState


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


@dataclass(frozen=True)
class DeclaredAdapter:
    """A LoRA adapter declared on a Playground (``spec.loraAdapters``), loaded on demand."""

    name: str
    path: str  # what the engine reads (lora_path)
    base: str  # the Playground's model


def reported_adapters(states: Iterable[EndpointState]) -> dict[str, list[EndpointState]]:
    """Adapter name -> endpoints whose ``/v1/models`` lists it (their own model names aside)."""
    holders: dict[str, list[EndpointState]] = {}
    for state in states:
        own = state.endpoint.served_names()
        for name in state.served_models or ():
            if name not in own:
                holders.setdefault(name, []).append(state)
    return holders


def declared_adapters(playgrounds: Iterable[Mapping[str, Any]]) -> Iterator[DeclaredAdapter]:
    """The ``spec.loraAdapters`` of Playgrounds (host:// sources; others are refused on apply)."""
    for obj in playgrounds:
        spec = obj.get("spec") or {}
        bases = playground_models(spec)
        for item in (spec.get("loraAdapters") or []) if bases else []:
            if not isinstance(item, Mapping):
                continue
            name, uri = item.get("name"), str((item.get("source") or {}).get("uri") or "")
            if name and uri.startswith("host:///"):
                yield DeclaredAdapter(str(name), uri[len("host://") :], bases[0])
