"""The compiled hot path's guard (llmplane/native.py, llmplane/native_build.py) on a tiny real
package built by Cython and a C compiler exactly as ``setup.py`` builds llmplane's: a build is
used only while its source is unchanged, ``LLMPLANE_PURE_PYTHON=1`` turns it off, and a
compiled module looks like its pure self (name, relative imports, ``__module__``, tracebacks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmplane.native import PURE_ENV, native_filename

ROOT = Path(__file__).resolve().parents[2]

MOD = '''\
"""A module compiled for the test."""

from . import helper


class Thing:
    def where(self) -> str:
        return helper.name()


def boom() -> None:
    raise ValueError("boom")
'''

PROBE = """\
import json, sys, traceback
import pkg.mod as mod
from llmplane import native
try:
    mod.boom()
except ValueError as e:
    frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(e.__traceback__)]
print(json.dumps({
    "file": mod.__file__, "name": mod.__name__, "package": mod.__package__,
    "thing_module": mod.Thing.__module__, "thing_qualname": mod.Thing.__qualname__,
    "where": mod.Thing().where(), "edited": getattr(mod, "EDITED", False),
    "frames": frames, "status": native.status("pkg"),
}))
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _build(project: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=project,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr


def _probe(project: Path, **env: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=project,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pkg`` (installing the finder like llmplane/__init__.py) with ``pkg.mod`` built."""
    root = tmp_path_factory.mktemp("native")
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\nfrom llmplane import native\n"
        "native.install(__name__, Path(__file__).parent)\n"
    )
    (pkg / "helper.py").write_text("def name():\n    return __name__\n")
    (pkg / "mod.py").write_text(MOD)
    (root / "setup.py").write_text(
        textwrap.dedent("""\
            from setuptools import setup
            from llmplane.native_build import BuildHotPath, extensions
            setup(name="pkg", packages=["pkg"], ext_modules=extensions(["pkg.mod"]),
                  cmdclass={"build_ext": BuildHotPath})
            """)
    )
    _build(root)
    return root


def _builds(project: Path) -> list[str]:
    return sorted(p.name for p in (project / "pkg" / "_native").iterdir())


def test_a_build_of_the_current_source_is_loaded_under_the_real_name(project: Path) -> None:
    assert _builds(project) == [native_filename("pkg.mod", MOD.encode())]
    assert not list((project / "pkg").glob("mod.*.so")), "a build next to its source shadows it"
    seen = _probe(project)
    assert seen["file"] == str(project / "pkg" / "_native" / _builds(project)[0])
    assert seen["name"] == "pkg.mod" and seen["package"] == "pkg"
    assert (seen["thing_module"], seen["thing_qualname"]) == ("pkg.mod", "Thing")
    assert seen["where"] == "pkg.helper"  # the relative import found the package's module
    # Cython's traceback entries name the source file, line and function (qualified by the
    # module: ``pkg.mod.boom`` where Python says ``boom``).
    filename, line, function = seen["frames"][-1]
    assert filename.endswith("mod.py") and function.endswith("boom")
    assert MOD.splitlines()[line - 1].strip() == 'raise ValueError("boom")'
    assert seen["status"] == "compiled (1 of 1 modules built from their current source)"


def test_the_environment_variable_forces_pure_python(project: Path) -> None:
    seen = _probe(project, **{PURE_ENV: "1"})
    assert seen["file"] == str(project / "pkg" / "mod.py")
    assert seen["thing_module"] == "pkg.mod" and seen["where"] == "pkg.helper"
    assert seen["status"] == f"pure Python ({PURE_ENV} is set)"


def test_an_edited_source_imports_as_pure_python_until_rebuilt(project: Path) -> None:
    source = project / "pkg" / "mod.py"
    source.write_text(MOD + "\nEDITED = True\n")
    try:
        seen = _probe(project)
        assert seen["file"] == str(source) and seen["edited"] is True
        assert "pure Python for mod: edited since the build" in seen["status"]
        _build(project)  # the rebuild replaces the old build and is used again
        assert _builds(project) == [native_filename("pkg.mod", source.read_bytes())]
        seen = _probe(project)
        assert seen["file"].endswith(_builds(project)[0]) and seen["edited"] is True
    finally:
        source.write_text(MOD)


TYPED = '''\
"""A module whose .pxd makes its class an extension type."""


class Box:
    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n
'''
TYPED_PXD = "cdef class Box:\n    cdef public object n\n"
USER = '''\
"""A module whose .pxd cimports Box: its build needs typed's build."""

from .typed import Box


def unbox(box: Box) -> int:
    return box.n
'''
USER_PXD = (
    "import cython\nfrom pkg.typed cimport Box\n\n@cython.locals(box=Box)\ncpdef unbox(box)\n"
)

TYPED_PROBE = """\
import json
import pkg.user as user, pkg.typed as typed
from llmplane import native
print(json.dumps({
    "typed": typed.__file__, "user": user.__file__, "n": user.unbox(typed.Box(7)),
    "status": native.status("pkg"),
}))
"""


@pytest.fixture(scope="module")
def typed_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pkg.typed`` and ``pkg.user`` (which cimports typed's class), each with a .pxd, built."""
    root = tmp_path_factory.mktemp("typed")
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\nfrom llmplane import native\n"
        "native.install(__name__, Path(__file__).parent)\n"
    )
    for name, text in {
        "typed.py": TYPED,
        "typed.pxd": TYPED_PXD,
        "user.py": USER,
        "user.pxd": USER_PXD,
    }.items():
        (pkg / name).write_text(text)
    (root / "setup.py").write_text(
        textwrap.dedent("""\
            from setuptools import setup
            from llmplane.native_build import BuildHotPath, extensions
            setup(name="pkg", packages=["pkg"],
                  ext_modules=extensions(["pkg.typed", "pkg.user"]),
                  cmdclass={"build_ext": BuildHotPath})
            """)
    )
    _build(root)
    return root


def _typed_probe(project: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", TYPED_PROBE],
        cwd=project,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_pxd_is_part_of_what_a_build_was_made_from(typed_project: Path) -> None:
    seen = _typed_probe(typed_project)
    assert "/_native/" in seen["typed"] and "/_native/" in seen["user"], seen
    assert seen["n"] == 7
    assert seen["status"] == "compiled (2 of 2 modules built from their current source)"
    pxd = typed_project / "pkg" / "typed.pxd"
    # A changed declaration with the .py unchanged: the build of the old one is not loaded,
    # nor the build of the module that cimports it (it would not import beside pure Python).
    pxd.write_text(TYPED_PXD + "    cdef public object m\n")
    try:
        seen = _typed_probe(typed_project)
        assert seen["typed"].endswith("typed.py") and seen["user"].endswith("user.py"), seen
        assert seen["n"] == 7
        assert "pure Python for typed, user" in seen["status"]
    finally:
        pxd.write_text(TYPED_PXD)


def test_a_module_whose_cimport_is_stale_imports_as_pure_python(typed_project: Path) -> None:
    source = typed_project / "pkg" / "typed.py"
    source.write_text(TYPED + "\nEDITED = True\n")
    try:
        seen = _typed_probe(typed_project)
        assert seen["typed"].endswith("typed.py") and seen["user"].endswith("user.py"), seen
        assert seen["n"] == 7
    finally:
        source.write_text(TYPED)
    seen = _typed_probe(typed_project)
    assert "/_native/" in seen["typed"] and "/_native/" in seen["user"], seen
