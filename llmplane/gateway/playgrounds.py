"""What the gateway reads from Playground objects and endpoints' model lists: the model names a
Playground serves, whether its engine is failing (for the 503 while no replica is ready), the
labels its replicas will carry (so a ModelServer or InferencePool selecting none yet can be
traced to the Playground that would fill it), and its LoRA adapters (reported by replicas,
declared in ``spec.loraAdapters``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llmplane.controlplane.plan import (
    BACKEND_LABEL,
    MODEL_NAME_LABEL,
    PLAYGROUND_LABEL,
    SERVICE_LABEL,
)
from llmplane.gateway.registry import EndpointState
from llmplane.runtime.status import (
    CRASH_LOOP,
    ENGINE_NOT_INSTALLED,
    LISTENS_BEYOND_LOOPBACK,
    LIVENESS_PROBE_FAILED,
    NO_LOCAL_COMMAND,
    STARTUP_PROBE_FAILED,
)


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


# Reasons an engine cannot serve until someone acts (a Restarting one is waited for).
_FAILING_REASONS = frozenset(
    {CRASH_LOOP, STARTUP_PROBE_FAILED, LIVENESS_PROBE_FAILED, ENGINE_NOT_INSTALLED}
    | {NO_LOCAL_COMMAND, LISTENS_BEYOND_LOOPBACK}
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


def replica_labels(playground: Mapping[str, Any]) -> dict[str, str]:
    """Labels every replica of ``playground`` carries (planning.py sets them on its Service's
    pods); empty when it claims no model."""
    spec = playground.get("spec") or {}
    models = playground_models(spec)
    if not models:
        return {}
    name = str((playground.get("metadata") or {}).get("name"))
    backend = (spec.get("backendRuntimeConfig") or {}).get("backendName") or "vllm"
    return {
        MODEL_NAME_LABEL: models[0],
        SERVICE_LABEL: name,
        PLAYGROUND_LABEL: name,
        BACKEND_LABEL: str(backend),
    }


def backing_workload(
    namespace: str,
    selector: Mapping[str, str],
    playgrounds: Iterable[Mapping[str, Any]],
    activatable: Mapping[str, str],
) -> str | None:
    """The workload (``namespace/name``) of the first activatable Playground whose replicas a
    ModelServer's or InferencePool's ``selector`` in ``namespace`` would select, if any."""
    if not selector:
        return None  # selects anything: no one Playground stands behind it
    for obj in playgrounds:
        meta = obj.get("metadata") or {}
        if (meta.get("namespace") or "default") != namespace:
            continue
        labels = replica_labels(obj)
        workload = f"{namespace}/{meta.get('name')}"
        if (
            labels
            and labels[MODEL_NAME_LABEL] in activatable
            and activatable[labels[MODEL_NAME_LABEL]] == workload
            and all(labels.get(k) == v for k, v in selector.items())
        ):
            return workload
    return None


class Target(Protocol):
    """What ``activatable_routes`` reads of a route's backend."""

    @property
    def ref(self) -> str: ...

    @property
    def candidates(self) -> Sequence[object]: ...


def activatable_routes(
    targets: Iterable[tuple[str, Sequence[Target | None]]],
    activatable: Mapping[str, str],
    selectors: Mapping[str, tuple[str, dict[str, str]]],
    playgrounds: list[dict[str, Any]],
) -> dict[str, str]:
    """Route names (``targets``: name -> its backends) whose every target selects no replica
    yet, while a Playground whose replicas a target would select is ``activatable`` (scaled to
    zero, starting, restarting), with that Playground's workload: the activator holds their
    requests too."""
    found: dict[str, str | None] = {}
    held: dict[str, str] = {}
    for name, backends in targets:
        if name in held or not backends or any(b is None or b.candidates for b in backends):
            continue
        for ref in (b.ref for b in backends if b is not None):
            if ref not in found:
                namespace, selector = selectors.get(ref, ("", {}))
                found[ref] = (
                    backing_workload(namespace, selector, playgrounds, activatable)
                    if namespace
                    else None
                )
            if workload := found[ref]:
                held[name] = workload
                break
    return held


@dataclass(frozen=True)
class DeclaredAdapter:
    """A LoRA adapter declared on a Playground (``spec.loraAdapters``), loaded on demand."""

    name: str
    path: str  # what the engine reads (lora_path)
    base: str  # the Playground's model


def adapters_on(state: EndpointState) -> set[str]:
    """The LoRA adapters an endpoint reports (its /v1/models less its own model names)."""
    return set(state.served_models or ()) - state.endpoint.served_names()


def reported_adapters(states: Iterable[EndpointState]) -> dict[str, list[EndpointState]]:
    """Adapter name -> endpoints that report it."""
    holders: dict[str, list[EndpointState]] = {}
    for state in states:
        for name in adapters_on(state):
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
