"""The suite's layout, read from the source (AST): no module imports a test module (what tests
share lives in conftest.py and the helper modules under tests/, docs/testing.md), ``tests/``
imports nothing from ``bench/`` and ``bench/`` nothing from ``tests/``, and ``llmplane/``
neither. Code in string constants (snippets a test runs in a subprocess) is read too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imports(source: str, module: str) -> Iterator[str]:
    """The dotted names ``source`` (the text of ``module``) imports: modules, and for ``from X
    import Y`` also ``X.Y`` (Y may be a module)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative to the module's package
                package = module.split(".")[: -node.level]
                base = ".".join([*package, *([node.module] if node.module else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and code(node.value):
            yield from imports(node.value, module)


def code(text: str) -> bool:
    """``text`` is Python that imports something (not prose)."""
    try:
        return "import" in text and any(
            isinstance(node, (ast.Import, ast.ImportFrom)) for node in ast.walk(ast.parse(text))
        )
    except (SyntaxError, ValueError):  # ValueError: a NUL character
        return False


def is_test_module(name: str) -> bool:
    return name.rpartition(".")[2].startswith("test_") and (
        (ROOT / (name.replace(".", "/") + ".py")).is_file()
    )


def modules(*folders: str) -> Iterator[tuple[Path, str]]:
    """Every module below ``folders`` but this one (its examples below are forbidden imports)."""
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != Path(__file__).resolve():
                yield path, ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_no_module_imports_a_test_module() -> None:
    found = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path, module in modules("tests", "bench", "llmplane")
        for name in imports(path.read_text(), module)
        if is_test_module(name)
    ]
    assert not found, "move what they share into a helper module or conftest.py:\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [("tests", {"bench"}), ("bench", {"tests"}), ("llmplane", {"tests", "bench"})],
)
def test_tests_and_bench_import_nothing_of_each_other(folder: str, forbidden: set[str]) -> None:
    found = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path, module in modules(folder)
        for name in imports(path.read_text(), module)
        if name.split(".")[0] in forbidden
    ]
    assert not found, "\n".join(found)


SNIPPETS = [
    "from tests.integration.test_up import fleet",
    "import tests.unit.test_aio",
    "import tests.unit.test_aio as aio",
    "from tests.integration import test_up",
    "from .test_up import fleet",
    "from . import test_up",
    "def f():\n    from tests.integration.test_up import fleet",
    'SNIPPET = """\nimport sys\nfrom tests.integration.test_up import fleet\n"""',
]


@pytest.mark.parametrize("source", SNIPPETS)
def test_the_scan_sees_every_form_of_import(source: str) -> None:
    names = list(imports(source, "tests.integration.helper"))
    assert any(is_test_module(n) for n in names), names


def test_the_scan_lets_helper_modules_through() -> None:
    source = "from tests.integration.upcli import cli\nfrom . import conftest\nimport tests"
    names = list(imports(source, "tests.integration.helper"))
    assert names and not any(is_test_module(n) for n in names), names
