"""The Helm chart (deploy/helm/llmplane) rendered without Helm (not installable here: no apt
package, no PyPI wheel). The templates keep to a small Go-template subset - ``{{ .Values.x }}``,
``{{ .Release.Name }}``, ``| quote``, ``toYaml X | nindent N``, ``if`` / ``if not`` / ``else`` /
``end``, ``{{ "{{" }}`` and the ``{{-``/``-}}`` whitespace trims - which ``render_template``
implements."""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from tests.unit.kube_schemas import ROOT

CHART = ROOT / "deploy" / "helm" / "llmplane"


_ACTION = re.compile(r"\{\{(-)?\s*(.*?)\s*(-)?\}\}", re.S)


def _lookup(path: str, scope: dict[str, Any]) -> Any:
    value: Any = scope
    for part in path.lstrip(".").split("."):
        value = value[part]
    return value


def _expr(text: str, scope: dict[str, Any]) -> Any:
    text = text.strip()
    if text.startswith('"') and text.endswith('"'):
        return text[1:-1]
    stages = [s.strip() for s in text.split("|")]
    head = stages[0].split()
    if head[0] == "toYaml":
        value: Any = yaml.safe_dump(_lookup(head[1], scope), sort_keys=False).rstrip("\n")
    elif head[0].startswith("."):
        value = _lookup(head[0], scope)
    else:
        raise ValueError(f"unsupported template expression {text!r}")
    for stage in stages[1:]:
        name, *args = stage.split()
        if name == "quote":
            value = '"' + str(value).replace('"', '\\"') + '"'
        elif name == "nindent":
            pad = " " * int(args[0])
            value = "\n" + "\n".join(pad + line for line in str(value).splitlines())
        else:
            raise ValueError(f"unsupported template function {name!r}")
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def render_template(text: str, scope: dict[str, Any]) -> str:
    """The Go-template subset used by the chart (see the module docstring)."""
    pieces: list[tuple[str, str]] = []  # ("text", s) | ("action", s)
    pos = 0
    for match in _ACTION.finditer(text):
        before = text[pos : match.start()]
        if match.group(1):
            before = before.rstrip(" \t\n")
        pieces.append(("text", before))
        pieces.append(("action", match.group(2)))
        pos = match.end()
        if match.group(3):
            rest = text[pos:]
            pos += len(rest) - len(rest.lstrip(" \t\n"))
    pieces.append(("text", text[pos:]))

    out: list[str] = []
    stack: list[bool] = []  # whether each enclosing branch is emitting

    def emitting() -> bool:
        return all(stack)

    for kind, value in pieces:
        if kind == "text":
            if emitting():
                out.append(value)
            continue
        words = value.split()
        if words[0] == "if":
            negate = words[1] == "not"
            cond = bool(_lookup(words[2] if negate else words[1], scope))
            stack.append(cond != negate)
        elif words[0] == "else":
            stack[-1] = not stack[-1]
        elif words[0] == "end":
            stack.pop()
        elif emitting():
            out.append(str(_expr(value, scope)))
    assert not stack, "unbalanced if/end"
    return "".join(out)


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def render_chart(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    scope = {
        "Values": _deep_merge(yaml.safe_load((CHART / "values.yaml").read_text()), values or {}),
        "Release": {"Name": "llmplane", "Namespace": "llmplane-system"},
        "Chart": {
            "Name": chart["name"],
            "Version": chart["version"],
            "AppVersion": chart["appVersion"],
        },
    }
    docs = []
    for path in sorted((CHART / "templates").glob("*.yaml")):
        rendered = render_template(path.read_text(), scope)
        docs += [d for d in yaml.safe_load_all(rendered) if d]
    return docs
