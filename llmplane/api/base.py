"""Shared building blocks for every resource API: camelCase models, metadata, conditions.

Validation happens in two passes, like Kubernetes (OpenAPI schema, then admission webhooks):
pydantic checks structure (types, enums, bounds, unknown fields), then each model's
``check()`` reports cross-field rules. Both passes report every violation with its field path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Violation:
    """One broken rule: where (dotted field path as the user wrote it) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def join_path(base: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{base}[{part}]"
    if not base:
        return part
    # Map keys that are not identifiers (labels like llmaz.io/x) are shown quoted.
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
        return f"{base}[{part!r}]"
    return f"{base}.{part}"


class ApiModel(BaseModel):
    """Base for every API struct: camelCase JSON names, unknown fields rejected.

    Attributes are snake_case in Python; ``model_dump(by_alias=True)`` gives the wire form.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=False,
        ser_json_timedelta="float",
    )

    def check(self, path: str) -> Iterator[Violation]:
        """Cross-field rules of this struct; ``path`` is where it sits in the document."""
        return iter(())

    def violations(self, path: str = "") -> list[Violation]:
        """Every rule broken by this struct and everything nested in it."""
        found: list[Violation] = list(self.check(path))
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            key = field.alias or name
            found.extend(_nested_violations(value, join_path(path, key)))
        return found

    def to_dict(self) -> dict[str, Any]:
        """The wire form a user would write back: aliases, defaults included, unset optionals omitted."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _nested_violations(value: Any, path: str) -> list[Violation]:
    if isinstance(value, ApiModel):
        return value.violations(path)
    if isinstance(value, list):
        out: list[Violation] = []
        for i, item in enumerate(value):
            out.extend(_nested_violations(item, join_path(path, i)))
        return out
    if isinstance(value, dict):
        out = []
        for k, item in value.items():
            out.extend(_nested_violations(item, join_path(path, str(k))))
        return out
    return []


def check_labels(labels: dict[str, str] | None, path: str) -> Iterator[Violation]:
    """Kubernetes label syntax: optional DNS subdomain prefix, name <= 63, value <= 63."""
    for key, value in (labels or {}).items():
        prefix, _, name = key.rpartition("/")
        if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
            yield Violation(join_path(path, key), "label key prefix must be a DNS-1123 subdomain")
        if not name or len(name) > 63 or not QUALIFIED_NAME.match(name):
            yield Violation(
                join_path(path, key),
                "label key name must be 1-63 alphanumeric characters, '-', '_' or '.', "
                "starting and ending with an alphanumeric character",
            )
        if len(value) > 63 or not LABEL_VALUE.match(value):
            yield Violation(
                join_path(path, key),
                "label value must be at most 63 alphanumeric characters, '-', '_' or '.', "
                "starting and ending with an alphanumeric character",
            )


class OwnerReference(ApiModel):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(ApiModel):
    """The metadata users and the store write; server-populated fields are accepted on read-back."""

    name: str
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    owner_references: list[OwnerReference] | None = None
    finalizers: list[str] | None = None
    # kubectl round-trips carry these; they are kept but never interpreted.
    managed_fields: list[dict[str, Any]] | None = None
    self_link: str | None = None

    def check(self, path: str) -> Iterator[Violation]:
        if not DNS1123_LABEL.match(self.name) or len(self.name) > 63:
            yield Violation(
                join_path(path, "name"),
                f"{self.name!r} must be a DNS-1123 label: at most 63 lowercase alphanumeric "
                "characters or '-', starting and ending with an alphanumeric character",
            )
        if self.namespace is not None and (
            not DNS1123_LABEL.match(self.namespace) or len(self.namespace) > 63
        ):
            yield Violation(join_path(path, "namespace"), "must be a DNS-1123 label")
        yield from check_labels(self.labels, join_path(path, "labels"))


class Condition(ApiModel):
    """metav1.Condition."""

    type: str
    status: str = Field(pattern="^(True|False|Unknown)$")
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None
    observed_generation: int | None = None


class ConditionedStatus(ApiModel):
    conditions: list[Condition] | None = None


@dataclass(frozen=True)
class ApiOwned:
    """A field llmplane's own commands write into a user's object (a Tenant's ``spec.keys``,
    written by ``llmplane keys``), as a field manager other than the user owns it under
    Kubernetes' server-side apply.

    An apply whose document leaves the field out keeps the stored value (``dump_resource``
    leaves it out of the wire form, the store keeps what it has); a document that gives it may
    add to it but not drop or change what is stored unless the apply forces it
    (``llmplane/store/owned.py``). ``list_key`` makes a list of objects mergeable item by item,
    like ``x-kubernetes-list-map-keys`` (it is also that in the CRD).
    """

    path: str  # in wire form, dotted: "spec.keys"
    writer: str  # who writes it, for messages: "llmplane keys"
    list_key: str | None = None


class Resource(ApiModel):
    """A top-level object. Subclasses set the class variables that describe the kind."""

    group: ClassVar[str]
    version: ClassVar[str]
    plural: ClassVar[str]
    short_names: ClassVar[tuple[str, ...]] = ()
    namespaced: ClassVar[bool] = True
    has_status: ClassVar[bool] = True
    # JSON paths of the scale subresource (spec replicas, status replicas, status selector).
    scale: ClassVar[tuple[str, str, str] | None] = None
    # kubectl-style printer columns: (name, type, jsonPath).
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = ()
    # Column title -> a JSONPath `llmplane get` shows when the column's own path finds nothing.
    printer_fallbacks: ClassVar[dict[str, str]] = {}
    # Fields llmplane's commands write and an apply of the user's file must not erase.
    api_owned: ClassVar[tuple[ApiOwned, ...]] = ()

    api_version: str
    kind: str
    metadata: ObjectMeta

    @classmethod
    def api_version_string(cls) -> str:
        return f"{cls.group}/{cls.version}"

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str | None:
        return self.metadata.namespace

    @property
    def ref(self) -> str:
        """``Kind/name`` (``Kind/namespace/name`` outside the default namespace) for messages."""
        ns = self.metadata.namespace
        if ns and ns != "default":
            return f"{self.kind}/{ns}/{self.metadata.name}"
        return f"{self.kind}/{self.metadata.name}"
