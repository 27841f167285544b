"""Engine processes as process groups: start them, stop them, and never leave one behind.

Every engine runs in its own session (``start_new_session``), so the engine and whatever it forks
(vLLM workers, llama.cpp threads are fine either way) share one process group that can be signalled
at once. On Linux the engine also gets ``PR_SET_PDEATHSIG`` = SIGTERM, so it is told to stop when
the process that started it dies, even by SIGKILL.

``PDEATHSIG`` does not reach the engine's own children, and an engine may ignore SIGTERM, so every
engine process is also recorded in ``<state_dir>/runtime/processes.json`` (pid, process group, start
time, and a random token placed in its environment). The next runtime to start on that state
directory kills whatever is left of them (:func:`kill_leftovers`). A process counts as ours only if
it is the recorded pid with the recorded start time, or carries the recorded token in its
environment; a recycled pid is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

import orjson

from llmplane.quiet import QuietRetries

log = logging.getLogger(__name__)

TOKEN_ENV = "LLMPLANE_PROCESS_TOKEN"
PROC = Path("/proc")
_PR_SET_PDEATHSIG = 1


@dataclass
class ProcessRecord:
    """What is remembered about one engine process across runs of the runtime."""

    pid: int
    pgid: int
    start_ticks: int | None  # /proc/<pid>/stat field 22 (clock ticks after boot)
    token: str
    workload: str
    replica: int
    argv: list[str]


# -- /proc -----------------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (after the parenthesised command name), or None if gone."""
    try:
        data = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].decode().split()


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks after boot); None if it does not exist."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    fields = _stat_fields(pid)
    if fields is None:
        if not PROC.is_dir():  # no /proc (not Linux): ask the kernel
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return False
    return fields[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    try:
        os.killpg(pgid, 0)  # cheap: is there any process (zombies included) in the group?
    except (ProcessLookupError, PermissionError):
        return []
    if not PROC.is_dir():
        return [pgid]
    members = []
    for pid in _all_pids():
        fields = _stat_fields(pid)
        if fields and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(pid)
    return members


def group_usage(pgid: int) -> tuple[float, int] | None:
    """(CPU seconds used, resident bytes) of a process group's live members (an engine and
    the workers it started); None when the group is gone or /proc is missing."""
    tick = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    cpu, rss, found = 0.0, 0, False
    for pid in group_members(pgid) if PROC.is_dir() else []:
        fields = _stat_fields(pid)
        if not fields:
            continue
        found = True
        cpu += (int(fields[11]) + int(fields[12])) / tick
        rss += int(fields[21]) * page
    return (cpu, rss) if found else None


def _all_pids() -> Iterable[int]:
    try:
        names = os.listdir(PROC)
    except OSError:
        return []
    return [int(n) for n in names if n.isdigit()]


def _has_token(pid: int, token: str) -> bool:
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"{TOKEN_ENV}={token}".encode() in environ.split(b"\0")


# -- starting --------------------------------------------------------------------------------------


@functools.cache
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def pdeathsig_preexec() -> Callable[[], None] | None:
    """A preexec_fn that makes the child receive SIGTERM when its parent (thread) dies, and exit
    at once if it already has (None where Linux's PR_SET_PDEATHSIG is missing)."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


async def spawn(
    argv: Sequence[str], env: Mapping[str, str], log_file: IO[bytes]
) -> asyncio.subprocess.Process:
    """Start ``argv`` in a new session with stdout+stderr appended to ``log_file``.

    The fork happens in the event loop's thread; ``PDEATHSIG`` fires when *that thread* exits, so
    run the runtime's event loop in a thread that lives as long as the engines should.
    """
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=log_file,
        stderr=asyncio.subprocess.STDOUT,
        env=dict(env),
        start_new_session=True,
        preexec_fn=pdeathsig_preexec(),
    )


# -- stopping --------------------------------------------------------------------------------------


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def stop_group(proc: asyncio.subprocess.Process, pgid: int, timeout: float) -> int | None:
    """SIGTERM the process group, wait up to ``timeout`` s for all of it to exit, then SIGKILL.

    Returns the leader's exit code.
    """
    if proc.returncode is None or group_members(pgid):
        signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        exited = asyncio.ensure_future(proc.wait())
        try:
            while time.monotonic() < deadline:
                if proc.returncode is not None:
                    if not group_members(pgid):
                        break
                    await asyncio.sleep(0.05)  # the leader is gone; its children are not yet
                    continue
                # asyncio.wait, not wait_for: Python 3.11's wait_for returns the result when a
                # cancellation arrives as the process exits, and a supervisor told to stop
                # would carry on restarting the engine. One wait until the exit or the deadline
                # (not a 50 ms poll: a fleet's shutdown stops hundreds of engines at once).
                await asyncio.wait([exited], timeout=max(deadline - time.monotonic(), 0))
            else:
                log.warning(
                    "process group %d did not exit %.0fs after SIGTERM; killing it", pgid, timeout
                )
        finally:
            exited.cancel()
        if proc.returncode is None or group_members(pgid):
            signal_group(pgid, signal.SIGKILL)
    return await proc.wait()


# -- the record of running processes ---------------------------------------------------------------


class ProcessTable:
    """``processes.json``: every engine process this runtime has running, written atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._records: dict[str, ProcessRecord] = {}
        self._trouble = QuietRetries(log, f"recording engine processes in {path}")

    def load(self) -> list[ProcessRecord]:
        try:
            data = orjson.loads(self.path.read_bytes())
            return [ProcessRecord(**r) for r in data.get("processes", [])]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError) as err:
            log.warning("ignoring unreadable %s: %s", self.path, err)
            return []

    def records(self) -> list[ProcessRecord]:
        """The processes recorded as running."""
        return list(self._records.values())

    def add(self, record: ProcessRecord) -> None:
        self._records[record.token] = record
        self._write()

    def discard(self, token: str) -> None:
        if self._records.pop(token, None) is not None:
            self._write()

    def clear(self) -> None:
        self._records.clear()
        self._write()

    def _write(self) -> None:
        """Write the record; a failure (a full disk) is logged, never raised: supervising the
        engines matters more than the record, which the next change writes again in full."""
        data = {"version": 1, "processes": [asdict(r) for r in self._records.values()]}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
            os.replace(tmp, self.path)
        except OSError as err:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self._trouble.failed(err)
        else:
            self._trouble.succeeded()


def find_leftovers(records: Sequence[ProcessRecord]) -> list[tuple[int, int | None]]:
    """Processes from ``records`` still alive: (pid, pgid to kill as a whole or None).

    Ours means: the recorded pid with the recorded start time (then its whole group is ours, a
    process group id cannot be reused while its leader lives), or any process whose environment
    carries a recorded token (the engine's children, wherever they moved).
    """
    found: dict[int, int | None] = {}
    tokens = {r.token for r in records}
    for r in records:
        if r.start_ticks is not None and start_ticks(r.pid) == r.start_ticks and is_alive(r.pid):
            found[r.pid] = r.pgid
    if tokens and PROC.is_dir():
        me = os.getpid()
        for pid in _all_pids():
            if pid == me or pid in found or not is_alive(pid):
                continue
            if any(_has_token(pid, t) for t in tokens):
                found[pid] = None
    return list(found.items())


async def kill_leftovers(records: Sequence[ProcessRecord], timeout: float) -> list[int]:
    """Stop what is left of a previous run's engines: SIGTERM, up to ``timeout`` s, SIGKILL."""
    leftovers = await asyncio.to_thread(find_leftovers, records)
    if not leftovers:
        return []
    log.warning("stopping %d engine process(es) left over from a previous run", len(leftovers))
    ticks = {pid: start_ticks(pid) for pid, _ in leftovers}

    def send(sig: int) -> None:
        for pid, pgid in leftovers:
            if not is_alive(pid) or start_ticks(pid) != ticks[pid]:
                continue  # gone (and maybe recycled) since we looked
            if pgid is not None:
                signal_group(pgid, sig)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    send(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(is_alive(pid) for pid, _ in leftovers):
        await asyncio.sleep(0.05)
    send(signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(is_alive(pid) for pid, _ in leftovers):
        await asyncio.sleep(0.05)
    return [pid for pid, _ in leftovers]
