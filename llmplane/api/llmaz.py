"""``llmaz.io/v1alpha1``: OpenModel and the model claims Playgrounds and Services make."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import ClassVar, Literal

from pydantic import Field

from llmplane.api.base import ApiModel, ConditionedStatus, Resource, Violation, join_path
from llmplane.api.units import ResourceList

LLMAZ_GROUP = "llmaz.io"

# llmaz's protocols plus llmplane's `package://` (a file shipped in an installed Python package).
URI_PROTOCOLS = ("host", "ollama", "oss", "s3", "gcs", "package")
_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.+)")  # fullmatch: no trailing newline
# ollama's model names: [host[:port]/][namespace/]model[:tag] (its server's name grammar).
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
OLLAMA_MODEL = re.compile(
    rf"(?:{_PART}(?::[0-9]{{1,5}})?/)?(?:{_PART}/)?{_PART}(?::[A-Za-z0-9_][A-Za-z0-9._-]{{0,127}})?"
)


def split_uri(uri: str) -> tuple[str, str]:
    """``(protocol in lower case, address)``; raises ValueError naming the rule."""
    match = _URI.fullmatch(uri)
    if not match:
        raise ValueError(f"{uri!r} must have the form protocol://address")
    proto, address = match.group(1).lower(), match.group(2)
    if proto not in URI_PROTOCOLS:
        raise ValueError(f"protocol {match.group(1)!r} is not one of {', '.join(URI_PROTOCOLS)}")
    if proto == "oss":
        # bucket.endpoint/path
        bucket_endpoint, _, path = address.partition("/")
        if "." not in bucket_endpoint or not path:
            raise ValueError(f"{uri!r}: oss address must be bucket.endpoint/path")
    elif proto in ("s3", "gcs"):
        bucket, _, path = address.partition("/")
        if not bucket or not path:
            raise ValueError(f"{uri!r}: {proto} address must be bucket/path")
    elif proto == "ollama":
        if not OLLAMA_MODEL.fullmatch(address) or len(address) > 255:
            raise ValueError(
                f"{uri!r}: ollama address must be a model name as `ollama pull` takes it: "
                "[host/][namespace/]model[:tag] of letters, digits, '.', '_' and '-'"
            )
    elif proto == "package":
        package, _, path = address.partition("/")
        if not package or not path:
            raise ValueError(f"{uri!r}: package address must be python_package/path/to/file")
    return proto, address


class ModelHub(ApiModel):
    name: Literal["Huggingface", "ModelScope"] = "Huggingface"
    model_id: str = Field(alias="modelID", min_length=1)
    filename: str | None = None
    revision: str = "main"
    allow_patterns: list[str] | None = None
    ignore_patterns: list[str] | None = None

    def check(self, path: str) -> Iterator[Violation]:
        if self.filename is not None:
            if self.name == "ModelScope":
                yield Violation(join_path(path, "filename"), "is not supported with ModelScope")
            if self.allow_patterns or self.ignore_patterns:
                yield Violation(
                    join_path(path, "filename"),
                    "may not be set together with allowPatterns or ignorePatterns",
                )


class ModelSource(ApiModel):
    model_hub: ModelHub | None = None
    uri: str | None = Field(default=None, alias="uri")

    def check(self, path: str) -> Iterator[Violation]:
        if self.model_hub is None and self.uri is None:
            yield Violation(path, "one of modelHub or uri is required")
        if self.model_hub is not None and self.uri is not None:
            yield Violation(path, "only one of modelHub or uri may be set")
        if self.uri is not None:
            try:
                split_uri(self.uri)
            except ValueError as err:
                yield Violation(join_path(path, "uri"), str(err))


class Flavor(ApiModel):
    name: str = Field(min_length=1)
    limits: ResourceList | None = None
    node_selector: dict[str, str] | None = None
    params: dict[str, str] | None = None


class InferenceConfig(ApiModel):
    flavors: list[Flavor] | None = Field(default=None, max_length=8)

    def check(self, path: str) -> Iterator[Violation]:
        seen: set[str] = set()
        for i, flavor in enumerate(self.flavors or []):
            if flavor.name in seen:
                yield Violation(
                    join_path(join_path(join_path(path, "flavors"), i), "name"),
                    f"duplicate flavor name {flavor.name!r}",
                )
            seen.add(flavor.name)


class ModelSpec(ApiModel):
    family_name: str = Field(min_length=1)
    source: ModelSource
    inference_config: InferenceConfig | None = None


class OpenModel(Resource):
    group: ClassVar[str] = LLMAZ_GROUP
    version: ClassVar[str] = "v1alpha1"
    plural: ClassVar[str] = "openmodels"
    short_names: ClassVar[tuple[str, ...]] = ("om",)
    namespaced: ClassVar[bool] = False
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("FAMILY", "string", ".spec.familyName"),
        ("READY", "string", '.status.conditions[?(@.type=="Ready")].status'),
    )

    api_version: Literal["llmaz.io/v1alpha1"] = "llmaz.io/v1alpha1"
    kind: Literal["OpenModel"] = "OpenModel"
    spec: ModelSpec
    status: ConditionedStatus | None = None


# Claims (embedded in Playground and Service) ------------------------------------------------


class ModelClaim(ApiModel):
    model_name: str = Field(min_length=1)
    inference_flavors: list[str] | None = None


class ModelRef(ApiModel):
    name: str = Field(min_length=1)
    role: Literal["main", "draft"] = "main"


class ModelClaims(ApiModel):
    models: list[ModelRef] = Field(min_length=1)
    inference_flavors: list[str] | None = None

    def check(self, path: str) -> Iterator[Violation]:
        # llmaz counts main models by name (a bug); we count by role.
        models_path = join_path(path, "models")
        mains = sum(1 for m in self.models if m.role == "main")
        drafts = sum(1 for m in self.models if m.role == "draft")
        if drafts:
            if len(self.models) != 2:
                yield Violation(
                    models_path,
                    "with a draft model exactly two models are required (one main, one draft)",
                )
            if mains != 1:
                yield Violation(models_path, f"exactly one main model is required, got {mains}")
        elif mains != 1:
            yield Violation(models_path, f"exactly one main model is required, got {mains}")
