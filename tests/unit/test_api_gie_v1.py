"""InferencePool ``inference.networking.k8s.io/v1`` (and its conversion to and from
v1alpha2), InferenceObjective and InferenceModelRewrite (``llm-d.ai/v1alpha2``): every rule
and default of the upstream types, with the exact field path of each error."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from llmplane.api.documents import dump_resource, parse_document, stored_form
from llmplane.api.gie_v1 import from_v1alpha2, pool_v1, to_v1alpha2
from llmplane.api.registry import KINDS, in_version, resolve_kind
from tests.unit.apihelpers import errors_of

V1 = "inference.networking.k8s.io/v1"
V1ALPHA2 = "inference.networking.x-k8s.io/v1alpha2"
LLMD = "llm-d.ai/v1alpha2"


def pool(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "vllm"}},
        "targetPorts": [{"number": 8000}],
    }
    base.update(spec)
    return {"apiVersion": V1, "kind": "InferencePool", "metadata": {"name": "p"}, "spec": base}


def objective(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"poolRef": {"name": "p"}}
    base.update(spec)
    return {
        "apiVersion": LLMD,
        "kind": "InferenceObjective",
        "metadata": {"name": "o"},
        "spec": base,
    }


def rewrite(*rules: dict[str, Any], api: str = LLMD) -> dict[str, Any]:
    return {
        "apiVersion": api,
        "kind": "InferenceModelRewrite",
        "metadata": {"name": "r"},
        "spec": {"poolRef": {"name": "p"}, "rules": list(rules)},
    }


def expect(doc: dict[str, Any], path: str, fragment: str) -> None:
    label = f"{doc['kind']}/{doc['metadata']['name']}"
    messages = errors_of(doc)
    hits = [m for m in messages if m.startswith(f"{label}: {path}: ") and fragment in m]
    assert hits, f"expected {label}: {path}: ...{fragment}..., got {messages}"


def wire(doc: dict[str, Any]) -> dict[str, Any]:
    return dump_resource(parse_document(doc)[0])


# --- InferencePool v1 -------------------------------------------------------------------------


def test_pool_defaults() -> None:
    data = wire(pool(endpointPickerRef={"name": "epp", "port": {"number": 9002}}))
    assert data["spec"]["appProtocol"] == "http"
    assert data["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    assert "endpointPickerRef" not in wire(pool())["spec"]  # optional since v1.5


def test_pool_is_the_storage_version_and_short_name() -> None:
    assert KINDS["InferencePool"].api_version_string() == V1
    assert resolve_kind("infpool") is KINDS["InferencePool"]


@pytest.mark.parametrize(
    ("doc", "path", "fragment"),
    [
        (pool(selector={"matchLabels": {}}), "spec.selector.matchLabels", "at least 1"),
        (
            pool(selector={"matchLabels": {f"k{i}": "v" for i in range(65)}}),
            "spec.selector.matchLabels",
            "at most 64",
        ),
        (
            pool(selector={"matchLabels": {"app": "a b"}}),
            "spec.selector.matchLabels.app",
            "label value",
        ),
        (pool(selector={"app": "vllm"}), "spec.selector.app", "unknown field"),
        (pool(selector={}), "spec.selector.matchLabels", "required"),
        (pool(targetPorts=[]), "spec.targetPorts", "at least 1"),
        (
            pool(targetPorts=[{"number": 8000 + i} for i in range(9)]),
            "spec.targetPorts",
            "at most 8",
        ),
        (
            pool(targetPorts=[{"number": 8000}, {"number": 8000}]),
            "spec.targetPorts[1].number",
            "unique",
        ),
        (
            pool(targetPorts=[{"number": 0}]),
            "spec.targetPorts[0].number",
            "greater than or equal to 1",
        ),
        (pool(targetPorts=[{"number": 65536}]), "spec.targetPorts[0].number", "less than or equal"),
        (pool(targetPortNumber=8000), "spec.targetPortNumber", "unknown field"),
        (pool(appProtocol="h2c"), "spec.appProtocol", "'http' or 'kubernetes.io/h2c'"),
        (
            pool(endpointPickerRef={"name": "epp"}),
            "spec.endpointPickerRef.port",
            "required when kind is 'Service'",
        ),
        (
            pool(endpointPickerRef={"name": "epp", "kind": "Service", "port": {}}),
            "spec.endpointPickerRef.port.number",
            "required",
        ),
        (
            pool(
                endpointPickerRef={"name": "e", "port": {"number": 1}, "failureMode": "FailClosed"}
            ),
            "spec.endpointPickerRef.failureMode",
            "'FailOpen' or 'FailClose'",
        ),
        (
            pool(endpointPickerRef={"port": {"number": 1}}),
            "spec.endpointPickerRef.name",
            "required",
        ),
        (
            pool(endpointPickerRef={"name": "e", "group": "Core", "port": {"number": 1}}),
            "spec.endpointPickerRef.group",
            "DNS-1123",
        ),
    ],
)
def test_pool_rules(doc: dict[str, Any], path: str, fragment: str) -> None:
    expect(doc, path, fragment)


@pytest.mark.parametrize(
    "spec",
    [
        {"targetPorts": [{"number": 1}, {"number": 65535}]},
        {"targetPorts": [{"number": 8000 + i} for i in range(8)]},
        {"selector": {"matchLabels": {f"k{i}": "v" for i in range(64)}}},
        {"appProtocol": "kubernetes.io/h2c"},
        {"endpointPickerRef": {"name": "picker", "kind": "Backend", "group": "x.example.com"}},
    ],
)
def test_pool_boundaries_are_accepted(spec: dict[str, Any]) -> None:
    assert errors_of(pool(**spec)) == []


def test_pool_status_parents() -> None:
    doc = pool()
    conditions = [
        {"type": t, "status": "True", "reason": t} for t in ("Accepted", "ResolvedRefs", "Exported")
    ]
    doc["status"] = {"parents": [{"parentRef": {"name": "gw"}, "conditions": conditions}]}
    status = wire(doc)["status"]["parents"][0]
    assert status["parentRef"] == {
        "group": "gateway.networking.k8s.io",
        "kind": "Gateway",
        "name": "gw",
    }
    assert [c["type"] for c in status["conditions"]] == ["Accepted", "ResolvedRefs", "Exported"]
    doc["status"] = {"parents": [{"parentRef": {"name": "gw"}}] * 33}
    expect(doc, "status.parents", "at most 32")
    doc["status"] = {"parents": [{"conditions": []}]}
    expect(doc, "status.parents[0].parentRef", "required")
    doc["status"] = {"parents": [{"parentRef": {"name": "gw"}, "controllerName": "example.com"}]}
    expect(doc, "status.parents[0].controllerName", "pattern")


# --- conversion --------------------------------------------------------------------------------

OLD = {
    "apiVersion": V1ALPHA2,
    "kind": "InferencePool",
    "metadata": {"name": "p", "namespace": "default"},
    "spec": {
        "selector": {"app": "vllm"},
        "targetPortNumber": 8000,
        "extensionRef": {"name": "epp", "portNumber": 9003, "failureMode": "FailOpen"},
    },
    "status": {
        "parent": [
            {
                "parentRef": {
                    "apiVersion": "gateway.networking.k8s.io/v1",
                    "kind": "Gateway",
                    "name": "gw",
                },
                "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}],
            }
        ]
    },
}


def test_v1alpha2_converts_to_v1_and_back() -> None:
    old = wire(copy.deepcopy(OLD))
    new = stored_form(parse_document(copy.deepcopy(OLD))[0])
    assert new["apiVersion"] == V1
    assert new["spec"] == {
        "selector": {"matchLabels": {"app": "vllm"}},
        "targetPorts": [{"number": 8000}],
        "appProtocol": "http",
        "endpointPickerRef": {
            "group": "",
            "kind": "Service",
            "name": "epp",
            "port": {"number": 9003},
            "failureMode": "FailOpen",
        },
    }
    assert new["status"]["parents"][0]["parentRef"] == {
        "group": "gateway.networking.k8s.io",
        "kind": "Gateway",
        "name": "gw",
    }
    back = to_v1alpha2(new)
    assert back["spec"] == old["spec"]
    assert back["status"]["parent"][0]["parentRef"] == old["status"]["parent"][0]["parentRef"]
    assert back["apiVersion"] == V1ALPHA2
    assert errors_of(back) == []
    # What `llmplane get inferencepools.inference.networking.x-k8s.io` shows of the stored v1.
    assert in_version(new, resolve_kind("inferencepools.inference.networking.x-k8s.io")) == back


def test_v1_converts_to_v1alpha2_and_back() -> None:
    new = wire(pool(endpointPickerRef={"name": "epp", "port": {"number": 9002}}))
    assert pool_v1(from_v1alpha2(to_v1alpha2(new))).to_dict()["spec"] == new["spec"]
    # Either shape reads as the same v1 pool.
    assert pool_v1(wire(copy.deepcopy(OLD))).spec.target_ports[0].number == 8000


# --- InferenceObjective -------------------------------------------------------------------------


def test_objective_priority_and_pool_ref_defaults() -> None:
    resource = parse_document(objective())[0]
    assert resource.spec.priority is None and resource.spec.effective_priority == 0
    assert "priority" not in resource.to_dict()["spec"]  # no default is written (upstream)
    assert resource.to_dict()["spec"]["poolRef"] == {
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
        "name": "p",
    }
    assert parse_document(objective(priority=-10))[0].spec.effective_priority == -10
    doc = objective(priority=3)
    doc["status"] = {"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}
    assert errors_of(doc) == []


@pytest.mark.parametrize(
    ("doc", "path", "fragment"),
    [
        (objective(priority=2**31), "spec.priority", "less than or equal"),
        (objective(priority=-(2**31) - 1), "spec.priority", "greater than or equal"),
        (objective(priority="high"), "spec.priority", "integer"),
        (objective(poolRef={}), "spec.poolRef.name", "required"),
        (objective(criticality="Critical"), "spec.criticality", "unknown field"),
        (objective(targetModels=[]), "spec.targetModels", "unknown field"),
    ],
)
def test_objective_rules(doc: dict[str, Any], path: str, fragment: str) -> None:
    expect(doc, path, fragment)


# --- InferenceModelRewrite ----------------------------------------------------------------------

EXACT = {"matches": [{"model": {"value": "a"}}], "targets": [{"modelRewrite": "b"}]}


def test_rewrite_defaults_and_legacy_group() -> None:
    data = wire(rewrite(EXACT))
    assert data["spec"]["rules"][0]["matches"][0]["model"] == {"type": "Exact", "value": "a"}
    resource, warnings = parse_document(rewrite(EXACT, api=V1ALPHA2))
    assert resource.api_version == LLMD  # stored in the group the kind moved to
    assert any("deprecated" in w for w in warnings)
    assert errors_of(rewrite({"matches": []})) == []  # no targets: the model as it is


@pytest.mark.parametrize(
    ("doc", "path", "fragment"),
    [
        (
            rewrite({"targets": [{"modelRewrite": "b", "weight": 0}]}),
            "spec.rules[0].targets[0].weight",
            "greater",
        ),
        (
            rewrite({"targets": [{"modelRewrite": "b", "weight": 1_000_001}]}),
            "spec.rules[0].targets[0].weight",
            "less",
        ),
        (
            rewrite({"targets": [{"modelRewrite": "b", "weight": 1}, {"modelRewrite": "c"}]}),
            "spec.rules[0].targets[1].weight",
            "set weights on all targets or on none",
        ),
        (rewrite({"targets": []}), "spec.rules[0].targets", "at least 1"),
        (
            rewrite({"targets": [{"modelRewrite": ""}]}),
            "spec.rules[0].targets[0].modelRewrite",
            "at least 1",
        ),
        (
            rewrite({"matches": [{"model": {"type": "Prefix", "value": "a"}}]}),
            "spec.rules[0].matches[0].model.type",
            "'Exact'",
        ),
        (
            rewrite({"matches": [{"model": {"value": ""}}]}),
            "spec.rules[0].matches[0].model.value",
            "at least 1",
        ),
        (rewrite({"matches": [{}]}), "spec.rules[0].matches[0].model", "required"),
    ],
)
def test_rewrite_rules(doc: dict[str, Any], path: str, fragment: str) -> None:
    expect(doc, path, fragment)


def test_unknown_api_version_names_every_accepted_one() -> None:
    doc = rewrite(EXACT, api="llm-d.ai/v1")
    (message,) = errors_of(doc)
    assert "'llm-d.ai/v1alpha2' or 'inference.networking.x-k8s.io/v1alpha2'" in message
    doc = pool()
    doc["apiVersion"] = "inference.networking.k8s.io/v1alpha2"
    (message,) = errors_of(doc)
    assert repr(V1) in message and repr(V1ALPHA2) in message


def test_printer_columns_resolve_on_the_wire_form() -> None:
    from llmplane.printing import jsonpath

    data = wire(pool(endpointPickerRef={"name": "epp", "port": {"number": 9002}}))
    cols = {name: jsonpath(data, p) for name, _, p in KINDS["InferencePool"].printer_columns}
    assert cols == {"PORT": 8000, "EPP": "epp"}
    data = wire(objective(priority=-2))
    cols = {name: jsonpath(data, p) for name, _, p in KINDS["InferenceObjective"].printer_columns}
    assert cols == {"INFERENCE POOL": "p", "PRIORITY": -2}


def test_kind_names_resolve_per_group() -> None:
    v1alpha2 = resolve_kind("inferencepools.inference.networking.x-k8s.io")
    assert v1alpha2.api_version_string() == V1ALPHA2
    assert resolve_kind("inferencepool.inference.networking.k8s.io") is KINDS["InferencePool"]
    # The old group of an objective has no schema of its own: the storage version's.
    old = resolve_kind("inferenceobjectives.inference.networking.x-k8s.io")
    assert old is KINDS["InferenceObjective"] and old.api_version_string() == LLMD
    assert resolve_kind("inferencemodelrewrite.llm-d.ai") is KINDS["InferenceModelRewrite"]
