"""No import cycle anywhere in ``llmplane/``, read statically from every module's source.

Every import that can run counts: at module level and inside functions (an import moved into
a function to dodge a cycle is still a cycle), but not those under ``if TYPE_CHECKING:``, which
never run. ``from package import name`` depends on ``package.name`` when that is a module,
else on the package's ``__init__``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import llmplane

ROOT = Path(llmplane.__file__).resolve().parent


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package ``__init__``)."""
    out = {}
    for path in root.rglob("*.py"):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path, is_package)
    return out


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _type_checking(child):
            for other in child.orelse:
                yield from _imports_in(other)
            continue
        yield from _imports_in(child)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    else:
        yield from _imports(node)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the llmplane modules it imports."""
    modules = _modules(root)

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name.split(".") if is_package else name.split(".")[:-1]
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package[: len(package) - (node.level - 1)]
                    base = ".".join([*up, *([base] if base else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for target in targets:
                found = known(target)
                if found is not None and found != name:
                    edges.add(found)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycles_in_llmplane():
    graph = import_graph()
    assert "llmplane.gateway.proxy" in graph.get("llmplane.gateway.server", ())  # it read them
    assert cycles(graph) == [], "import cycles (each line: modules importing each other)"


def test_the_check_sees_cycles_through_function_level_imports(tmp_path):
    pkg = tmp_path / "llmplane"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from llmplane.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llmplane import d\n"
    )
    (pkg / "d.py").write_text("import llmplane.c\n")
    assert cycles(import_graph(pkg)) == [["llmplane.a", "llmplane.sub.b"]]
