"""A ``llmplane gateway`` process for tests that look at it from outside: its memory (RSS from
/proc), its log (stderr kept in a file), raw sockets on its port."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.store.paths import open_store


class GatewayProcess:
    """``llmplane gateway --port 0`` on its own state directory; ``stop()`` on teardown."""

    def __init__(self, tmp: Path, settings: dict[str, Any] | None = None) -> None:
        self.state = tmp / "state"
        self.log_path = tmp / "gateway.log"
        config = tmp / "gateway.yaml"
        config.write_text(yaml.safe_dump({"gateway": settings or {}}))
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llmplane.cli",
                "gateway",
                "--port",
                "0",
                "--state-dir",
                str(self.state),
                "--config",
                str(config),
                "--no-access-log",
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING "):
            self.stop()
            raise AssertionError(f"the gateway did not start: {line!r}\n{self.log()}")
        self.port = int(line.split()[1].rpartition(":")[2])
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def register(self, name: str, address: str, model: str) -> None:
        """An Endpoint object for a running engine (the gateway follows the store)."""
        with open_store(self.state) as store:
            store.apply(endpoint_object(name, address, model, engine="sim"))

    def rss_mb(self, field: str = "VmRSS") -> float:
        """Resident memory now (``VmRSS``) or at its peak so far (``VmHWM``)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise AssertionError(f"no {field} for the gateway")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


def wait_until(predicate: Any, timeout: float, what: str, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
