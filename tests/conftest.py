"""Shared test helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The helper modules under tests/ assert too: pytest explains their failures as it does a
# test's (it rewrites test modules and conftest.py files on its own).
pytest.register_assert_rewrite(
    *(
        f"tests.{path.stem}"
        for path in (ROOT / "tests").iterdir()
        if path.stem not in ("__init__", "conftest")
        and (path.suffix == ".py" or (path / "__init__.py").is_file())
    )
)


@pytest.fixture
def examples_dir() -> Path:
    return ROOT / "examples"
