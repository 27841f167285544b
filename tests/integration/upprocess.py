"""Run ``llmplane up`` as a real subprocess for integration tests, and inspect its engines."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from llmplane.store.paths import open_store

_UP_LINE = re.compile(r"OpenAI API at http://127\.0\.0\.1:(\d+)/v1")


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


class Up:
    """``llmplane up --port 0`` in its own process group; ``stop()`` also runs on test failure.

    ``command`` replaces ``python -m llmplane.cli`` (e.g. the installed ``llmplane`` script);
    ``env`` replaces the environment; ``port`` asks for a port (0: any free one); ``args``
    are more ``up`` options (``--gateway-config``).
    """

    def __init__(
        self,
        state_dir: Path,
        *files: str,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        port: int = 0,
        args: tuple[str, ...] = (),
    ):
        self.state_dir = state_dir
        self.files = files
        self.command = command or [sys.executable, "-m", "llmplane.cli"]
        self.env = env
        self.requested_port = port
        self.args = args
        self.proc: subprocess.Popen[str] | None = None
        self.port: int | None = None
        self.output: list[str] = []
        self.seen_pids: set[int] = set()

    def start(self, timeout: float = 60) -> Up:
        args = [
            *self.command,
            "up",
            "--port",
            str(self.requested_port),
            "--state-dir",
            str(self.state_dir),
        ]
        for f in self.files:
            args += ["-f", f]
        args += self.args
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=self.env,
        )
        found = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                m = _UP_LINE.search(line)
                if m:
                    self.port = int(m.group(1))
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not found.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("llmplane up did not start:\n" + "".join(self.output))
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def engine_pids(self) -> set[int]:
        """Engine processes the runtime has recorded as running now."""
        path = self.state_dir / "runtime" / "processes.json"
        try:
            data = orjson.loads(path.read_bytes())
        except (FileNotFoundError, ValueError):
            return set()
        pids = {r["pid"] for r in data.get("processes", [])}
        self.seen_pids |= pids
        return pids

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)

    def kill_everything(self) -> None:
        """Finalizer: no process of this test survives it, whatever happened."""
        self.stop()
        for pid in self.seen_pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def wait_for(
    predicate: Callable[[], Any], timeout: float = 60, every: float = 0.2, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what or predicate}: last value {last!r}")


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


def sim_fleet(
    model: str, replicas: int | str, time_scale: str = "0.01", playground: str | None = None
) -> str:
    """YAML for an OpenModel ``model`` and a Playground of ``replicas`` sim engines serving it
    (named ``playground``, else like the model)."""
    return f"""
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {{name: {model}}}
spec:
  familyName: tiny
  source: {{uri: "host:///dev/null"}}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {{name: {playground or model}}}
spec:
  replicas: {replicas}
  modelClaim: {{modelName: {model}}}
  backendRuntimeConfig:
    backendName: sim
    args: ["--time-scale", "{time_scale}"]
"""
