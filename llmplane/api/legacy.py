"""Older llmaz shapes (v0.1 blog posts) that users still paste, upgraded to the current API.

Each conversion is unambiguous and leaves a warning naming the modern field; shapes that cannot
be converted are left alone so validation reports them as unknown fields with a hint.
"""

from __future__ import annotations

import copy
from typing import Any


def upgrade_legacy_fields(doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A copy of ``doc`` with legacy fields converted, and one warning per conversion."""
    kind = doc.get("kind")
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return doc, []
    doc = copy.deepcopy(doc)
    spec = doc["spec"]
    warnings: list[str] = []
    if kind == "BackendRuntime":
        warnings += _backend_runtime(spec)
    elif kind == "OpenModel":
        warnings += _open_model(spec)
    return doc, warnings


def _backend_runtime(spec: dict[str, Any]) -> list[str]:
    warnings: list[str] = []
    if "commands" in spec and "command" not in spec:
        spec["command"] = spec.pop("commands")
        warnings.append("spec.commands is deprecated: converted to spec.command")
    args = spec.get("args")
    if (
        isinstance(args, list)
        and args
        and all(isinstance(a, dict) and "name" in a for a in args)
        and "recommendedConfigs" not in spec
    ):
        configs = []
        for entry in args:
            config = {k: v for k, v in entry.items() if k != "flags"}
            if "flags" in entry:
                config["args"] = entry["flags"]
            configs.append(config)
        del spec["args"]
        spec["recommendedConfigs"] = configs
        warnings.append(
            "spec.args[].flags is deprecated: converted to spec.recommendedConfigs[].args"
        )
    resources = spec.get("resources")
    if isinstance(resources, dict) and isinstance(spec.get("recommendedConfigs"), list):
        del spec["resources"]
        for config in spec["recommendedConfigs"]:
            if isinstance(config, dict):
                config.setdefault("resources", copy.deepcopy(resources))
        warnings.append(
            "spec.resources is deprecated: copied into each spec.recommendedConfigs[].resources"
        )
    return warnings


def _open_model(spec: dict[str, Any]) -> list[str]:
    warnings: list[str] = []
    config = spec.get("inferenceConfig")
    flavors = config.get("flavors") if isinstance(config, dict) else None
    for i, flavor in enumerate(flavors if isinstance(flavors, list) else []):
        if isinstance(flavor, dict) and "requests" in flavor and "limits" not in flavor:
            flavor["limits"] = flavor.pop("requests")
            warnings.append(
                f"spec.inferenceConfig.flavors[{i}].requests is deprecated: "
                f"converted to spec.inferenceConfig.flavors[{i}].limits"
            )
    return warnings
