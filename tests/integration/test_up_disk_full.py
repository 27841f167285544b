"""A full disk under the state directory is survived (issue 27, item 7).

``llmplane up`` with sim replicas on a real 8 MiB tmpfs (we are root in CI; skipped where
``mount`` is not allowed), filled with a file: engines that die meanwhile (all of a model's)
are restarted once space returns instead of leaving their replicas ``Failed``; ``llmplane
apply`` and ``llmplane keys create`` print one line and exit 1 without storing anything;
``up`` keeps running and logs no traceback. The mount is removed whatever happens.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from llmplane.store.paths import open_store
from llmplane.testing import Processes, wait_for
from tests.integration.upcli import cli, sim_fleet, status

TENANTS = """
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {name: during-a}
---
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {name: during-b}
spec: {models: ["tiny"]}
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A fresh 8 MiB tmpfs, unmounted afterwards (lazily if something still holds it)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(path: Path) -> None:
    """Write ``path`` until the file system has no byte left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        block = b"\0" * 4096
        while True:
            try:
                os.write(fd, block)
            except OSError as err:
                assert err.errno == errno.ENOSPC, err
                break
    finally:
        os.close(fd)


def serving(state: Path, dead: set[int]) -> bool:
    """The recorded engines are two live processes answering on their ports, none of them
    one of ``dead``."""
    try:
        records = orjson.loads((state / "runtime" / "processes.json").read_bytes())["processes"]
    except (OSError, ValueError):
        return False
    if len(records) != 2 or dead & {r["pid"] for r in records}:
        return False
    for record in records:
        port = record["argv"][record["argv"].index("--port") + 1]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status != 200:
                    return False
        except OSError:
            return False
    return True


def ready(state: Path) -> bool:
    with contextlib.suppress(Exception):
        return status(state, "Playground", "tiny").get("readyReplicas") == 2
    return False


def test_up_survives_a_full_disk_and_recovers(
    small_disk: Path, tmp_path: Path, processes: Processes
) -> None:
    state = small_disk / "state"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet("tiny", 2))
    up = processes.up(state, str(fleet), args=["-v"])
    wait_for(lambda: ready(state), 90, every=0.25, what="two replicas ready")
    victims = wait_for(lambda: len(p := up.engine_pids()) == 2 and p, 10, what="two engines")

    filler = small_disk / "filler"
    fill(filler)
    try:
        # Both engines die while the disk is full (the model has none): their supervisors
        # must carry on.
        for victim in victims:
            os.killpg(victim, signal.SIGKILL)
        tenants = tmp_path / "tenants.yaml"
        tenants.write_text(TENANTS)
        for args in (
            ("apply", "-f", str(tenants)),
            ("keys", "create", "during-c"),
            ("keys", "create", "during-a", "--name", "x"),
        ):
            proc = cli(*args, state_dir=state, check=False)
            assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and "disk is full" in lines[0], (args, proc.stderr)
            assert "llmp-" not in proc.stdout, "a key was printed but not stored"
        assert up.proc.poll() is None, "up exited on a full disk"
    finally:
        filler.unlink()

    # Space is back: the dead engines' replicas serve again (a new process), nothing of the
    # refused commands was stored, and the same commands work now.
    wait_for(lambda: serving(state, victims), 120, every=0.25, what="two engines serving again")
    wait_for(lambda: ready(state), 30, every=0.25, what="two replicas ready again")
    with open_store(state) as store:
        assert not [
            t["metadata"]["name"] for t in store.list("Tenant") if "during" in t["metadata"]["name"]
        ]
    assert "created" in cli("apply", "-f", str(tenants), state_dir=state).stdout
    assert "llmp-" in cli("keys", "create", "during-c", state_dir=state).stdout
    output = up.output()
    assert "supervisor failed" not in output and "Traceback" not in output, output[-3000:]


def test_commands_on_a_full_disk_without_up(small_disk: Path, tmp_path: Path) -> None:
    """No ``up`` holding the store open: SQLite cannot even create its shared-memory file."""
    state = small_disk / "state"
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS)
    cli("keys", "create", "before", state_dir=state)
    filler = small_disk / "filler"
    fill(filler)
    try:
        for args in (
            ("apply", "-f", str(tenants)),
            ("keys", "create", "during-c"),
            ("keys", "revoke", "before", "x"),
            ("delete", "tenant", "before"),
            ("get", "tenants"),
        ):
            proc = cli(*args, state_dir=state, check=False)
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 1 and len(lines) == 1, (args, proc.stderr)
            assert "disk is full" in lines[0] and "llmp-" not in proc.stdout, (args, proc.stderr)
    finally:
        filler.unlink()
    listing = cli("get", "tenants", state_dir=state).stdout
    assert "before" in listing and "during" not in listing, listing
