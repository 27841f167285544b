"""Every kind llmplane knows, and kubectl-style name resolution (plural, short, any case).

``KINDS`` holds each kind's storage version. ``SERVED`` holds the other versions a kind is still
accepted in, with the conversions to and from the storage version: an InferencePool in
``inference.networking.x-k8s.io/v1alpha2`` is stored as ``inference.networking.k8s.io/v1``; an
InferenceObjective or InferenceModelRewrite in the Inference Extension's old group as
``llm-d.ai/v1alpha2``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmplane.api import gie_v1, llmd
from llmplane.api.base import Resource
from llmplane.api.gie import InferenceModel
from llmplane.api.gie import InferencePool as InferencePoolV1Alpha2
from llmplane.api.gie_v1 import InferencePool
from llmplane.api.inference import BackendRuntime, Playground, Service
from llmplane.api.kthena import ModelRoute, ModelServer
from llmplane.api.llmaz import OpenModel
from llmplane.api.llmd import InferenceModelRewrite, InferenceObjective
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
    InferenceObjective,
    InferenceModelRewrite,
    ModelRoute,
    ModelServer,
    Endpoint,
    Tenant,
):
    register(_cls)


def _with_api_version(api_version: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda doc: {**doc, "apiVersion": api_version}


@dataclass(frozen=True)
class ServedVersion:
    """A version a kind is accepted in besides its storage version.

    ``model`` validates documents of this version (None: the schema is the storage
    version's, only ``apiVersion`` differs); ``to_storage`` / ``from_storage`` convert wire
    forms. ``crd``: a CRD of its own is generated for it (its group differs from the
    storage version's, so Kubernetes serves it as a separate resource)."""

    api_version: str
    kind: str
    model: type[Resource] | None
    to_storage: Callable[[dict[str, Any]], dict[str, Any]]
    from_storage: Callable[[dict[str, Any]], dict[str, Any]]
    crd: bool = False


SERVED: dict[tuple[str, str], ServedVersion] = {
    (v.api_version, v.kind): v
    for v in (
        ServedVersion(
            InferencePoolV1Alpha2.api_version_string(),
            "InferencePool",
            InferencePoolV1Alpha2,
            gie_v1.from_v1alpha2,
            gie_v1.to_v1alpha2,
            crd=True,
        ),
        *(
            ServedVersion(
                llmd.LEGACY_API_VERSION,
                kind,
                None,
                _with_api_version(llmd.API_VERSION),
                _with_api_version(llmd.LEGACY_API_VERSION),
            )
            for kind in ("InferenceObjective", "InferenceModelRewrite")
        ),
    )
}


def to_storage(doc: dict[str, Any]) -> dict[str, Any]:
    """A wire-form document in its kind's storage version (unchanged when it already is)."""
    served = SERVED.get((doc.get("apiVersion"), doc.get("kind")))  # type: ignore[arg-type]
    return served.to_storage(doc) if served is not None else doc


def in_version(obj: dict[str, Any], cls: type[Resource]) -> dict[str, Any]:
    """A stored object as ``cls``'s version shows it (``llmplane get`` of an older group)."""
    wanted = cls.api_version_string()
    if obj.get("apiVersion") == wanted:
        return obj
    obj = to_storage(obj)
    served = SERVED.get((wanted, obj.get("kind")))  # type: ignore[arg-type]
    return served.from_storage(obj) if served is not None else obj


def resolve_kind(name: str) -> type[Resource]:
    """``pl``, ``playground``, ``playgrounds``, ``Playground`` and ``playgrounds.inference.llmaz.io``.

    A name qualified with the group of a served version resolves to that version's model
    (``inferencepools.inference.networking.x-k8s.io``: v1alpha2), or to the storage version's
    when the schema is the same (``inferenceobjectives.inference.networking.x-k8s.io``)."""
    wanted = name.lower()
    for served in SERVED.values():
        cls = served.model or KINDS[served.kind]  # no model: the storage version's schema
        group = served.api_version.rpartition("/")[0]
        if wanted in {f"{n}.{group}" for n in (served.kind.lower(), cls.plural)}:
            return cls
    for kind, cls in KINDS.items():
        names = {kind.lower(), cls.plural, *cls.short_names}
        names |= {f"{n}.{cls.group}" for n in (kind.lower(), cls.plural)}
        if wanted in names:
            return cls
    known = ", ".join(sorted(f"{k} ({cls.plural})" for k, cls in KINDS.items()))
    raise KeyError(f"unknown resource type {name!r}; known: {known}")
