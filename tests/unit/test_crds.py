"""CRDs generated from the pydantic models: valid CRDs, structural schemas, same acceptance.

The API server cannot run here, so three things stand in for it:
- ``kubernetes-validate`` checks each CRD against the real apiextensions/v1 schema;
- a walk of every schema node checks Kubernetes' structural-schema rules;
- ``jsonschema`` validates documents against each CRD's ``openAPIV3Schema`` the way the API
  server does with ``kubectl apply`` (strict field validation: unknown fields are errors;
  ``null`` for a non-nullable field is pruned; defaults applied as the server applies them).
"""

from __future__ import annotations

import copy
import re
import types
import typing
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from llmplane.api.base import Resource
from llmplane.api.crds import (
    GENERATED_HEADER,
    INT_OR_STRING,
    PRESERVE_UNKNOWN,
    crd_document,
    crd_documents,
    crd_filename,
    crd_name,
    crds_yaml,
    openapi_schema,
    write_crds,
)
from llmplane.api.documents import InvalidResources, parse_document
from llmplane.api.legacy import upgrade_legacy_fields
from llmplane.api.registry import KINDS, SERVED

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_CRDS = ROOT / "deploy" / "crds"
EXAMPLE_DIRS = [
    ROOT / "examples",
    ROOT / "examples" / "gie-v1",
    ROOT / "llmplane" / "engines" / "builtin",
]
LLMAZ_KINDS = ("OpenModel", "Playground", "Service", "BackendRuntime")
KIND_NAMES = sorted(KINDS)


def _shipped_versions() -> list[str]:
    shipped = sorted(
        {".".join(v.split(".")[:2]) for v in kubernetes_validate.utils.all_versions()},
        key=lambda v: tuple(int(p) for p in v.split(".")),
    )
    wanted = [v for v in ("1.30", "1.31", "1.32", "1.33") if v in shipped]
    if shipped and shipped[-1] not in wanted:
        wanted.append(shipped[-1])  # and the newest the package knows
    return wanted


K8S_VERSIONS = _shipped_versions()


@pytest.fixture(scope="module")
def crds() -> dict[str, dict[str, Any]]:
    """The CRD of each kind's storage version, by kind."""
    return {
        kind: doc
        for doc in crd_documents()
        if KINDS[kind := doc["spec"]["names"]["kind"]].group == doc["spec"]["group"]
    }


@pytest.fixture(scope="module")
def crds_by_group() -> dict[tuple[str, str], dict[str, Any]]:
    """Every CRD (older groups served as resources of their own too), by (group, kind)."""
    return {(d["spec"]["group"], d["spec"]["names"]["kind"]): d for d in crd_documents()}


def _schema(crds: dict[str, dict[str, Any]], kind: str) -> dict[str, Any]:
    return crds[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _schema_for(crds_by_group: dict[tuple[str, str], dict[str, Any]], doc: dict[str, Any]):
    """The schema a document is checked against: its own group's CRD, else its kind's storage
    version (an older group with the same schema and no CRD of its own)."""
    group = str(doc.get("apiVersion", "")).rpartition("/")[0]
    crd = crds_by_group.get((group, doc["kind"]))
    if crd is None:
        crd = crds_by_group[(KINDS[doc["kind"]].group, doc["kind"])]
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


# -- an API-server stand-in ------------------------------------------------------------------


def _as_jsonschema(node: Any) -> Any:
    """A CRD schema as draft-4 JSON Schema (OpenAPI v3.0's base) with strict field validation."""
    if isinstance(node, list):
        return [_as_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: (v if k in ("enum", "default") else _as_jsonschema(v))
        for k, v in node.items()
        if not k.startswith("x-kubernetes-")
    }
    if "properties" in node:
        out["properties"] = {k: _as_jsonschema(v) for k, v in node["properties"].items()}
        if not node.get(PRESERVE_UNKNOWN):
            out["additionalProperties"] = False  # kubectl's strict field validation
    return out


def _prune_nulls(value: Any) -> Any:
    """The API server prunes ``null`` for fields that are not ``nullable`` (none of ours)."""
    if isinstance(value, dict):
        return {k: _prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune_nulls(v) for v in value]
    return value


def _apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting as the API server does it: missing fields get their default."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        extra = schema.get("additionalProperties")
        for key in list(value):
            sub = props.get(key) or (extra if isinstance(extra, dict) else None)
            if sub is not None:
                value[key] = _apply_defaults(value[key], sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_apply_defaults(v, schema["items"]) for v in value]
    return value


def _server_errors(schema: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft4Validator(
        _as_jsonschema(schema), format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER
    )
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(_prune_nulls(doc))
    ]


# -- CRD metadata -----------------------------------------------------------------------------


def test_every_registered_kind_has_a_crd(crds: dict[str, dict[str, Any]]) -> None:
    assert set(LLMAZ_KINDS) <= set(KINDS)
    assert set(crds) == set(KINDS)
    # Older groups Kubernetes serves as resources of their own get a CRD too.
    names = {d["metadata"]["name"] for d in crd_documents()}
    assert names == {crd_name(c) for c in KINDS.values()} | {
        crd_name(v.model) for v in SERVED.values() if v.crd and v.model is not None
    }
    for kind, cls in KINDS.items():
        crd = crds[kind]
        assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
        assert crd["kind"] == "CustomResourceDefinition"
        assert crd["metadata"]["name"] == f"{cls.plural}.{cls.group}"
        spec = crd["spec"]
        assert spec["group"] == cls.group
        assert spec["names"]["plural"] == cls.plural
        assert spec["names"]["kind"] == kind
        assert spec["names"]["listKind"] == f"{kind}List"
        assert spec["names"]["singular"] == kind.lower()
        assert spec["names"].get("shortNames", []) == list(cls.short_names)
        assert "llmplane" in spec["names"]["categories"]
        assert spec["scope"] == ("Namespaced" if cls.namespaced else "Cluster")
        (version,) = spec["versions"]
        assert version["name"] == cls.version
        assert version["served"] is True
        assert version["storage"] is True


def test_llmaz_scope_and_short_names(crds: dict[str, dict[str, Any]]) -> None:
    assert crds["OpenModel"]["spec"]["scope"] == "Cluster"
    assert crds["BackendRuntime"]["spec"]["scope"] == "Cluster"
    assert crds["Playground"]["spec"]["scope"] == "Namespaced"
    assert crds["Service"]["spec"]["scope"] == "Namespaced"
    short = {k: crds[k]["spec"]["names"]["shortNames"] for k in LLMAZ_KINDS}
    assert short == {
        "OpenModel": ["om"],
        "Playground": ["pl"],
        "Service": ["isvc"],
        "BackendRuntime": ["br"],
    }


def test_scale_subresource_of_playground_and_service(crds: dict[str, dict[str, Any]]) -> None:
    for kind in ("Playground", "Service"):
        sub = crds[kind]["spec"]["versions"][0]["subresources"]
        assert sub["status"] == {}
        assert sub["scale"] == {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    for kind in ("OpenModel", "BackendRuntime"):
        assert "scale" not in crds[kind]["spec"]["versions"][0]["subresources"]


def _node_at(schema: dict[str, Any], json_path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for part in json_path.strip(".").split("."):
        node = (node or {}).get("properties", {}).get(part)
    return node


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_subresources_and_columns_follow_the_model(
    crds: dict[str, dict[str, Any]], kind: str
) -> None:
    cls = KINDS[kind]
    version = crds[kind]["spec"]["versions"][0]
    subresources = version.get("subresources", {})
    assert ("status" in subresources) == cls.has_status
    if cls.has_status:
        assert "status" in version["schema"]["openAPIV3Schema"]["properties"]
    if cls.scale is None:
        assert "scale" not in subresources
    else:
        scale = subresources["scale"]
        schema = version["schema"]["openAPIV3Schema"]
        # Kubernetes requires these under .spec / .status; they must name real fields.
        assert scale["specReplicasPath"].startswith(".spec.")
        assert scale["statusReplicasPath"].startswith(".status.")
        assert (_node_at(schema, scale["specReplicasPath"]) or {}).get("type") == "integer"
        assert (_node_at(schema, scale["statusReplicasPath"]) or {}).get("type") == "integer"
        if "labelSelectorPath" in scale:
            assert (_node_at(schema, scale["labelSelectorPath"]) or {}).get("type") == "string"
    columns = version["additionalPrinterColumns"]
    expected = [{"name": n, "type": t, "jsonPath": p} for n, t, p in cls.printer_columns]
    assert columns[: len(expected)] == expected
    assert columns[-1] == {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


# -- the CRDs are valid Kubernetes objects -----------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("kind", KIND_NAMES)
def test_crd_validates_against_kubernetes(
    crds: dict[str, dict[str, Any]], kind: str, version: str
) -> None:
    assert kubernetes_validate.validate(crds[kind], version, strict=True) == version


def test_kubernetes_versions_cover_1_30_to_1_33() -> None:
    assert {"1.30", "1.31", "1.32", "1.33"} <= set(K8S_VERSIONS)


# -- structural schema rules ---------------------------------------------------------------

_JUNCTORS = ("anyOf", "allOf", "oneOf", "not")
_FORBIDDEN_IN_JUNCTORS = ("description", "type", "default", "additionalProperties", "nullable")
_INT_OR_STRING_ANYOF = [{"type": "integer"}, {"type": "string"}]


def _walk(node: dict[str, Any], path: str) -> typing.Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node (not junctor members) with a readable path."""
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{*}}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[*]")


def _all_keys(value: Any) -> typing.Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, sub in value.items():
            yield key, sub
            if key not in ("enum", "default"):
                yield from _all_keys(sub)
    elif isinstance(value, list):
        for sub in value:
            yield from _all_keys(sub)


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_schema_is_structural(crds: dict[str, dict[str, Any]], kind: str) -> None:
    schema = _schema(crds, kind)
    problems: list[str] = []
    for key, value in _all_keys(schema):
        if key in ("$ref", "$defs", "definitions", "const", "patternProperties", "prefixItems"):
            problems.append(f"{key} is not allowed")
        if key == "additionalProperties" and value is False:
            problems.append("additionalProperties: false is not allowed")
        if key == "uniqueItems" and value:
            problems.append("uniqueItems: true is not allowed")
    for path, node in _walk(schema, kind):
        if "properties" in node and node.get("type") != "object":
            problems.append(f"{path}: has properties but type {node.get('type')!r}")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: properties and additionalProperties are mutually exclusive")
        if "items" in node and node.get("type") != "array":
            problems.append(f"{path}: has items but type {node.get('type')!r}")
        if node.get("type") == "array" and not isinstance(node.get("items"), dict):
            problems.append(f"{path}: array without an items schema")
        if node.get(INT_OR_STRING):
            if "type" in node:
                problems.append(f"{path}: int-or-string node must not set type")
            if node.get("anyOf", _INT_OR_STRING_ANYOF) != _INT_OR_STRING_ANYOF:
                problems.append(f"{path}: int-or-string anyOf must be [integer, string]")
        else:
            if not node.get("type") and not node.get(PRESERVE_UNKNOWN):
                problems.append(f"{path}: no type")
            for junctor in _JUNCTORS:
                if junctor in node:
                    problems.append(f"{path}: {junctor} outside an int-or-string node")
        for junctor in ("anyOf", "allOf", "oneOf"):
            for member in node.get(junctor, []):
                if node.get(INT_OR_STRING) and member in _INT_OR_STRING_ANYOF:
                    continue
                for key in _FORBIDDEN_IN_JUNCTORS:
                    if key in member:
                        problems.append(f"{path}: {key} inside {junctor}")
        if "enum" in node and node.get("type"):
            wanted = {"string": str, "integer": int, "number": (int, float), "boolean": bool}
            py_type = wanted.get(node["type"])
            if py_type and not all(isinstance(v, py_type) for v in node["enum"]):
                problems.append(f"{path}: enum values do not match type {node['type']}")
        pattern = node.get("pattern")
        if pattern is not None:
            re.compile(pattern)
            # The API server uses Go's RE2: no lookaround, no backreferences.
            if re.search(r"\(\?[=!<]|\\[1-9]", pattern):
                problems.append(f"{path}: pattern {pattern!r} is not RE2")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_root_follows_kubernetes_rules(crds: dict[str, dict[str, Any]], kind: str) -> None:
    schema = _schema(crds, kind)
    assert schema["type"] == "object"
    props = schema["properties"]
    assert props["metadata"] == {"type": "object"}
    assert props["apiVersion"]["type"] == "string"
    assert props["kind"]["type"] == "string"
    assert "metadata" not in schema.get("required", [])
    assert "default" not in props["apiVersion"]
    assert "default" not in props["kind"]


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_defaults_are_valid_for_their_schema(crds: dict[str, dict[str, Any]], kind: str) -> None:
    """The API server rejects a CRD whose defaults fail validation or would be pruned."""
    problems = []
    for path, node in _walk(_schema(crds, kind), kind):
        if "default" in node:
            sub = {k: v for k, v in node.items() if k != "default"}
            problems += [f"{path}: {e}" for e in _server_errors(sub, node["default"])]
    assert not problems, "\n".join(problems)


# -- every pydantic field is in the schema (nothing a user writes is silently pruned) -------


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, dict, tuple, set, typing.Annotated):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def _unwrap(node: dict[str, Any]) -> dict[str, Any]:
    """Down through arrays and maps to the object node that holds a model's fields."""
    while "properties" not in node:
        if isinstance(node.get("items"), dict):
            node = node["items"]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            break
    return node


def _missing_fields(
    model: type[BaseModel], node: dict[str, Any], path: str, seen: set[type]
) -> list[str]:
    if model in seen:
        return []
    seen = seen | {model}
    node = _unwrap(node)
    if "properties" not in node:
        return [] if node.get(PRESERVE_UNKNOWN) else [f"{path}: no properties for {model.__name__}"]
    missing = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        sub = node["properties"].get(key)
        if sub is None:
            missing.append(f"{path}.{key}")
            continue
        for inner in _models_in(field.annotation):
            missing += _missing_fields(inner, sub, f"{path}.{key}", seen)
    return missing


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_every_model_field_is_in_the_schema(crds: dict[str, dict[str, Any]], kind: str) -> None:
    cls = KINDS[kind]
    schema = _schema(crds, kind)
    missing = []
    for name, field in cls.model_fields.items():
        if name == "metadata":
            continue
        key = field.alias or name
        assert key in schema["properties"], key
        for inner in _models_in(field.annotation):
            missing += _missing_fields(inner, schema["properties"][key], key, set())
    assert not missing, missing


def test_extra_allow_models_preserve_unknown_fields(crds: dict[str, dict[str, Any]]) -> None:
    spec = _schema(crds, "Service")["properties"]["spec"]
    pod_spec = spec["properties"]["workloadTemplate"]["properties"]["workerTemplate"]["properties"][
        "spec"
    ]
    assert pod_spec[PRESERVE_UNKNOWN] is True
    assert pod_spec["properties"]["containers"]["items"][PRESERVE_UNKNOWN] is True
    # ...but a strict model does not.
    assert PRESERVE_UNKNOWN not in spec["properties"]["modelClaims"]


def test_quantities_and_int_or_string(crds: dict[str, dict[str, Any]]) -> None:
    config = _schema(crds, "Playground")["properties"]["spec"]["properties"]["backendRuntimeConfig"]
    shm = config["properties"]["sharedMemorySize"]
    assert shm[INT_OR_STRING] is True and "type" not in shm
    limits = config["properties"]["resources"]["properties"]["limits"]
    assert limits["type"] == "object"
    assert limits["additionalProperties"][INT_OR_STRING] is True
    rolling = _schema(crds, "Service")["properties"]["spec"]["properties"]["rolloutStrategy"][
        "properties"
    ]["rollingUpdateConfiguration"]["properties"]
    assert rolling["maxUnavailable"] == {
        "default": 1,
        INT_OR_STRING: True,
        "anyOf": _INT_OR_STRING_ANYOF,
    }


def test_enums_bounds_and_defaults_come_from_the_model(crds: dict[str, dict[str, Any]]) -> None:
    om = _schema(crds, "OpenModel")["properties"]["spec"]["properties"]
    hub = om["source"]["properties"]["modelHub"]["properties"]
    assert hub["name"]["enum"] == ["Huggingface", "ModelScope"]
    assert hub["name"]["default"] == "Huggingface"
    assert hub["modelID"]["minLength"] == 1
    assert om["inferenceConfig"]["properties"]["flavors"]["maxItems"] == 8
    pl = _schema(crds, "Playground")["properties"]["spec"]
    assert pl["properties"]["replicas"] == {"type": "integer", "default": 1, "minimum": 0}
    # default_factory models become defaults, so the server fills them in like pydantic does.
    assert pl["properties"]["backendRuntimeConfig"]["default"] == {"backendName": "vllm"}
    assert _schema(crds, "Playground")["required"] == ["spec"]


# -- documents: the CRD accepts what the models accept, with the same defaults ---------------


def _example_docs() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for directory in EXAMPLE_DIRS:
        for path in sorted(directory.glob("*.y*ml")):
            for i, doc in enumerate(yaml.safe_load_all(path.read_text(encoding="utf-8"))):
                if isinstance(doc, dict) and doc.get("kind") in KINDS:
                    found.append((f"{path.relative_to(ROOT)}#{i + 1}", doc))
    return found


EXAMPLES = _example_docs()

# Documents that exercise what the examples may not: probes, int-or-string ports, status.
HANDWRITTEN = [
    {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "BackendRuntime",
        "metadata": {"name": "llamacpp"},
        "spec": {
            "image": "ghcr.io/ggml-org/llama.cpp",
            "version": "server",
            "command": ["llama-server"],
            "envs": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "startupProbe": {"httpGet": {"path": "/health", "port": 8080}, "failureThreshold": 30},
            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
            "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "sleep 5"]}}},
            "recommendedConfigs": [
                {
                    "name": "default",
                    "args": ["-m", "{{ .ModelPath }}"],
                    "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}},
                    "sharedMemorySize": "1Gi",
                }
            ],
            "local": {"command": ["llama-server"], "installHint": "pip install llama-cpp-python"},
        },
    },
    {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Playground",
        "metadata": {"name": "with-status", "namespace": "team-a"},
        "spec": {"modelClaim": {"modelName": "m"}, "elasticConfig": None},
        "status": {
            "replicas": 1,
            "selector": "app=x",
            "conditions": [
                {
                    "type": "Available",
                    "status": "True",
                    "reason": "PlaygroundReady",
                    "lastTransitionTime": "2024-05-01T10:00:00Z",
                }
            ],
        },
    },
]

DOCUMENTS = EXAMPLES + [(f"handwritten#{i + 1}", d) for i, d in enumerate(HANDWRITTEN)]


def test_examples_cover_the_llmaz_kinds() -> None:
    kinds = {doc["kind"] for _, doc in EXAMPLES}
    assert set(LLMAZ_KINDS) <= kinds


@pytest.mark.parametrize(("where", "doc"), DOCUMENTS, ids=[w for w, _ in DOCUMENTS])
def test_crd_accepts_what_the_model_accepts(
    crds_by_group: dict[tuple[str, str], dict[str, Any]], where: str, doc: dict[str, Any]
) -> None:
    resource, _ = parse_document(doc, where)
    schema = _schema_for(crds_by_group, doc)
    # Legacy shapes are upgraded by llmplane before validation; the CRD knows the current API.
    upgraded, _ = upgrade_legacy_fields(doc)
    assert _server_errors(schema, upgraded) == []
    # What llmplane writes back (defaults included) is accepted too.
    assert _server_errors(schema, resource.to_dict()) == []


@pytest.mark.parametrize(("where", "doc"), DOCUMENTS, ids=[w for w, _ in DOCUMENTS])
def test_server_defaults_equal_model_defaults(
    crds_by_group: dict[tuple[str, str], dict[str, Any]], where: str, doc: dict[str, Any]
) -> None:
    resource, _ = parse_document(doc, where)
    upgraded, _ = upgrade_legacy_fields(doc)
    defaulted = _apply_defaults(_prune_nulls(upgraded), _schema_for(crds_by_group, doc))
    wire = resource.to_dict()
    for part in ("spec", "status"):
        assert defaulted.get(part) == wire.get(part), part


def _playground(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Playground",
        "metadata": {"name": "p"},
        "spec": {"modelClaim": {"modelName": "m"}, **spec},
    }


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"modelClaims": {"models": [{"name": "a", "role": "primary"}]}}, "is not one of"),
        ({"replicas": -1}, "less than the minimum"),
        ({"replicas": "two"}, "is not of type 'integer'"),
        ({"backendRuntimeConfig": {"sharedMemorySize": "2GB"}}, "does not match"),
        ({"backendRuntimeConfig": {"backendName": ""}}, "non-empty"),
        ({"replica": 2}, "Additional properties are not allowed"),
    ],
)
def test_crd_rejects_what_the_model_rejects(
    crds: dict[str, dict[str, Any]], spec: dict[str, Any], fragment: str
) -> None:
    doc = _playground(**spec)
    if "modelClaims" in spec:
        del doc["spec"]["modelClaim"]
    errors = _server_errors(_schema(crds, "Playground"), doc)
    assert any(fragment in e for e in errors), errors
    with pytest.raises(InvalidResources):
        parse_document(doc)


def test_wrong_enum_in_openmodel_is_rejected(crds: dict[str, dict[str, Any]]) -> None:
    doc = {
        "apiVersion": "llmaz.io/v1alpha1",
        "kind": "OpenModel",
        "metadata": {"name": "m"},
        "spec": {"familyName": "f", "source": {"modelHub": {"name": "GitHub", "modelID": "a/b"}}},
    }
    errors = _server_errors(_schema(crds, "OpenModel"), doc)
    assert errors == [
        "spec.source.modelHub.name: 'GitHub' is not one of ['Huggingface', 'ModelScope']"
    ]


def test_unknown_fields_inside_a_pod_spec_are_kept(crds: dict[str, dict[str, Any]]) -> None:
    doc = {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Service",
        "metadata": {"name": "s"},
        "spec": {
            "modelClaims": {"models": [{"name": "m"}]},
            "workloadTemplate": {
                "workerTemplate": {
                    "spec": {
                        "containers": [{"name": "c", "securityContext": {"runAsUser": 1000}}],
                        "tolerations": [{"key": "gpu", "operator": "Exists"}],
                    }
                }
            },
        },
    }
    parse_document(doc)
    assert _server_errors(_schema(crds, "Service"), doc) == []


# -- generated files ----------------------------------------------------------------------------


def test_deploy_crds_are_up_to_date(tmp_path: Path) -> None:
    fresh = {p.name: p.read_text(encoding="utf-8") for p in write_crds(tmp_path)}
    checked_in = {
        p.name: p.read_text(encoding="utf-8")
        for p in DEPLOY_CRDS.glob("*.yaml")
        if p.read_text(encoding="utf-8").startswith(GENERATED_HEADER)
    }
    hint = "deploy/crds is stale: run `llmplane crds --out deploy/crds`"
    assert sorted(checked_in) == sorted(fresh), hint
    for name, text in fresh.items():
        assert checked_in[name] == text, f"{hint} ({name} differs)"


def test_write_crds_one_file_per_kind_and_removes_stale_ones(tmp_path: Path) -> None:
    (tmp_path / "old.example.com_things.yaml").write_text(GENERATED_HEADER + "kind: X\n")
    (tmp_path / "kustomization.yaml").write_text("resources: []\n")
    paths = write_crds(tmp_path)
    own = [v.model for v in SERVED.values() if v.crd and v.model is not None]
    assert sorted(p.name for p in paths) == sorted(crd_filename(c) for c in [*KINDS.values(), *own])
    assert not (tmp_path / "old.example.com_things.yaml").exists()
    assert (tmp_path / "kustomization.yaml").exists()
    for path in paths:
        (doc,) = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        cls = next(c for c in [*KINDS.values(), *own] if crd_filename(c) == path.name)
        assert doc == crd_document(cls)


def test_stream_has_every_crd() -> None:
    docs = [d for d in yaml.safe_load_all(crds_yaml()) if d]
    assert docs == crd_documents()


def test_generation_is_deterministic() -> None:
    assert crds_yaml() == crds_yaml()
    for cls in KINDS.values():
        assert openapi_schema(cls) == openapi_schema(cls)


def test_resource_subclasses_are_registered() -> None:
    assert all(issubclass(cls, Resource) for cls in KINDS.values())
