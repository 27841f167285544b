"""Every kind llmplane knows, and kubectl-style name resolution (plural, short, any case)."""

from __future__ import annotations

from llmplane.api.base import Resource
from llmplane.api.gie import InferenceModel, InferencePool
from llmplane.api.inference import BackendRuntime, Playground, Service
from llmplane.api.kthena import ModelRoute, ModelServer
from llmplane.api.llmaz import OpenModel
from llmplane.api.llmplane import Endpoint, Tenant

KINDS: dict[str, type[Resource]] = {}


def register(cls: type[Resource]) -> type[Resource]:
    KINDS[cls.model_fields["kind"].default] = cls
    return cls


for _cls in (
    OpenModel,
    Playground,
    Service,
    BackendRuntime,
    InferencePool,
    InferenceModel,
    ModelRoute,
    ModelServer,
    Endpoint,
    Tenant,
):
    register(_cls)


def resolve_kind(name: str) -> type[Resource]:
    """``pl``, ``playground``, ``playgrounds``, ``Playground`` and ``playgrounds.inference.llmaz.io``."""
    wanted = name.lower()
    for kind, cls in KINDS.items():
        names = {kind.lower(), cls.plural, *cls.short_names}
        names |= {f"{n}.{cls.group}" for n in (kind.lower(), cls.plural)}
        if wanted in names:
            return cls
    known = ", ".join(sorted(f"{k} ({cls.plural})" for k, cls in KINDS.items()))
    raise KeyError(f"unknown resource type {name!r}; known: {known}")
