"""A real ``redis-server`` for the global rate-limit tests (the fixture: ``redis_server`` in
conftest.py)."""

from __future__ import annotations

import re
import shutil
import socket

from llmplane.testing import Process

REDIS = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """``redis-server`` on a fixed loopback port, without persistence; restartable (on the
    same port, which is why it does not take port 0)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: Process | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        assert REDIS is not None
        argv = [
            *(REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--protected-mode", "no"),
        ]
        ready = re.compile(r"(Ready) to accept connections")
        self.process = Process(argv, name="redis-server", ready=ready).start(10)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
        self.process = None
