"""InferencePool and InferenceModel (inference.networking.x-k8s.io/v1alpha2).

Every validation rule has a test here that fails without it, asserting the exact field path.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from llmplane.api.documents import InvalidResources, dump_resource, parse_document, parse_text
from llmplane.api.gie import InferenceModel, InferencePool
from llmplane.api.registry import KINDS, SERVED, resolve_kind
from llmplane.printing import jsonpath
from tests.unit.apihelpers import errors_of

DELETE = object()
API = "inference.networking.x-k8s.io/v1alpha2"


def model(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"modelName": "chat", "poolRef": {"name": "pool"}}
    base.update(spec)
    return {"apiVersion": API, "kind": "InferenceModel", "metadata": {"name": "m"}, "spec": base}


def pool(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "selector": {"app": "vllm"},
        "targetPortNumber": 8000,
        "extensionRef": {"name": "epp"},
    }
    base.update(spec)
    return {"apiVersion": API, "kind": "InferencePool", "metadata": {"name": "p"}, "spec": base}


def with_(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with the value at ``path`` replaced (or removed with DELETE)."""
    doc = copy.deepcopy(doc)
    parent: Any = doc
    for part in path[:-1]:
        parent = parent[part]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def expect(doc: dict[str, Any], path: str, fragment: str) -> None:
    """Rejected with a message ``Kind/name: <path>: ...fragment...``."""
    label = f"{doc['kind']}/{doc['metadata']['name']}"
    messages = errors_of(doc)
    hits = [m for m in messages if m.startswith(f"{label}: {path}: ") and fragment in m]
    assert hits, f"expected {label}: {path}: ...{fragment}..., got {messages}"


def valid(doc: dict[str, Any]) -> Any:
    assert errors_of(doc) == []
    return parse_document(doc)[0]


def targets(*weights: int | None) -> list[dict[str, Any]]:
    out = []
    for i, w in enumerate(weights):
        t: dict[str, Any] = {"name": f"t{i}"}
        if w is not None:
            t["weight"] = w
        out.append(t)
    return out


# --- registration and printing -----------------------------------------------------------------


def test_kinds_are_registered_namespaced_without_short_names() -> None:
    assert KINDS["InferenceModel"] is InferenceModel
    # v1 (inference.networking.k8s.io) is the pool's storage version; v1alpha2 is served.
    assert SERVED[(API, "InferencePool")].model is InferencePool
    for cls, plural in ((InferenceModel, "inferencemodels"), (InferencePool, "inferencepools")):
        assert cls.api_version_string() == API
        assert cls.plural == plural
        assert cls.namespaced
        assert cls.short_names == ()  # upstream defines none
        assert resolve_kind(plural) is KINDS[cls.__name__]
        assert resolve_kind(f"{plural}.inference.networking.x-k8s.io") is cls


def test_printer_columns_resolve_on_the_wire_form() -> None:
    im = dump_resource(valid(model(criticality="Sheddable")))
    cols = {name: jsonpath(im, p) for name, _, p in InferenceModel.printer_columns}
    assert cols == {"MODEL": "chat", "CRITICALITY": "Sheddable", "POOL": "pool"}
    ip = dump_resource(valid(pool()))
    cols = {name: jsonpath(ip, p) for name, _, p in InferencePool.printer_columns}
    assert cols == {"PORT": 8000, "EPP": "epp"}


# --- InferenceModel defaults -------------------------------------------------------------------


def test_inference_model_defaults_visible_after_dump() -> None:
    data = dump_resource(valid(model(targetModels=targets(None, None))))
    assert data["metadata"]["namespace"] == "default"
    assert data["spec"] == {
        "modelName": "chat",
        "criticality": "Default",
        "targetModels": [{"name": "t0", "weight": 1}, {"name": "t1", "weight": 1}],
        "poolRef": {
            "group": "inference.networking.x-k8s.io",
            "kind": "InferencePool",
            "name": "pool",
        },
    }


def test_upstream_standard_criticality_is_stored_as_default() -> None:
    resource, warnings = parse_document(model(criticality="Standard"))
    assert warnings == []
    assert resource.spec.criticality == "Default"
    assert dump_resource(resource)["spec"]["criticality"] == "Default"


@pytest.mark.parametrize("value", ["Critical", "Default", "Sheddable"])
def test_criticality_values(value: str) -> None:
    assert valid(model(criticality=value)).spec.criticality == value


def test_target_shares_follow_weights() -> None:
    spec = valid(model(targetModels=targets(3, 1))).spec
    assert spec.target_shares() == [("t0", 0.75), ("t1", 0.25)]
    assert valid(model()).spec.target_shares() == [("chat", 1.0)]
    assert valid(model(targetModels=targets(0, 0))).spec.target_shares() == [
        ("t0", 0.0),
        ("t1", 0.0),
    ]


# --- InferenceModel rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "path", "fragment"),
    [
        (with_(model(), ("spec", "modelName"), DELETE), "spec.modelName", "required"),
        (model(modelName=""), "spec.modelName", "at least 1 character"),
        (model(modelName="x" * 254), "spec.modelName", "at most 253 characters"),
        (model(criticality="High"), "spec.criticality", "'Critical', 'Default' or 'Sheddable'"),
        (model(criticality="default"), "spec.criticality", "'Default'"),
        (model(targetModels=targets(*[1] * 11)), "spec.targetModels", "at most 10 items"),
        (model(targetModels=[{"weight": 1}]), "spec.targetModels[0].name", "required"),
        (model(targetModels=[{"name": ""}]), "spec.targetModels[0].name", "at least 1"),
        (model(targetModels=[{"name": "x" * 254}]), "spec.targetModels[0].name", "at most 253"),
        (
            model(targetModels=targets(1, -1)),
            "spec.targetModels[1].weight",
            "greater than or equal to 0",
        ),
        (
            model(targetModels=targets(1, 1_000_001)),
            "spec.targetModels[1].weight",
            "less than or equal to 1000000",
        ),
        (
            model(targetModels=targets(5, None, 5)),
            "spec.targetModels[1].weight",
            "set weights on all targetModels or on none",
        ),
        (
            model(targetModels=targets(None, 0)),
            "spec.targetModels[0].weight",
            "must be set because other target models set a weight",
        ),
        (with_(model(), ("spec", "poolRef"), DELETE), "spec.poolRef", "required"),
        (model(poolRef={}), "spec.poolRef.name", "required"),
        (model(poolRef={"name": ""}), "spec.poolRef.name", "at least 1"),
        (model(poolRef={"name": "p" * 254}), "spec.poolRef.name", "at most 253"),
        (
            model(poolRef={"name": "p", "group": "Inference.X"}),
            "spec.poolRef.group",
            "DNS-1123 subdomain",
        ),
        (model(poolRef={"name": "p", "group": "a/b"}), "spec.poolRef.group", "DNS-1123 subdomain"),
        (
            model(poolRef={"name": "p", "group": ("a" * 62 + ".") * 4 + "abcd"}),
            "spec.poolRef.group",
            "at most 253",
        ),
        (model(poolRef={"name": "p", "kind": ""}), "spec.poolRef.kind", "at least 1"),
        (model(poolRef={"name": "p", "kind": "K" * 64}), "spec.poolRef.kind", "at most 63"),
        (
            model(poolRef={"name": "p", "kind": "inference/pool"}),
            "spec.poolRef.kind",
            "start with a letter",
        ),
        (model(poolRef={"name": "p", "kind": "1Pool"}), "spec.poolRef.kind", "start with a letter"),
        (model(poolRef={"name": "p", "kind": "Pool-"}), "spec.poolRef.kind", "start with a letter"),
        (with_(model(), ("spec",), DELETE), "spec", "required"),
        (model(modelname="chat"), "spec.modelname", "did you mean 'modelName'?"),
    ],
)
def test_inference_model_rules(doc: dict[str, Any], path: str, fragment: str) -> None:
    expect(doc, path, fragment)


def test_mixed_weights_report_every_unset_target() -> None:
    messages = errors_of(model(targetModels=targets(None, 2, None)))
    assert [m.split(": ")[1] for m in messages] == [
        "spec.targetModels[0].weight",
        "spec.targetModels[2].weight",
    ]


@pytest.mark.parametrize(
    "spec",
    [
        {"modelName": "x" * 253},
        {"targetModels": targets(*[1] * 10)},
        {"targetModels": targets(0, 1_000_000)},
        {"targetModels": targets(None, None, None)},
        {"targetModels": [{"name": "x" * 253}]},
        {"targetModels": []},
        {"poolRef": {"name": "p" * 253, "group": "", "kind": "K" * 63}},
        {"poolRef": {"name": "p", "group": "example.com", "kind": "My-Pool2"}},
    ],
)
def test_inference_model_boundaries_are_accepted(spec: dict[str, Any]) -> None:
    valid(model(**spec))


def test_inference_model_status_conditions() -> None:
    cond = {"type": "Accepted", "status": "True", "reason": "Accepted"}
    doc = model()
    doc["status"] = {"conditions": [cond]}
    assert valid(doc).status.conditions[0].type == "Accepted"
    doc["status"] = {"conditions": [dict(cond, type=f"T{i}") for i in range(9)]}
    expect(doc, "status.conditions", "at most 8 items")
    doc["status"] = {"conditions": [dict(cond, status="Yes")]}
    expect(doc, "status.conditions[0].status", "pattern")


# --- InferencePool -----------------------------------------------------------------------------


def test_inference_pool_defaults_visible_after_dump() -> None:
    data = dump_resource(valid(pool()))
    assert data["spec"]["extensionRef"] == {
        "group": "",
        "kind": "Service",
        "name": "epp",
        "portNumber": 9002,
        "failureMode": "FailClose",
    }
    assert data["metadata"]["namespace"] == "default"


@pytest.mark.parametrize(
    ("doc", "path", "fragment"),
    [
        (with_(pool(), ("spec", "selector"), DELETE), "spec.selector", "required"),
        (pool(selector={}), "spec.selector", "at least one label"),
        (pool(selector={"app": "bad value"}), "spec.selector.app", "label value"),
        (pool(selector={"-app": "x"}), "spec.selector['-app']", "label key name"),
        (pool(selector={"Bad_Prefix/app": "x"}), "spec.selector['Bad_Prefix/app']", "prefix"),
        (with_(pool(), ("spec", "targetPortNumber"), DELETE), "spec.targetPortNumber", "required"),
        (pool(targetPortNumber=0), "spec.targetPortNumber", "greater than or equal to 1"),
        (pool(targetPortNumber=65536), "spec.targetPortNumber", "less than or equal to 65535"),
        (with_(pool(), ("spec", "extensionRef"), DELETE), "spec.extensionRef", "required"),
        (pool(extensionRef={}), "spec.extensionRef.name", "required"),
        (pool(extensionRef={"name": ""}), "spec.extensionRef.name", "at least 1"),
        (pool(extensionRef={"name": "e" * 254}), "spec.extensionRef.name", "at most 253"),
        (
            pool(extensionRef={"name": "e", "portNumber": 0}),
            "spec.extensionRef.portNumber",
            "greater than or equal to 1",
        ),
        (
            pool(extensionRef={"name": "e", "portNumber": 65536}),
            "spec.extensionRef.portNumber",
            "less than or equal to 65535",
        ),
        (
            pool(extensionRef={"name": "e", "failureMode": "FailClosed"}),
            "spec.extensionRef.failureMode",
            "'FailOpen' or 'FailClose'",
        ),
        (
            pool(extensionRef={"name": "e", "group": "Core"}),
            "spec.extensionRef.group",
            "DNS-1123 subdomain",
        ),
        (
            pool(extensionRef={"name": "e", "kind": "a/b"}),
            "spec.extensionRef.kind",
            "start with a letter",
        ),
        (pool(extensionRef={"name": "e", "kind": ""}), "spec.extensionRef.kind", "at least 1"),
        (pool(targetPort=8000), "spec.targetPort", "did you mean 'targetPortNumber'?"),
    ],
)
def test_inference_pool_rules(doc: dict[str, Any], path: str, fragment: str) -> None:
    expect(doc, path, fragment)


@pytest.mark.parametrize(
    "spec",
    [
        {"targetPortNumber": 1},
        {"targetPortNumber": 65535},
        {"extensionRef": {"name": "e", "portNumber": 1, "failureMode": "FailOpen"}},
        {"extensionRef": {"name": "e", "portNumber": 65535, "group": "apps", "kind": "Service"}},
        {"selector": {"app.kubernetes.io/name": "vllm", "tier": ""}},
    ],
)
def test_inference_pool_boundaries_are_accepted(spec: dict[str, Any]) -> None:
    valid(pool(**spec))


def test_inference_pool_status_parents() -> None:
    doc = pool()
    parent = {
        "parentRef": {"kind": "Gateway", "name": "gw", "namespace": "default"},
        "conditions": [{"type": "Accepted", "status": "Unknown", "reason": "Pending"}],
    }
    doc["status"] = {"parent": [parent]}
    resource = valid(doc)
    assert resource.status.parent[0].parent_ref.name == "gw"
    doc["status"] = {"parent": [parent] * 33}
    expect(doc, "status.parent", "at most 32 items")
    doc["status"] = {"parent": [{"conditions": []}]}
    expect(doc, "status.parent[0].parentRef", "required")
    doc["status"] = {"parent": [dict(parent, conditions=parent["conditions"] * 9)]}
    expect(doc, "status.parent[0].conditions", "at most 8 items")


# --- whole documents ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "doc",
    [
        model(criticality="Critical", targetModels=targets(90, 10)),
        model(targetModels=targets(None, None)),
        pool(extensionRef={"name": "e", "failureMode": "FailOpen"}),
    ],
)
def test_round_trip_load_dump_load(doc: dict[str, Any]) -> None:
    first = valid(doc)
    dumped = dump_resource(first)
    second = valid(yaml.safe_load(yaml.safe_dump(dumped)))
    assert second == first
    assert dump_resource(second) == dumped


def test_examples_round_trip(examples_dir: Any) -> None:
    for name in ("inferencepool.yaml", "inferencemodel.yaml"):
        parsed = parse_text((examples_dir / name).read_text(), name)
        assert parsed.resources
        for resource in parsed.resources:
            again = parse_document(yaml.safe_load(yaml.safe_dump(dump_resource(resource))))[0]
            assert again == resource


def test_example_inference_model_splits_between_two_weighted_targets(examples_dir: Any) -> None:
    parsed = parse_text((examples_dir / "inferencemodel.yaml").read_text())
    split = next(r for r in parsed.resources if r.spec.target_models)
    assert [w for _, w in split.spec.target_shares()] == [0.9, 0.1]


def test_every_mistake_in_one_document_is_reported() -> None:
    doc = model(
        criticality="Urgent",
        modelname="oops",
        targetModels=targets(1, None, 2_000_000),
        poolRef={"name": "p", "kind": "bad kind"},
    )
    messages = errors_of(doc)
    paths = {m.split(": ")[1] for m in messages}
    assert paths == {
        "spec.criticality",
        "spec.modelname",
        "spec.poolRef.kind",
        "spec.targetModels[1].weight",  # the cross-field rule, despite the structural errors
        "spec.targetModels[2].weight",
    }
    assert any(
        m.startswith("InferenceModel/m: spec.targetModels[1].weight: must be set") for m in messages
    )
    assert any(
        m.startswith("InferenceModel/m: spec.targetModels[2].weight: ")
        and "less than or equal to 1000000" in m
        for m in messages
    )


def test_several_invalid_documents_are_all_reported() -> None:
    text = yaml.safe_dump_all([model(criticality="x"), pool(targetPortNumber=0)])
    with pytest.raises(InvalidResources) as err:
        parse_text(text, "f.yaml")
    assert len(err.value.messages) == 2
    assert err.value.messages[0].startswith("f.yaml#1: InferenceModel/m: spec.criticality: ")
    assert err.value.messages[1].startswith("f.yaml#2: InferencePool/p: spec.targetPortNumber: ")


def test_weights_set_in_python_follow_the_same_rule() -> None:
    from llmplane.api.gie import InferenceModelSpec, PoolObjectReference, TargetModel

    spec = InferenceModelSpec(
        model_name="m",
        pool_ref=PoolObjectReference(name="p"),
        target_models=[TargetModel(name="a", weight=2), TargetModel(name="b")],
    )
    assert [v.path for v in spec.violations("spec")] == ["spec.targetModels[1].weight"]
