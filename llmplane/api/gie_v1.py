"""``inference.networking.k8s.io/v1``: InferencePool, and its conversion to and from v1alpha2.

The Gateway API Inference Extension's GA pool (api/v1/inferencepool_types.go): a label
selector (1-64 ``matchLabels``), 1-8 unique ``targetPorts``, the ``appProtocol`` spoken to
them and an optional ``endpointPickerRef``. v1 is the storage version: ``llmplane apply``
stores a v1alpha2 pool (``inference.networking.x-k8s.io``) converted to v1, and everything that
reads pools (routing, discovery, the endpoint picker) reads either shape through ``pool_v1``.
``to_v1alpha2`` is the way back, for clients that ask for the old group.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from llmplane.api.base import (
    ApiModel,
    Condition,
    Resource,
    Violation,
    check_labels,
    join_path,
)
from llmplane.api.gie import (
    DEFAULT_EXTENSION_PORT,
    GIE_GROUP,
    Group,
    Kind,
    ObjectName,
    PortNumber,
)
from llmplane.api.gie import (
    InferencePool as InferencePoolV1Alpha2,
)

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
H2C = "kubernetes.io/h2c"
MAX_PORTS = 8
MAX_SELECTOR_LABELS = 64
_NAMESPACE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_CONTROLLER_NAME = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"\/[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$"
)


class LabelSelector(ApiModel):
    """Pods by their labels, in the pool's namespace (Service-selector simple: labels only)."""

    match_labels: dict[str, str] = Field(min_length=1, max_length=MAX_SELECTOR_LABELS)

    def check(self, path: str) -> Iterator[Violation]:
        yield from check_labels(self.match_labels, join_path(path, "matchLabels"))


class Port(ApiModel):
    number: PortNumber


class EndpointPickerRef(ApiModel):
    """The endpoint picker the pool's parent calls; ``port`` is required for a Service."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.kind != 'Service' || has(self.port)",
                    "message": "port is required when kind is 'Service' or unspecified "
                    "(defaults to 'Service')",
                }
            ]
        }
    )

    group: Group = ""
    kind: Kind = "Service"
    name: ObjectName
    port: Port | None = None
    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"

    def check(self, path: str) -> Iterator[Violation]:
        if self.kind == "Service" and self.port is None:
            yield Violation(
                join_path(path, "port"),
                "required when kind is 'Service' or unspecified (defaults to 'Service')",
            )


class InferencePoolSpec(ApiModel):
    selector: LabelSelector
    target_ports: list[Port] = Field(
        min_length=1,
        max_length=MAX_PORTS,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(p1, self.exists_one(p2, p1.number==p2.number))",
                    "message": "port number must be unique",
                }
            ],
        },
    )
    app_protocol: Literal["http", "kubernetes.io/h2c"] = "http"
    endpoint_picker_ref: EndpointPickerRef | None = None

    def check(self, path: str) -> Iterator[Violation]:
        seen: set[int] = set()
        for i, port in enumerate(self.target_ports):
            if port.number in seen:
                yield Violation(
                    join_path(join_path(join_path(path, "targetPorts"), i), "number"),
                    f"port number must be unique ({port.number} is listed twice)",
                )
            seen.add(port.number)


class ParentReference(ApiModel):
    """The parent (usually a Gateway) a status entry is about."""

    group: Group = "gateway.networking.k8s.io"
    kind: Kind = "Gateway"
    name: ObjectName
    namespace: str | None = Field(default=None, min_length=1, max_length=63, pattern=_NAMESPACE)


class ParentStatus(ApiModel):
    """Conditions ``Accepted``, ``ResolvedRefs`` and ``Exported`` as one parent sees the pool."""

    conditions: list[Condition] | None = Field(default=None, max_length=8)
    parent_ref: ParentReference
    controller_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=_CONTROLLER_NAME
    )


class InferencePoolStatus(ApiModel):
    parents: list[ParentStatus] | None = Field(default=None, max_length=32)


class InferencePool(Resource):
    group: ClassVar[str] = GROUP
    version: ClassVar[str] = VERSION
    plural: ClassVar[str] = "inferencepools"
    short_names: ClassVar[tuple[str, ...]] = ("infpool",)
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("PORT", "integer", ".spec.targetPorts[0].number"),
        ("EPP", "string", ".spec.endpointPickerRef.name"),
    )

    api_version: Literal["inference.networking.k8s.io/v1"] = API_VERSION
    kind: Literal["InferencePool"] = "InferencePool"
    spec: InferencePoolSpec
    status: InferencePoolStatus | None = None


# --- conversion ----------------------------------------------------------------------------


def from_v1alpha2(doc: dict[str, Any]) -> dict[str, Any]:
    """A v1alpha2 pool (wire form, defaults applied or not) as a v1 document."""
    spec = doc.get("spec") or {}
    out_spec: dict[str, Any] = {
        "selector": {"matchLabels": dict(spec.get("selector") or {})},
        "targetPorts": [{"number": spec.get("targetPortNumber")}],
    }
    ext = spec.get("extensionRef")
    if isinstance(ext, dict):
        out_spec["endpointPickerRef"] = {
            **{k: ext[k] for k in ("group", "kind", "name", "failureMode") if k in ext},
            "port": {"number": ext.get("portNumber", DEFAULT_EXTENSION_PORT)},
        }
    out = {**doc, "apiVersion": API_VERSION, "spec": out_spec}
    status = doc.get("status")
    if isinstance(status, dict):
        parents = []
        for entry in status.get("parent") or []:
            ref = entry.get("parentRef") or {}
            group, _, _ = (ref.get("apiVersion") or "").rpartition("/")
            parent_ref = {"name": ref.get("name")}
            if ref.get("apiVersion"):
                parent_ref["group"] = group
            parent_ref.update({k: ref[k] for k in ("kind", "namespace") if ref.get(k)})
            parents.append({**entry, "parentRef": parent_ref})
        out["status"] = {"parents": parents} if parents else {}
    return out


def to_v1alpha2(doc: dict[str, Any]) -> dict[str, Any]:
    """A v1 pool as the v1alpha2 document an old client reads. v1alpha2 has one port and a
    required picker: the first port is kept, and a pool without a picker names none."""
    spec = doc.get("spec") or {}
    ports = spec.get("targetPorts") or [{}]
    out_spec: dict[str, Any] = {
        "selector": dict((spec.get("selector") or {}).get("matchLabels") or {}),
        "targetPortNumber": ports[0].get("number"),
    }
    ref = spec.get("endpointPickerRef")
    if isinstance(ref, dict):
        out_spec["extensionRef"] = {
            **{k: ref[k] for k in ("group", "kind", "name", "failureMode") if k in ref},
            "portNumber": (ref.get("port") or {}).get("number", DEFAULT_EXTENSION_PORT),
        }
    out = {**doc, "apiVersion": f"{GIE_GROUP}/v1alpha2", "spec": out_spec}
    status = doc.get("status")
    if isinstance(status, dict):
        parents = []
        for entry in status.get("parents") or []:
            ref = dict(entry.get("parentRef") or {})
            group = ref.pop("group", "gateway.networking.k8s.io")
            parent_ref = {
                "apiVersion": f"{group}/v1" if group else "v1",
                **{k: ref[k] for k in ("kind", "name", "namespace") if k in ref},
            }
            rest = {k: v for k, v in entry.items() if k not in ("parentRef", "controllerName")}
            parents.append({**rest, "parentRef": parent_ref})
        out["status"] = {"parent": parents} if parents else {}
    return out


def pool_v1(obj: dict[str, Any]) -> InferencePool:
    """A stored pool of either version as a validated v1 pool (raises on an invalid one)."""
    if obj.get("apiVersion") == InferencePoolV1Alpha2.api_version_string():
        old = InferencePoolV1Alpha2.model_validate(obj)
        obj = from_v1alpha2(old.to_dict())
    return InferencePool.model_validate(obj)
