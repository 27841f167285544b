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
