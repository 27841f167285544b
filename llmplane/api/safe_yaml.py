"""YAML from users at a bounded cost: every command that reads YAML goes through here.

PyYAML builds aliases as shared references, so a few hundred bytes of nested aliases (a
"billion laughs") parse quickly and then explode when validated, stored or printed; deeply
nested input recurses in the composer until ``RecursionError``. This loader counts aliases,
measures the size a document would have with every alias expanded, refuses recursive aliases
and bounds nesting, all while composing (before anything is built), and raises a
``yaml.MarkedYAMLError`` the callers already turn into one line naming the file and position.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_DEPTH = 100  # collections inside collections; Kubernetes objects stay well below 30
MAX_ALIASES = 10_000  # alias references per stream
MAX_EXPANDED_NODES = 100_000  # nodes aliases may add to a document once expanded


class YamlLimitError(yaml.MarkedYAMLError):
    """The input exceeds one of the bounds above; ``problem`` says which."""


class BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` with bounded nesting, alias count and alias expansion."""

    def __init__(self, stream: str | bytes | IO[Any]):
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:  # type: ignore[override]
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YamlLimitError(
                    problem=f"more than {MAX_ALIASES} aliases", problem_mark=event.start_mark
                )
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YamlLimitError(
                problem=f"nested deeper than {MAX_DEPTH} levels", problem_mark=event.start_mark
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:  # type: ignore[override]
        node = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node


def _check_expansion(root: Node) -> None:
    """Refuse recursive aliases and documents whose expanded size exceeds the bound.

    Sizes are memoised per node, so the check costs one visit per distinct node however
    often aliases repeat it; nesting is already bounded, so recursion depth is too.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()
    distinct = 0

    def size(node: Node) -> int:
        nonlocal distinct
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise YamlLimitError(problem="recursive alias", problem_mark=node.start_mark)
        distinct += 1
        total = 1
        if isinstance(node, SequenceNode | MappingNode):
            active.add(key)
            children = (
                (c for pair in node.value for c in pair)
                if isinstance(node, MappingNode)
                else iter(node.value)
            )
            for child in children:
                total += size(child)
            active.discard(key)
        sizes[key] = total
        return total

    expanded = size(root)
    if expanded - distinct > MAX_EXPANDED_NODES:
        raise YamlLimitError(
            problem=(
                f"aliases expand this document to {expanded} nodes "
                f"(more than {MAX_EXPANDED_NODES} beyond what is written)"
            ),
            problem_mark=root.start_mark,
        )


def describe(err: yaml.YAMLError, source: str) -> tuple[str, str]:
    """``(source:line:column, problem)`` on one line each (PyYAML's text spans several)."""
    mark = getattr(err, "problem_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    problem = getattr(err, "problem", None) or str(err).replace("\n", " ")
    return where, problem


def load_all(text: str | bytes | IO[Any]) -> Iterator[Any]:
    """Every document in ``text``, as ``yaml.safe_load_all`` but bounded."""
    return yaml.load_all(text, Loader=BoundedLoader)  # a SafeLoader subclass


def load(text: str | bytes | IO[Any]) -> Any:
    """The single document in ``text``, as ``yaml.safe_load`` but bounded."""
    return yaml.load(text, Loader=BoundedLoader)  # a SafeLoader subclass
