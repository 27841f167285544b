"""Start a simulator as a child process and find its port (for tests, benchmarks, demos)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any


class SimProcess:
    """``python -m llmplane.sim --port 0 ...``; waits for its ``LISTENING host:port`` line.

    Use as a context manager (or call ``stop()``): SIGTERM, then SIGKILL after ``grace``.
    """

    def __init__(self, *args: str, model: str = "sim-model", startup_timeout: float = 15.0,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.argv = [sys.executable, "-m", "llmplane.sim", "--model", model, "--port", "0", *args]
        self.model = model
        self.startup_timeout = startup_timeout
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.returncode: int | None = None
        self._stderr: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> SimProcess:
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # stderr goes to a file: a pipe nobody drains could block the child.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed with the object)
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=self._stderr, env=env
        )
        deadline = time.monotonic() + self.startup_timeout
        sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        line = b""
        try:
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise RuntimeError(f"sim did not start in {self.startup_timeout}s")
                b = os.read(self.proc.stdout.fileno(), 1)
                if not b:
                    self.proc.wait(5)
                    raise RuntimeError(f"sim exited during startup: {self.stderr()[-2000:]}")
                line += b
        except BaseException:
            self.stop()
            raise
        finally:
            sel.close()
        text = line.decode().strip()
        if not text.startswith("LISTENING "):
            self.stop()
            raise RuntimeError(f"unexpected first line from sim: {text!r}")
        self.host, _, port = text.removeprefix("LISTENING ").rpartition(":")
        self.port = int(port)
        return self

    def stop(self, grace: float = 10.0) -> int | None:
        p = self.proc
        if p is None:
            return self.returncode
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p.stdout is not None:
            p.stdout.close()
        self.returncode = p.returncode
        self.proc = None
        return self.returncode

    def stderr(self) -> str:
        """What the process wrote to stderr so far."""
        f = self._stderr
        if f is None or f.closed:
            return ""
        f.seek(0)
        return f.read().decode(errors="replace")

    def __enter__(self) -> SimProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
