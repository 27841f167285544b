"""``host://path``: a model already on this machine (or a hostPath volume). Nothing is copied."""

from __future__ import annotations

from pathlib import Path

from llmplane.loader.errors import NOT_FOUND, LoadError


def check(path: Path) -> Path:
    """The path itself; it must exist."""
    if not path.exists():
        raise LoadError(NOT_FOUND, f"host path {str(path)!r} does not exist")
    return path
