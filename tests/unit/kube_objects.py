"""Kubernetes objects rendered from llmplane YAML (``llmplane.runtime.kube``), the examples, and
the model-runner container of a pod template."""

from __future__ import annotations

from typing import Any

from llmplane.api.documents import parse_text
from llmplane.render import builtin_backend_models
from llmplane.runtime.kube import KubeOptions, objects_for
from tests.unit.kube_schemas import ROOT

EXAMPLES = ROOT / "examples"


def render(text: str, options: KubeOptions | None = None) -> list[dict[str, Any]]:
    resources = parse_text(text).resources
    return objects_for(resources, builtin_backend_models(), options)


def model_runner(template: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in template["spec"]["containers"] if c["name"] == "model-runner")
