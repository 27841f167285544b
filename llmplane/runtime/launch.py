"""How a plan's local command becomes a command line for one replica on this machine.

Three small facts the local runtime needs before it starts an engine process:

* a free TCP port on 127.0.0.1 (:func:`free_port`),
* the plan's argv with ``--port``/``--host`` pointed at that port (:func:`rewrite_argv`),
* whether the engine is installed at all (:func:`missing_engine`), so a missing engine is reported
  once with its install hint instead of crash-looping,
* which interpreter runs a Python-module engine (:func:`engine_argv`): the one running llmplane,
* where the engine publishes its KV-cache events (:func:`kv_events_argv`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import xxhash

from llmplane.runtime.endpoint import KV_EVENTS_FLAG, kv_events_addresses

LOCAL_HOST = "127.0.0.1"
# The flags that choose where an engine listens; --hostname is text-generation-inference's.
_BIND_FLAGS = ("--host", "--hostname", "--port")

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")
# Interpreter names that mean "a Python", not a particular one: a local command starting with one
# of these runs with the interpreter that runs llmplane. A path or a versioned name
# (``/opt/venv/bin/python``, ``python3.12``) is the BackendRuntime asking for that one.
_ANY_PYTHON = ("python", "python3")
# Environment variables that change where a Python interpreter finds modules; when a plan sets
# any of them the module check runs in a child interpreter with the plan's environment.
_PYTHON_PATH_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONSAFEPATH")


def free_port(preferred: int | None = None) -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (``preferred`` if it still is free).

    The socket is closed again before the engine binds the port, so another process could take
    it in between; the engine then fails to start and the supervisor restarts it on a new port.
    """
    if preferred:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOCAL_HOST, preferred))
            return preferred
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCAL_HOST, 0))
        return s.getsockname()[1]


def bind_flag(arg: str) -> str | None:
    """The host or port flag ``arg`` (``--opt`` or ``--opt=value``) sets, if any.

    Python engines parse their command line with argparse, which takes any unambiguous prefix
    of a long option (``--hos``, ``--ho=``, ``--po`` mean ``--host`` and ``--port``), so a
    prefix counts as the flag itself. ``--h`` and ``--p`` count too: ambiguous for an engine
    with ``--help`` or another ``--p...`` option (it then refuses to start), never anything
    else a loopback engine needs.
    """
    if not arg.startswith("--") or len(arg) < 3:
        return None
    name = arg.split("=", 1)[0]
    if name in _BIND_FLAGS:
        return name
    for flag in _BIND_FLAGS:  # --host before --hostname: a prefix of both means --host
        if flag.startswith(name):
            return flag
    return None


def rewrite_argv(argv: Sequence[str], port: int) -> list[str]:
    """Point the engine's ``--port`` at ``port`` and its ``--host`` at 127.0.0.1.

    ``--port X`` / ``--port=X`` become the replica's port and ``--host X`` / ``--host=X`` (or
    text-generation-inference's ``--hostname``) become 127.0.0.1, also when spelled as a
    prefix argparse accepts (``--hos X``, ``--ho=X``: :func:`bind_flag`; the full flag name is
    written). When the command has no port flag at all, ``--port N --host 127.0.0.1`` is
    appended (only ``--port N`` if it already names a host). A command that names a port but no
    host is left binding wherever the engine binds by default (engines spell that flag
    differently); the runtime then checks what the engine bound (``sockets.py``).
    """
    out: list[str] = []
    has_port = has_host = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag = bind_flag(arg)
        if flag is None:
            out.append(arg)
            i += 1
            continue
        value = str(port) if flag == "--port" else LOCAL_HOST
        has_port |= flag == "--port"
        has_host |= flag != "--port"
        if "=" in arg:
            out.append(f"{flag}={value}")
            i += 1
        else:
            out += [flag, value]
            i += 2  # skip the old value (if the flag is the last word, there is none)
    if not has_port:
        out += ["--port", str(port)]
        if not has_host:
            out += ["--host", LOCAL_HOST]
    return out


def engine_argv(argv: Sequence[str]) -> list[str]:
    """The command line to start: a bare ``python``/``python3`` becomes :data:`sys.executable`.

    ``llmplane`` may run from a venv that is not on PATH (``~/venv/bin/llmplane up``, pipx, a
    systemd unit); the engines it ships (the sim, the llama.cpp shim) and engines installed beside
    it (vLLM) are importable by that interpreter, not by whatever ``python`` PATH finds first.
    """
    out = list(argv)
    if out and out[0] in _ANY_PYTHON and sys.executable:
        out[0] = sys.executable
    return out


def python_module(argv: Sequence[str]) -> str | None:
    """The module of ``python [options] -m module ...``; None for any other command."""
    if not argv:
        return None
    if not _PYTHON_NAME.match(os.path.basename(argv[0])) and not _same_file(
        argv[0], sys.executable
    ):
        return None
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m":
            return argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith("-m") and not arg.startswith("--"):
            return arg[2:]
        if arg == "-c" or not arg.startswith("-"):
            return None  # a script or -c code: nothing to check beyond the interpreter
    return None


def module_exists(name: str) -> bool:
    """Whether ``import name`` would find the module, without importing (running) any package.

    ``importlib.util.find_spec("a.b")`` imports ``a`` first; for engines like vLLM that means
    seconds of imports in the control plane. This walks the package paths instead.
    """
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level lookup imports nothing
    except (ImportError, ValueError):
        return False
    for depth in range(1, len(parts)):
        locations = spec.submodule_search_locations if spec else None
        if not locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(
            ".".join(parts[: depth + 1]), list(locations)
        )
    return spec is not None


# The same check, run by another interpreter (the plan names a different python).
_MODULE_CHECK = (
    "import importlib.machinery as m, importlib.util as u, sys\n"
    "p = sys.argv[1].split('.')\n"
    "s = u.find_spec(p[0])\n"
    "for d in range(1, len(p)):\n"
    "    l = s.submodule_search_locations if s else None\n"
    "    s = m.PathFinder.find_spec('.'.join(p[: d + 1]), list(l)) if l else None\n"
    "sys.exit(0 if s else 3)\n"
)


async def missing_engine(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why the engine cannot start here (command or Python module missing); None if it can."""
    if not argv:
        return "the local command is empty"
    executable = shutil.which(argv[0], path=env.get("PATH"))
    if executable is None:
        return f"engine command {argv[0]!r} not found on PATH"
    module = python_module(argv)
    if module is None:
        return None
    if _same_file(executable, sys.executable) and not any(
        env.get(v) != os.environ.get(v) for v in _PYTHON_PATH_VARS
    ):
        found = module_exists(module)
    else:
        found = await _module_exists_in(executable, module, env)
    return None if found else f"Python module {module!r} is not installed for {executable}"


async def _module_exists_in(python: str, module: str, env: Mapping[str, str]) -> bool:
    try:
        proc = await asyncio.create_subprocess_exec(
            python,
            "-c",
            _MODULE_CHECK,
            module,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError:
        return True  # cannot ask: let the start itself report what is wrong
    try:
        async with asyncio.timeout(30):  # not wait_for: it can lose a cancellation on 3.11
            code = await proc.wait()
    except TimeoutError:
        code = None
    finally:
        if proc.returncode is None:
            proc.kill()
    return code != 3


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(shutil.which(a) or a, b)
    except OSError:
        return False


# Engines that publish vLLM's KV-cache events (the sim does as vLLM does).
KV_EVENTS_ENGINES = ("vllm", "sim")
_SOCKET_PATH_MAX = 100  # a Unix socket path has at most 107 bytes


def kv_socket_dir(state_dir: Path) -> Path | None:
    """Where engines' KV event sockets go: ``<state_dir>/kv``, or a private directory under
    the system's temporary one when that path is too long for a socket; None when neither
    can be made (the engines then run without events)."""
    path = Path(state_dir) / "kv"
    if len(str(path)) + 40 > _SOCKET_PATH_MAX:
        digest = xxhash.xxh32_hexdigest(str(Path(state_dir).resolve()).encode())
        path = Path(tempfile.gettempdir()) / f"llmplane-kv-{os.getuid()}-{digest}"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return path


def kv_events_argv(
    argv: Sequence[str], engine: str, sockets: Path | None, name: str
) -> tuple[list[str], str, str]:
    """(argv, events address, replay address): an engine that publishes KV events gets
    ``--kv-events-config`` with ipc sockets ``<sockets>/<name>.sock`` and ``-replay.sock``
    unless its command sets the flag itself (then the addresses are read from it; "" when
    it turns events off or connects out)."""
    argv = list(argv)
    given = kv_events_addresses(argv, LOCAL_HOST)
    if given is not None:
        return argv, *given
    if engine not in KV_EVENTS_ENGINES or sockets is None:
        return argv, "", ""
    events = f"ipc://{sockets / name}.sock"
    replay = f"ipc://{sockets / name}-replay.sock"
    return [*argv, *kv_events_flag(events, replay)], events, replay


def kv_events_flag(endpoint: str, replay: str) -> list[str]:
    """``--kv-events-config`` publishing over ZMQ on ``endpoint``, replaying on ``replay``."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "replay_endpoint": replay,
        "topic": "kv",
    }
    return [KV_EVENTS_FLAG, json.dumps(config)]
