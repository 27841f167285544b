"""Start servers that announce ``LISTENING host:port`` on stdout (sims, upstreams, gateways)
and stop them: used by the gateway's integration tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]


class Server:
    def __init__(self, proc: subprocess.Popen[str], address: str) -> None:
        self.proc = proc
        self.address = address

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def _drain(stream: IO[str]) -> None:
    with contextlib.suppress(ValueError, OSError):
        for _ in stream:
            pass


def spawn(args: Sequence[str], timeout: float = 30.0, cwd: Path | None = None) -> Server:
    """Run ``python args...`` and wait for its ``LISTENING host:port`` line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=str(cwd or ROOT),
        env=env,
    )
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("LISTENING "):
            # Keep reading what it prints, so a chatty server never blocks on a full pipe.
            threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
            return Server(proc, line.split()[1].strip())
    proc.kill()
    proc.wait(5)
    raise RuntimeError(f"{' '.join(args)} did not print LISTENING (exit code {proc.poll()})")


def upstream(model: str, *extra: str) -> Server:
    """The stand-in vLLM-shaped upstream (``bench/gateway_upstream.py``)."""
    return spawn(["-m", "bench.gateway_upstream", "--model", model, *extra])


def sim_available() -> bool:
    """True once ``python -m llmplane.sim`` is runnable."""
    try:
        import importlib.util

        return importlib.util.find_spec("llmplane.sim.__main__") is not None
    except ImportError:
        return False


def sim(model: str, *extra: str) -> Server:
    return spawn(["-m", "llmplane.sim", "--model", model, "--port", "0", *extra])
