"""Stand-in for Cython's ``cython`` module where Cython is not installed (a pure-Python
install): the hot path's modules declare C types with ``@cython.locals(...)`` (used only when
Cython compiles them, setup.py), and these do nothing, as Cython's own pure-mode shadow does.

Use it as ``try: import cython`` / ``except ImportError: from llmplane import cython_shim as
cython``: when compiling, Cython reads ``import cython`` itself and never runs the fallback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

compiled = False


def locals(**types: Any) -> Callable[[F], F]:
    """Types for a function's locals: nothing in pure Python."""
    return lambda function: function
