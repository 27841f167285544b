"""A store another process keeps locked costs one warning line, not a traceback per pass
(issue 27, item 13).

``llmplane up`` with sim replicas; a second process takes the SQLite write lock and holds it
while an engine is killed (so the controller has status to write, pass after pass): ``up``
logs one warning naming the problem, nothing more until the lock goes, then one line that the
store works again, and the status catches up. ``llmplane apply`` meanwhile says in one line
that the store is busy. Meanwhile the gateway in ``up`` serves as before: the control plane's
writes wait for the lock off the event loop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from llmplane.store.paths import db_path
from llmplane.testing import Processes, always, wait_for
from tests.integration.upcli import cli, http, sim_fleet, status

HOLD_LOCK = (
    "import sqlite3, sys\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "c.execute('BEGIN IMMEDIATE')\n"
    "print('locked', flush=True)\n"
    "sys.stdin.read()\n"
)
WARNING = "reconciling(writingstatustothestore):"  # whitespace removed: the console wraps


def flat(text: str) -> str:
    return "".join(text.split())


def hold_lock(state: Path) -> subprocess.Popen[str]:
    """A process holding the store's write lock until its stdin closes."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(db_path(state))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_a_locked_store_is_one_warning_then_quiet(tmp_path: Path, processes: Processes) -> None:
    state = tmp_path / "state"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet("tiny", 1))
    up = processes.up(state, str(fleet), args=["-v"])
    wait_for(
        lambda: status(state, "Playground", "tiny").get("readyReplicas") == 1,
        90,
        every=0.25,
        what="the replica ready",
    )
    holder = hold_lock(state)
    try:
        os.killpg(min(up.engine_pids()), signal.SIGKILL)  # status to write, again and again
        wait_for(lambda: WARNING in flat(up.output()), 40, every=0.25, what="the warning")
        # The CLI: one line, exit 1 (after the store's busy timeout).
        proc = cli("apply", "-f", str(fleet), state_dir=state, check=False)
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "is busy" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        # More controller passes (every 5 s, each waiting 10 s for the lock): no more lines.
        always(lambda: flat(up.output()).count(WARNING) == 1, 20, every=0.5, what="one warning")
    finally:
        holder.communicate("", timeout=10)  # closes stdin: the holder ends, the lock goes
    wait_for(lambda: "worksagain" in flat(up.output()), 40, every=0.25, what="'works again'")
    wait_for(
        lambda: status(state, "Playground", "tiny").get("readyReplicas") == 1,
        60,
        every=0.25,
        what="the status caught up",
    )
    output = up.output()
    assert flat(output).count(WARNING) == 1, output[-3000:]
    assert "Traceback" not in output and "reconcile failed" not in output, output[-3000:]


def test_a_held_write_lock_does_not_stall_the_gateway(tmp_path: Path, processes: Processes) -> None:
    state = tmp_path / "state"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet("tiny", 2))
    up = processes.up(state, str(fleet))
    wait_for(
        lambda: status(state, "Playground", "tiny").get("readyReplicas") == 2,
        90,
        every=0.25,
        what="2 replicas ready",
    )
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    wait_for(lambda: http(f"{up.url}/v1/completions", body)[0] == 200, 30, what="served")
    victim = min(up.engine_pids())
    holder = hold_lock(state)
    try:
        os.killpg(victim, signal.SIGKILL)  # the control plane has status and events to write
        # Past one busy timeout (10 s) of the control plane's writes: every request served
        # promptly by the replica left.
        slowest, held_since = 0.0, time.monotonic()
        while time.monotonic() - held_since < 12:
            started = time.monotonic()
            code, _, doc = http(f"{up.url}/v1/completions", body)
            slowest = max(slowest, time.monotonic() - started)
            assert code == 200, doc
        assert slowest < 1.0, f"a request took {slowest:.2f} s while the store was locked"
    finally:
        holder.communicate("", timeout=10)
    wait_for(
        lambda: (
            status(state, "Playground", "tiny").get("readyReplicas") == 2
            and victim not in up.engine_pids()
        ),
        60,
        every=0.25,
        what="the replica replaced and its status written once the lock was released",
    )
