"""CPU and memory of replica process groups (runtime/usage.py, processes.group_usage), read
from /proc for a real busy process and a real idle one."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmplane.controlplane.autoscaling import CPU, MEMORY
from llmplane.runtime.processes import group_usage
from llmplane.runtime.status import READY, STARTING, ReplicaStatus, WorkloadStatus
from llmplane.runtime.usage import ProcessSignals
from llmplane.testing import wait_for


@pytest.fixture
def procs() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """A busy and an idle Python process, each leading its own process group like an engine.

    Each says ``ready`` once its interpreter has started, and the fixture waits for that: read
    earlier, /proc shows the forked child before exec (no resident memory yet), and on a loaded
    machine the interpreter's own start-up CPU would land in the idle process's first rate.
    """
    ready = "import sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); "
    busy = subprocess.Popen(
        [sys.executable, "-c", ready + "\nwhile True: pass"],
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    idle = subprocess.Popen(
        [sys.executable, "-c", ready + "import time; time.sleep(600)"],
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    for p in (busy, idle):
        assert p.stdout is not None
        assert p.stdout.readline() == b"ready\n", "a measured process did not start"
    yield {"busy": busy, "idle": idle}
    for p in (busy, idle):
        p.kill()
        p.wait()
        assert p.stdout is not None
        p.stdout.close()


class Runtime:
    """The one call ProcessSignals makes of a runtime, answered with the runtime's own types."""

    def __init__(self, items: list[ReplicaStatus]) -> None:
        self.items = items

    def status(self, key: str) -> WorkloadStatus | None:
        return (
            WorkloadStatus(len(self.items), len(self.items), self.items) if key == "ns/pg" else None
        )


def replica(index: int, pid: int, phase: str = READY) -> ReplicaStatus:
    return ReplicaStatus(
        index, phase, None, "", 0, pid, f"127.0.0.1:{9000 + index}", Path("/dev/null")
    )


def test_group_usage_counts_cpu_and_resident_memory(procs) -> None:
    first = wait_for(lambda: group_usage(procs["busy"].pid), 5, what="the busy process in /proc")
    cpu, rss = first
    assert rss > 1_000_000  # a Python interpreter is several MB resident
    wait_for(lambda: group_usage(procs["busy"].pid)[0] > cpu + 0.05, 10, what="CPU to grow")
    assert group_usage(999_999_999) is None


def test_process_signals_give_cores_and_bytes_per_ready_replica(procs) -> None:
    runtime = Runtime(
        [
            replica(0, procs["busy"].pid),
            replica(1, procs["idle"].pid),
            replica(2, procs["idle"].pid, phase=STARTING),  # not routed to: no signals
        ]
    )
    signals = ProcessSignals(runtime)
    first = signals.replica_signals("ns/pg")
    assert set(first) == {"127.0.0.1:9000", "127.0.0.1:9001"}
    assert CPU not in first["127.0.0.1:9000"]  # a rate needs two readings
    assert first["127.0.0.1:9000"][MEMORY] > 1_000_000
    # A busy loop: a good part of a core even on a shared machine (a rate per 0.25 s poll).
    second = wait_for(
        lambda: (s := signals.replica_signals("ns/pg"))["127.0.0.1:9000"].get(CPU, 0) > 0.2 and s,
        10,
        every=0.25,
        what="the busy replica's CPU",
    )
    assert second["127.0.0.1:9001"][CPU] < 0.1
    assert signals.replica_signals("ns/other") == {}
