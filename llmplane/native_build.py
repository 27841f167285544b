"""Build time of the compiled hot path (``setup.py``; see llmplane/native.py for the loading).

:class:`BuildHotPath` is setuptools' ``build_ext`` that Cythonizes the listed modules, unchanged,
when it runs (not at every ``setup.py`` invocation) and writes each build to
``<package>/_native/<module>.<source hash><EXT_SUFFIX>``, never next to its source (the hash
covers an augmenting ``.pxd`` beside the ``.py`` too: ``native.build_input``). Paths are
relative to the project root (setuptools runs there). A missing Cython, C compiler or Python
headers leaves the install pure Python with a one-line message.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension
from setuptools.command.build_ext import build_ext

from llmplane.native import NATIVE_DIR, build_input, native_filename

# Directives that keep Python's semantics: annotations stay annotations (no C types from
# ``x: float``), functions stay introspectable, keyword arguments work as in Python.
DIRECTIVES = {
    "language_level": 3,
    "annotation_typing": False,
    "binding": True,
    "always_allow_keywords": True,
}
SKIP = "llmplane: compiled hot path not built ({}); installing pure Python"


def source_of(module: str) -> Path:
    """``a.b.c`` -> ``a/b/c.py`` (relative to the project root)."""
    return Path(*module.split(".")).with_suffix(".py")


def extensions(modules: list[str]) -> list[Extension]:
    """One optional extension per module: a failed compile skips it, not the install. No C
    debug information (``-g0``): 4 MB instead of 22 for the hot path, and Cython's tracebacks
    come from its own tables."""
    flags = ["-g0"] if os.name == "posix" else []
    return [
        Extension(m, [str(source_of(m))], optional=True, extra_compile_args=flags) for m in modules
    ]


def _warn(reason: str) -> None:
    print(SKIP.format(reason), file=sys.stderr)


class BuildHotPath(build_ext):
    """``build_ext`` for the hot path: Cython at run time, builds under ``_native/``."""

    def finalize_options(self) -> None:
        self._names = {
            ext.name: native_filename(ext.name, build_input(Path(), ext.name))
            for ext in self.distribution.ext_modules or ()
        }
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            from Cython.Build import cythonize
        except ImportError:
            _warn("Cython is not installed")
            self.extensions = []
            return
        try:
            compiled = cythonize(
                [Extension(ext.name, ext.sources) for ext in self.extensions],
                build_dir=str(Path(self.build_temp) / "cython"),
                compiler_directives=DIRECTIVES,
                nthreads=self.parallel if isinstance(self.parallel, int) else 0,
                include_path=["."],  # the .pxd files cimport each other by package path
                quiet=True,
            )
        except Exception as e:  # a Cython failure must not fail the install
            _warn(f"Cython: {e}")
            self.extensions = []
            return
        # Keep setuptools' own (finalized) Extension objects, now with the C sources.
        c_sources = {ext.name: ext.sources for ext in compiled}
        for ext in self.extensions:
            ext.sources = c_sources[ext.name]
        super().run()
        failed = [
            e.name for e in self.extensions if not Path(self.get_ext_fullpath(e.name)).exists()
        ]
        if failed:
            _warn(
                f"{len(failed)} of {len(self.extensions)} modules failed to compile: "
                "are a C compiler and Python's headers (python3-dev) installed?"
            )

    def get_ext_filename(self, fullname: str) -> str:
        name = self._names.get(fullname)
        if name is None:
            return super().get_ext_filename(fullname)
        return os.path.join(fullname.split(".")[0], NATIVE_DIR, name)

    def get_ext_fullpath(self, ext_name: str) -> str:
        return os.path.join(self.build_lib, self.get_ext_filename(ext_name))

    def _get_inplace_equivalent(self, build_py: Any, ext: Extension) -> tuple[str, str]:
        filename = self.get_ext_filename(ext.name)
        return filename, os.path.join(self.build_lib, filename)

    def copy_extensions_to_source(self) -> None:
        """Copy the builds into the source tree's ``_native/`` and drop the older builds of the
        same modules there."""
        keep = set(self._names.values())
        for native in {Path(os.path.dirname(self.get_ext_filename(m))) for m in self._names}:
            native.mkdir(exist_ok=True)
            for old in native.iterdir():
                module = old.name.partition(".cpython-")[0].rpartition(".")[0]
                if module in self._names and old.name not in keep:
                    old.unlink()
        super().copy_extensions_to_source()
