"""One launcher for the servers tests and benchmarks start as child processes: the sim, the
gateway, ``llmplane up`` and the stand-in upstream (``llmplane.testing.upstream``).

Each runs in its own session, its stdout and stderr go to one anonymous temporary file (a pipe
nobody drains could block a chatty child), and it is ready once its output matches a pattern
(``LISTENING host:port`` by default). ``stop()`` always ends it - SIGTERM (or the signal given)
to the process, SIGKILL to its whole session after the grace period - and closes the file;
a start that fails stops what it started. Use a ``with`` block or a fixture with ``finally``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import orjson

ROOT = Path(__file__).resolve().parents[2]
"""The checkout this code runs from: children run the same code (and find ``bench``)."""

LISTENING = re.compile(r"LISTENING (\S+)")
UP_READY = re.compile(r"OpenAI API at http://(\S+?)/v1")

_live: weakref.WeakSet[Process] = weakref.WeakSet()


class Process:
    """A server child process; ``address`` is what its readiness line announced."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        ready: re.Pattern[str] = LISTENING,
        grace: float = 10.0,
        inherit_env: bool = True,
    ) -> None:
        self.argv = list(argv)
        self.name = name or " ".join(self.argv[:3])
        self.env = env
        self.inherit_env = inherit_env
        self.cwd = cwd
        self.ready_pattern = ready
        self.grace = grace
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.returncode: int | None = None
        self._log: IO[bytes] | None = None
        self._final: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def launch(self) -> Process:
        """Start the process without waiting (``ready()`` waits); for starting several at once."""
        if self.proc is not None and self.proc.poll() is None:
            # A second launch would overwrite the handle and leave the first process running
            # with nothing to stop it (``with sim_process() as p: p.start()`` did).
            raise RuntimeError(f"{self.name} is already running (pid {self.proc.pid})")
        if self.inherit_env:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
            env.setdefault("PYTHONUNBUFFERED", "1")
            env.update(self.env or {})
        else:  # exactly ``env`` (a test of what the child finds on its own)
            env = dict(self.env or {})
        self._log = tempfile.TemporaryFile(prefix="llmplane-")  # noqa: SIM115 (closed in stop)
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=str(self.cwd or ROOT),
                env=env,
                start_new_session=True,
            )
        except BaseException:
            self._log.close()
            raise
        _live.add(self)
        return self

    def ready(self, timeout: float = 30.0) -> str:
        """Wait for the readiness line and return the address; on timeout or exit, stop the
        process and raise with the end of its output."""
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while True:
            m = self.ready_pattern.search(self.output())
            if m:
                self.address = m.group(1)
                return self.address
            if self.proc.poll() is not None:
                problem = f"exited with {self.proc.returncode} before it was ready"
                break
            if time.monotonic() > deadline:
                problem = f"was not ready within {timeout:g} s"
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"{self.name} {problem}; its output:\n{self.output()[-3000:]}")

    def start(self, timeout: float = 30.0) -> Process:
        """``launch()`` and wait until ready."""
        self.launch()
        self.ready(timeout)
        return self

    def stop(self, sig: int = signal.SIGTERM, grace: float | None = None) -> int | None:
        """Send ``sig`` to the process, wait ``grace`` seconds, then SIGKILL its session; close
        its output file. Safe to call twice; returns the exit code."""
        p = self.proc
        if p is None:
            return self.returncode
        if p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, sig)  # not p.send_signal: that reaps an exited child first
            _exited(p.pid, self.grace if grace is None else grace)
            # Whatever is left in its session (helpers it forked) goes too; the unreaped
            # process still holds the group id, so no stranger can have it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        self.returncode = p.returncode
        if self._log is not None and not self._log.closed:
            self._final = self.output()
            self._log.close()
        _live.discard(self)
        return self.returncode

    def exited(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the process to exit by itself (after a signal
        the caller sent), then finish as ``stop``; its exit code. No second signal: one that
        lands while the process is on its way out may find Python's default handlers back
        (its exit code is then -15, not its own). TimeoutError if it did not exit."""
        p = self.proc
        assert p is not None, f"{self.name} was never started"
        if not _exited(p.pid, timeout):
            raise TimeoutError(
                f"{self.name} did not exit within {timeout:g} s; its output:\n"
                f"{self.output()[-3000:]}"
            )
        return self.stop()

    def kill(self) -> int | None:
        return self.stop(signal.SIGKILL)

    def __enter__(self) -> Process:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what it is --------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def output(self) -> str:
        """Everything it wrote to stdout and stderr so far (also after ``stop()``)."""
        if self._log is None or self._log.closed:
            return self._final or ""
        chunks = []
        offset = 0
        while chunk := os.pread(self._log.fileno(), 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks).decode(errors="replace")

    def wait_http(
        self, url: str, body: bytes, timeout: float = 60.0, headers: dict[str, str] | None = None
    ) -> None:
        """Wait until a POST of ``body`` (with ``headers`` besides) to ``url`` answers 200 (an
        engine that listens before its model is loaded)."""
        import urllib.request

        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline and self.proc is not None and self.proc.poll() is None:
            req = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/json", **(headers or {})}
            )
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    r.read()
                    if r.status == 200:
                        return
            except Exception as err:  # not up yet: refused, reset, 503 ...
                last = str(err)
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} not ready ({last}): {self.output()[-2000:]}")


def _exited(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` for child ``pid`` to exit, without reaping it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # already reaped
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def carrying(name: str, value: str) -> list[int]:
    """Live processes (not this one) whose environment has ``name=value``: a marker put in a
    process's environment finds every descendant that inherited it, in whatever session."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def python(*args: str, name: str | None = None, **kw: Any) -> Process:
    """``python args...`` with this interpreter (not started)."""
    return Process([sys.executable, *args], name=name or " ".join(args[:2]), **kw)


def sim_process(model: str = "sim-model", *args: str, **kw: Any) -> Process:
    """``python -m llmplane.sim --port 0`` serving ``model`` (not started)."""
    argv = ["-m", "llmplane.sim", "--model", model, "--port", "0", *args]
    return python(*argv, name=f"sim {model}", **kw)


def upstream_process(model: str = "bench", *args: str, **kw: Any) -> Process:
    """The stand-in vLLM-shaped upstream (``llmplane.testing.upstream``) on a free port, for
    exact control of delays and injected failures (not started)."""
    argv = ["-m", "llmplane.testing.upstream", "--model", model, "--port", "0", *args]
    return python(*argv, name=f"upstream {model}", **kw)


def sim(model: str = "sim-model", *args: str, timeout: float = 30.0, **kw: Any) -> Process:
    """A started sim (``sim_process``)."""
    return sim_process(model, *args, **kw).start(timeout)


def upstream(model: str = "bench", *args: str, timeout: float = 30.0, **kw: Any) -> Process:
    """A started stand-in upstream (``upstream_process``)."""
    return upstream_process(model, *args, **kw).start(timeout)


def gateway(
    *args: str, state_dir: str | Path | None = None, tree: Path | None = None, **kw: Any
) -> Process:
    """``llmplane gateway --port 0`` (not started: ``.start()``); ``tree`` runs another
    checkout's code (bench/gateway_ab.py)."""
    argv = ["-m", "llmplane.cli", "gateway", "--port", "0"]
    if state_dir is not None:
        argv += ["--state-dir", str(state_dir)]
    if tree is not None:
        kw.setdefault("env", {"PYTHONPATH": str(tree)})
        kw.setdefault("cwd", tree)
    return python(*argv, *args, **kw)


class Up(Process):
    """``llmplane up --port 0`` over ``state_dir``; ``engine_pids()`` reads the engines the
    local runtime recorded. ``stop()`` leaves the engines to ``up`` (tests check it stops
    them); ``kill_everything()`` is the finalizer that also ends every engine it ever saw.
    ``command`` replaces ``python -m llmplane.cli`` (e.g. the installed ``llmplane`` script);
    ``env``, if given, replaces the environment; ``port`` asks for a port (0: any free one)."""

    def __init__(
        self,
        state_dir: Path,
        *files: str,
        args: Sequence[str] = (),
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        port: int = 0,
        **kw: Any,
    ) -> None:
        argv = [*(command or [sys.executable, "-m", "llmplane.cli"]), "up", "--port", str(port)]
        argv += ["--state-dir", str(state_dir), *args]
        for f in files:
            argv += ["-f", f]
        kw.setdefault("grace", 60.0)
        if env is not None:
            kw.update(env=env, inherit_env=False)
        super().__init__(argv, name="llmplane up", ready=UP_READY, **kw)
        self.state_dir = state_dir
        self.seen_pids: set[int] = set()

    def start(self, timeout: float = 60.0) -> Up:
        super().start(timeout)
        return self

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

    def kill_everything(self) -> None:
        """No process of this ``up`` survives it, whatever happened."""
        self.stop()
        for pid in self.seen_pids:  # engines run in sessions of their own
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def up(state_dir: Path, *files: str, timeout: float = 60.0, **kw: Any) -> Up:
    """A started ``llmplane up`` (see ``Up``)."""
    return Up(state_dir, *files, **kw).start(timeout)


class Processes:
    """Processes started together and stopped together: a ``with`` block (or a fixture) ends
    every one it started, also when a later start fails."""

    def __init__(self) -> None:
        self.started: list[Process] = []

    def add(self, process: Process) -> Process:
        """Track ``process`` (launched or not) so ``stop()`` ends it."""
        self.started.append(process)
        return process

    def start(self, *processes: Process, timeout: float = 30.0) -> list[Process]:
        """Launch all, then wait for each: they start in parallel."""
        for p in processes:
            self.add(p).launch()
        for p in processes:
            p.ready(timeout)
        return list(processes)

    def sim(self, model: str = "sim-model", *args: str, **kw: Any) -> Process:
        """A started sim, stopped with the group."""
        return self.start(sim_process(model, *args, **kw))[0]

    def upstream(self, model: str = "bench", *args: str, **kw: Any) -> Process:
        """A started stand-in upstream, stopped with the group."""
        return self.start(upstream_process(model, *args, **kw))[0]

    def up(self, state_dir: Path, *files: str, timeout: float = 60.0, **kw: Any) -> Up:
        process = Up(state_dir, *files, **kw)
        self.start(process, timeout=timeout)
        return process

    def stop(self) -> None:
        for p in reversed(self.started):
            if isinstance(p, Up):
                p.kill_everything()
            else:
                p.stop()
        self.started.clear()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@atexit.register
def stop_all() -> None:
    """Last resort at interpreter exit: nothing started here outlives the test run."""
    for p in list(_live):
        with contextlib.suppress(Exception):
            if isinstance(p, Up):
                p.kill_everything()
            else:
                p.stop(signal.SIGKILL)
