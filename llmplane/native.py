"""The compiled hot path: load a Cython build of a module only when it was built from its
current source.

``setup.py`` compiles the gateway's hot-path modules at install time (when a C compiler and
Python's headers are there) into ``llmplane/_native/<module>.<hash><EXT_SUFFIX>``, where
``<hash>`` is :func:`source_hash` of what it was built from (:func:`build_input`: the ``.py``,
and its augmenting ``.pxd`` with the ``.pxd`` files that one cimports, when there is one). The built files never sit
next to their sources: an extension module there would shadow every later edit of the ``.py``
(extension modules win in Python's import order), silently, in the editable install everyone
develops in. Instead :func:`install` (run by ``llmplane/__init__.py``) puts a finder first on
``sys.meta_path`` that loads the build under the module's real name only when the hash of those
files on disk matches, and only when every module it cimports (whose compiled types it uses)
loads its build too; an edited source imports as pure Python until the next build (``pip
install -e .`` again, or ``python setup.py build_ext --inplace``). ``LLMPLANE_PURE_PYTHON=1``
turns the compiled path off. Cython's PEP 489 module creation takes the name, ``__package__``
and ``__file__`` from the spec, so relative imports, ``__module__`` and tracebacks' module
names are those of the pure module; ``__file__`` is the built file.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

PURE_ENV = "LLMPLANE_PURE_PYTHON"
NATIVE_DIR = "_native"
log = logging.getLogger("llmplane.native")


def source_hash(source: bytes) -> str:
    """The label a build carries of the source it was compiled from (16 hex digits)."""
    return hashlib.sha256(source).hexdigest()[:16]


# ``from a.b cimport C`` / ``cimport a.b`` in a .pxd (the modules whose compiled types it uses).
_CIMPORT = re.compile(rb"^\s*(?:from\s+([\w.]+)\s+cimport\b|cimport\s+([\w.]+))", re.M)


def module_file(top: Path, module: str, suffix: str) -> Path:
    """``a.b.c`` -> ``top/a/b/c<suffix>``."""
    *folders, name = module.split(".")
    return top.joinpath(*folders, name + suffix)


def cimports(pxd: bytes, package: str) -> list[str]:
    """The modules of ``package`` that a .pxd's text cimports."""
    found = []
    for match in _CIMPORT.finditer(pxd):
        name = (match.group(1) or match.group(2)).decode()
        if name.startswith(package + ".") and name not in found:
            found.append(name)
    return found


def build_input(top: Path, module: str) -> bytes:
    """What a build of ``module`` (a file under the folder ``top``) is made from: the ``.py``;
    with an augmenting ``.pxd`` beside it (Cython's C types for it), that and the ``.pxd`` of
    each module it cimports too, so an edited declaration never loads a build of the old one.
    Without a ``.pxd`` it is the ``.py``'s bytes alone. Raises OSError without the ``.py``."""
    data = module_file(top, module, ".py").read_bytes()
    try:
        pxd = module_file(top, module, ".pxd").read_bytes()
    except OSError:
        return data
    parts = [data, pxd]
    for name in cimports(pxd, module.partition(".")[0]):
        try:
            parts.append(module_file(top, name, ".pxd").read_bytes())
        except OSError:
            parts.append(b"")
    return b"\0pxd\0".join(parts)


def native_filename(module: str, source: bytes, suffix: str | None = None) -> str:
    """The built file's name for ``module`` compiled from ``source``, inside ``_native/``."""
    if suffix is None:
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return f"{module}.{source_hash(source)}{suffix}"


def pure_forced() -> bool:
    """Whether ``LLMPLANE_PURE_PYTHON`` asks for pure Python (any value but empty or ``0``)."""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def _builds(native: Path) -> dict[str, dict[str, Path]]:
    """module name -> {source hash: built file} found in ``native``."""
    found: dict[str, dict[str, Path]] = {}
    try:
        names = os.listdir(native)
    except OSError:
        return found
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for name in names:
            if not name.endswith(suffix):
                continue
            module, _, digest = name[: -len(suffix)].rpartition(".")
            if module and len(digest) == 16:
                found.setdefault(module, {}).setdefault(digest, native / name)
    return found


@dataclass
class Finder:
    """Finds ``package``'s modules (in folder ``root``) whose ``builds`` include one of their
    current source."""

    package: str
    root: Path
    builds: dict[str, dict[str, Path]]
    loaded: list[str] = field(default_factory=list)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.builds:
            return None
        built = self._current(fullname)
        if built is None:
            log.debug("%s: source changed since its build, importing it as pure Python", fullname)
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(built))
        spec = importlib.util.spec_from_file_location(fullname, built, loader=loader)
        if fullname not in self.loaded:
            self.loaded.append(fullname)
        return spec

    def _current(self, module: str, seen: frozenset[str] = frozenset()) -> Path | None:
        """The build of ``module`` made from its source as it is on disk now, if any, and
        only if each module it cimports has one too (a compiled module importing another's
        types fails to import next to that module's pure Python form)."""
        builds = self.builds.get(module)
        if builds is None:
            return None
        top = self.root.parents[self.package.count(".")]
        try:
            data = build_input(top, module)
        except OSError:
            return None
        built = builds.get(source_hash(data))
        if built is None or b"\0pxd\0" not in data:
            return built
        pxd = module_file(top, module, ".pxd").read_bytes()
        for name in cimports(pxd, self.package):
            if name != module and name not in seen and self._current(name, seen | {module}) is None:
                return None
        return built

    def fresh(self, module: str) -> bool:
        """Whether ``module`` has a build of its current source."""
        return self._current(module) is not None

    def invalidate_caches(self) -> None:
        """Nothing cached between calls beyond the list of builds (fixed per process)."""


def install(package: str, root: Path) -> Finder | None:
    """Put a :class:`Finder` for ``package`` (whose folder is ``root``) first on
    ``sys.meta_path``; none when pure Python is forced or nothing is built."""
    if pure_forced():
        return None
    for finder in sys.meta_path:
        if isinstance(finder, Finder) and finder.package == package:
            return finder
    # Only the package's own modules: a stray file in _native/ cannot stand in for another.
    builds = {m: b for m, b in _builds(root / NATIVE_DIR).items() if m.startswith(package + ".")}
    if not builds:
        return None
    finder = Finder(package, root, builds)
    sys.meta_path.insert(0, finder)
    return finder


def status(package: str = "llmplane") -> str:
    """One line on whether ``package``'s compiled modules are in use, for ``llmplane version``
    and the gateway's start log."""
    if pure_forced():
        return f"pure Python ({PURE_ENV} is set)"
    finder = next(
        (f for f in sys.meta_path if isinstance(f, Finder) and f.package == package), None
    )
    if finder is None:
        return "pure Python (no compiled modules built: see docs/gateway.md, 'Compiled hot path')"
    stale = [m for m in sorted(finder.builds) if m not in finder.loaded and not finder.fresh(m)]
    line = (
        f"compiled ({len(finder.builds) - len(stale)} of {len(finder.builds)} modules "
        "built from their current source)"
    )
    if stale:
        names = ", ".join(m.removeprefix(package + ".") for m in stale)
        line += f"; pure Python for {names}: edited since the build (pip install -e . rebuilds)"
    return line
