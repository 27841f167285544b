"""Validation of generated Kubernetes objects against the real schemas (shared by kube tests).

- built-in kinds: ``kubernetes_validate.validate(obj, version, strict=True)`` for 1.30 - 1.33;
- LeaderWorkerSet: ``schemas/leaderworkerset.x-k8s.io_v1.json`` (jsonschema), and each pod
  template inside it as a core/v1 ``PodTemplate`` with kubernetes-validate;
- llmplane custom resources: the openAPIV3Schema of the generated CRD (jsonschema).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSIONS = ("1.30", "1.31", "1.32", "1.33")
LWS_SCHEMA = ROOT / "schemas" / "leaderworkerset.x-k8s.io_v1.json"


@cache
def _lws_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(LWS_SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@cache
def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    from llmplane.api.crds import crd_documents

    out = {}
    for crd in crd_documents():
        group = crd["spec"]["group"]
        for version in crd["spec"]["versions"]:
            key = (f"{group}/{version['name']}", crd["spec"]["names"]["kind"])
            out[key] = version["schema"]["openAPIV3Schema"]
    return out


def _pod_template(template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "template"},
        "template": template,
    }


def validate(obj: dict[str, Any], versions: tuple[str, ...] = K8S_VERSIONS) -> None:
    """Raise if ``obj`` is not valid for every Kubernetes version in ``versions``."""
    key = (obj["apiVersion"], obj["kind"])
    if obj["kind"] == "LeaderWorkerSet":
        _lws_validator().validate(obj)
        lwt = obj["spec"]["leaderWorkerTemplate"]
        for name in ("leaderTemplate", "workerTemplate"):
            if name in lwt:
                for version in versions:
                    kubernetes_validate.validate(_pod_template(lwt[name]), version, strict=True)
        return
    if key in _crd_schemas():
        jsonschema.Draft7Validator(_crd_schemas()[key]).validate(obj)
        return
    for version in versions:
        kubernetes_validate.validate(obj, version, strict=True)


# Tests of the validation itself: a checker that accepts everything proves nothing. --------

import pytest  # noqa: E402

_LWS = {
    "apiVersion": "leaderworkerset.x-k8s.io/v1",
    "kind": "LeaderWorkerSet",
    "metadata": {"name": "x", "namespace": "default"},
    "spec": {
        "replicas": 1,
        "startupPolicy": "LeaderReady",
        "leaderWorkerTemplate": {
            "size": 1,
            "workerTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    },
}


def test_lws_schema_is_a_valid_json_schema_and_accepts_a_minimal_lws() -> None:
    validate(_LWS)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "startupPolicy"), "LeaderFirst"),
        (("spec", "leaderWorkerTemplate", "size"), 0),
        (("spec", "replicass"), 1),
        (("spec", "rolloutStrategy"), {"type": "Recreate"}),
    ],
)
def test_lws_schema_rejects_wrong_fields(path: tuple[str, ...], value: Any) -> None:
    import copy

    obj = copy.deepcopy(_LWS)
    target = obj
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate(obj)


def test_pod_templates_inside_lws_are_checked_strictly() -> None:
    import copy

    obj = copy.deepcopy(_LWS)
    obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["imag"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(obj)


def test_core_objects_are_checked_strictly() -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 8080, "targetPortt": 8080}]},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(service)
