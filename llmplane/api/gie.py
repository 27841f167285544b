"""``inference.networking.x-k8s.io/v1alpha2``: InferencePool and InferenceModel.

The Gateway API Inference Extension kinds. InferenceModel follows the fork's types (criticality
``Critical | Default | Sheddable``, default ``Default``, target weight default 1); upstream's
``Standard`` criticality is accepted and stored as ``Default``. Weights follow upstream's rule:
set on every target model or on none (then each defaults to 1, an equal split).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

from llmplane.api.base import (
    ApiModel,
    Condition,
    Resource,
    Violation,
    check_labels,
    join_path,
)

GIE_GROUP = "inference.networking.x-k8s.io"
GIE_VERSION = "v1alpha2"
_API_VERSION = "inference.networking.x-k8s.io/v1alpha2"

MAX_TARGET_MODELS = 10
MAX_WEIGHT = 1_000_000
DEFAULT_EXTENSION_PORT = 9002

_GROUP = re.compile(r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_KIND = re.compile(r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$")


def _group(value: str) -> str:
    if not _GROUP.match(value):
        raise ValueError(
            f"{value!r} must be empty (the core group) or a DNS-1123 subdomain "
            "such as inference.networking.x-k8s.io"
        )
    return value


def _kind(value: str) -> str:
    if not _KIND.match(value):
        raise ValueError(
            f"{value!r} must start with a letter and contain only letters, digits and '-' "
            "(a kind such as InferencePool or Service)"
        )
    return value


# Gateway API shared types (shared_types.go).
Group = Annotated[str, Field(max_length=253), AfterValidator(_group)]
Kind = Annotated[str, Field(min_length=1, max_length=63), AfterValidator(_kind)]
ObjectName = Annotated[str, Field(min_length=1, max_length=253)]
PortNumber = Annotated[int, Field(ge=1, le=65535)]


# InferenceModel ------------------------------------------------------------------------------


def _criticality_in(value: Any) -> Any:
    # Upstream v1alpha2 names the middle band ``Standard``; the fork calls it ``Default``.
    return "Default" if value == "Standard" else value


Criticality = Annotated[
    Literal["Critical", "Default", "Sheddable"],
    BeforeValidator(_criticality_in),
    # The CRD also admits upstream's spelling, so upstream manifests apply to a cluster as is.
    WithJsonSchema({"type": "string", "enum": ["Critical", "Default", "Sheddable", "Standard"]}),
]


class PoolObjectReference(ApiModel):
    """An InferencePool in the namespace of the InferenceModel."""

    group: Group = GIE_GROUP
    kind: Kind = "InferencePool"
    name: ObjectName


class TargetModel(ApiModel):
    """A base model or LoRA adapter as the model server names it, and its share of traffic.

    ``weight`` defaults to 1, but whether the user wrote it matters (all or none): see
    ``weight_set``.
    """

    name: str = Field(min_length=1, max_length=253)
    weight: int = Field(default=1, ge=0, le=MAX_WEIGHT)

    @property
    def weight_set(self) -> bool:
        """True when the document gave a weight (rather than taking the default)."""
        return "weight" in self.model_fields_set


class InferenceModelSpec(ApiModel):
    model_name: str = Field(min_length=1, max_length=253)
    criticality: Criticality = "Default"
    target_models: list[TargetModel] | None = Field(default=None, max_length=MAX_TARGET_MODELS)
    pool_ref: PoolObjectReference

    def check(self, path: str) -> Iterator[Violation]:
        targets = self.target_models or []
        with_weight = [t.weight_set for t in targets]
        if any(with_weight) and not all(with_weight):
            for i, target in enumerate(targets):
                if not target.weight_set:
                    yield Violation(
                        join_path(join_path(join_path(path, "targetModels"), i), "weight"),
                        "must be set because other target models set a weight "
                        "(set weights on all targetModels or on none)",
                    )

    def target_shares(self) -> list[tuple[str, float]]:
        """``(target name, share of traffic)``; the model name itself when no targets are set."""
        targets = self.target_models or []
        if not targets:
            return [(self.model_name, 1.0)]
        total = sum(t.weight for t in targets)
        if total == 0:
            return [(t.name, 0.0) for t in targets]
        return [(t.name, t.weight / total) for t in targets]


class InferenceModelStatus(ApiModel):
    conditions: list[Condition] | None = Field(default=None, max_length=8)


class InferenceModel(Resource):
    group: ClassVar[str] = GIE_GROUP
    version: ClassVar[str] = GIE_VERSION
    plural: ClassVar[str] = "inferencemodels"
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("MODEL", "string", ".spec.modelName"),
        ("CRITICALITY", "string", ".spec.criticality"),
        ("POOL", "string", ".spec.poolRef.name"),
    )

    api_version: Literal["inference.networking.x-k8s.io/v1alpha2"] = _API_VERSION
    kind: Literal["InferenceModel"] = "InferenceModel"
    spec: InferenceModelSpec
    status: InferenceModelStatus | None = None


# InferencePool -------------------------------------------------------------------------------


class Extension(ApiModel):
    """The endpoint picker service (ExtensionReference and ExtensionConnection inlined)."""

    group: Group = ""
    kind: Kind = "Service"
    name: ObjectName
    port_number: PortNumber = DEFAULT_EXTENSION_PORT
    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"


class InferencePoolSpec(ApiModel):
    selector: dict[str, str]
    target_port_number: PortNumber
    extension_ref: Extension

    def check(self, path: str) -> Iterator[Violation]:
        selector_path = join_path(path, "selector")
        if not self.selector:
            yield Violation(
                selector_path,
                "must have at least one label: an empty selector matches every pod in the namespace",
            )
        yield from check_labels(self.selector, selector_path)


class ObjectReference(ApiModel):
    """core/v1 ObjectReference (every field optional)."""

    kind: str | None = None
    namespace: str | None = None
    name: str | None = None
    uid: str | None = None
    api_version: str | None = None
    resource_version: str | None = None
    field_path: str | None = None


class PoolStatus(ApiModel):
    parent_ref: ObjectReference
    conditions: list[Condition] | None = Field(default=None, max_length=8)


class InferencePoolStatus(ApiModel):
    # Upstream's JSON name is the singular ``parent`` for a list of parents.
    parent: list[PoolStatus] | None = Field(default=None, max_length=32)


class InferencePool(Resource):
    group: ClassVar[str] = GIE_GROUP
    version: ClassVar[str] = GIE_VERSION
    plural: ClassVar[str] = "inferencepools"
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("PORT", "integer", ".spec.targetPortNumber"),
        ("EPP", "string", ".spec.extensionRef.name"),
    )

    api_version: Literal["inference.networking.x-k8s.io/v1alpha2"] = _API_VERSION
    kind: Literal["InferencePool"] = "InferencePool"
    spec: InferencePoolSpec
    status: InferencePoolStatus | None = None
