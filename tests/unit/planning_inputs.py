"""What planning takes, parsed: an OpenModel, a Playground, a built-in BackendRuntime, a model
locator."""

from __future__ import annotations

from typing import Any

from llmplane.api.documents import parse_document
from llmplane.up import builtin_backends


def model(name: str = "llama3-8b", **spec: Any) -> Any:
    body: dict[str, Any] = {
        "familyName": "llama3",
        "source": {"modelHub": {"modelID": f"meta-llama/{name}"}},
    }
    body.update(spec)
    return parse_document(
        {
            "apiVersion": "llmaz.io/v1alpha1",
            "kind": "OpenModel",
            "metadata": {"name": name},
            "spec": body,
        }
    )[0]


def playground(**spec: Any) -> Any:
    body: dict[str, Any] = {"modelClaim": {"modelName": "llama3-8b"}}
    body.update(spec)
    return parse_document(
        {
            "apiVersion": "inference.llmaz.io/v1alpha1",
            "kind": "Playground",
            "metadata": {"name": "pg", "uid": "u1"},
            "spec": body,
        }
    )[0]


def backend(name: str = "vllm") -> Any:
    doc = next(d for d in builtin_backends() if d["metadata"]["name"] == name)
    return parse_document(doc)[0]


def locate(m: Any) -> str:
    return f"/models/{m.name}"
