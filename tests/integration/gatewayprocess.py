"""A ``llmplane gateway`` process for tests that look at it from outside: its memory (RSS from
/proc), its output, raw sockets on its port."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import yaml

from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.store.paths import open_store
from llmplane.testing.process import Process, gateway


class GatewayProcess:
    """``llmplane gateway --port 0 --workers 1`` on its own state directory with ``settings``
    as its ``gateway:`` config section; ``stop()`` on teardown. One worker: what these tests
    look at (memory, connection caps, buffers) is per worker process. ``nofile``: started under
    ``prlimit`` with that soft and hard open-files limit."""

    def __init__(
        self, tmp: Path, settings: dict[str, Any] | None = None, nofile: int | None = None
    ) -> None:
        self.state = tmp / "state"
        config = tmp / "gateway.yaml"
        config.write_text(yaml.safe_dump({"gateway": settings or {}}))
        self.process: Process = gateway(
            "--config", str(config), "--no-access-log", "--workers", "1", state_dir=self.state
        )
        if nofile is not None:
            self.process.argv[:0] = ["prlimit", f"--nofile={nofile}:{nofile}"]
        self.process.start()
        self.port = self.process.port

    def register(self, name: str, address: str, model: str) -> None:
        """An Endpoint object for a running engine (the gateway follows the store)."""
        with open_store(self.state) as store:
            store.apply(endpoint_object(name, address, model, engine="sim"))

    def rss_mb(self, field: str = "VmRSS") -> float:
        """Resident memory now (``VmRSS``) or at its peak so far (``VmHWM``)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise AssertionError(f"no {field} for the gateway")

    def log(self) -> str:
        return self.process.output()

    def alive(self) -> bool:
        return self.process.proc is not None and self.process.proc.poll() is None

    def stop(self) -> None:
        self.process.stop()


def read_all(s: socket.socket, timeout: float = 10) -> bytes:
    """Everything the server sends until it closes the connection (or ``timeout`` passes)."""
    s.settimeout(timeout)
    chunks = []
    try:
        while chunk := s.recv(65536):
            chunks.append(chunk)
            if b"Connection: close" not in b"".join(chunks) and b"\r\n\r\n" in chunks[-1]:
                # a keep-alive answer with Content-Length: stop once the body is in
                head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
                length = next(
                    (
                        int(h.split(b":")[1])
                        for h in head.split(b"\r\n")
                        if h.lower().startswith(b"content-length:")
                    ),
                    None,
                )
                if length is not None and len(body) >= length:
                    break
    except TimeoutError:
        pass
    return b"".join(chunks)
