"""The validation of generated Kubernetes objects (``tests/unit/kube_schemas.py``) checked
itself: a checker that accepts everything proves nothing."""

from __future__ import annotations

from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.unit.kube_schemas import validate

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
