"""Property tests: whatever a user feeds the loader, the answer is a resource or a validation error."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmplane.api.documents import InvalidResources, parse_document, parse_text

EXAMPLES = [
    d
    for f in sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
    for d in yaml.safe_load_all(f.read_text())
    if isinstance(d, dict)
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(
        ["", "8Gi", "500m", "1m30s", "vllm", "main", "draft", "host://x", "{{ .ModelPath }}"]
    ),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return doc


def _accepts_or_rejects_cleanly(doc: Any) -> None:
    try:
        parse_document(doc)
    except InvalidResources as err:
        assert err.messages and all(isinstance(m, str) and m for m in err.messages)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=values)
def test_random_documents_only_give_validation_errors(doc: Any) -> None:
    _accepts_or_rejects_cleanly(doc)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_examples_only_give_validation_errors(data: st.DataObject) -> None:
    doc = copy.deepcopy(data.draw(st.sampled_from(EXAMPLES)))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        path = data.draw(st.sampled_from(_paths(doc)))
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            doc = _set(doc, path, data.draw(values))
        elif action == "delete" and path:
            parent = doc
            for part in path[:-1]:
                parent = parent[part]
            del parent[path[-1]]
        else:
            target = doc
            for part in path:
                target = target[part]
            if isinstance(target, dict):
                target[data.draw(st.text(max_size=12))] = data.draw(values)
    _accepts_or_rejects_cleanly(doc)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_arbitrary_text_only_gives_validation_errors(text: str) -> None:
    try:
        parse_text(text, "fuzz.yaml")
    except InvalidResources as err:
        assert err.messages
