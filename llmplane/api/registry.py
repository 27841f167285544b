"""Every kind llmplane knows, and kubectl-style name resolution (plural, short, any case)."""

from __future__ import annotations

from llmplane.api.base import Resource
from llmplane.api.inference import BackendRuntime, Playground, Service
from llmplane.api.llmaz import OpenModel

KINDS: dict[str, type[Resource]] = {}


def register(cls: type[Resource]) -> type[Resource]:
    KINDS[cls.model_fields["kind"].default] = cls
    return cls


for _cls in (OpenModel, Playground, Service, BackendRuntime):
    register(_cls)


def kind_of(cls: type[Resource]) -> str:
    return cls.model_fields["kind"].default


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


def _load_networking() -> None:
    # The data-plane API groups register themselves on import.
    import importlib

    for module in ("llmplane.api.gie", "llmplane.api.kthena"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise


_load_networking()
