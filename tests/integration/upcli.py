"""Use ``llmplane up`` like a user in another terminal: the CLI, the store it writes, HTTP.
(The ``up`` process itself: ``llmplane.testing.Up``.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from llmplane.store.paths import open_store
from llmplane.testing.fleets import sim_fleet as sim_fleet  # re-exported for the tests


def cli(
    *args: str, state_dir: Path | None, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a ``llmplane`` command like a user in another terminal would."""
    extra = ["--state-dir", str(state_dir)] if state_dir is not None else []
    proc = subprocess.run(
        [sys.executable, "-m", "llmplane.cli", *args, *extra],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"llmplane {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def condition(
    state_dir: Path, kind: str, name: str, type_: str, namespace: str | None = "default"
) -> dict[str, Any]:
    with open_store(state_dir) as store:
        obj = store.get(kind, name, namespace) or {}
    return next(
        (c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {}
    )


def status(
    state_dir: Path, kind: str, name: str, namespace: str | None = "default"
) -> dict[str, Any]:
    with open_store(state_dir) as store:
        obj = store.get(kind, name, namespace) or {}
    return obj.get("status") or {}


def http(
    url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """A blocking HTTP call for tests: (status, headers, decoded JSON body)."""
    import urllib.error
    import urllib.request

    data = orjson.dumps(body) if body is not None else None
    request = urllib.request.Request(
        url, data=data, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(resp.headers), orjson.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), orjson.loads(err.read())
