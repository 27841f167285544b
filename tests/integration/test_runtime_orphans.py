"""No orphans: engines die with a SIGKILLed ``llmplane up``, or the next run kills them.

Each test runs a LocalRuntime in a child Python process, lets it start one engine replica,
SIGKILLs that child, and checks what happens to the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from llmplane.runtime.local import LocalRuntime
from llmplane.runtime.processes import TOKEN_ENV, ProcessRecord, ProcessTable, is_alive, start_ticks
from llmplane.testing import eventually, keeps
from tests.integration.standin_engine import get

ROOT = Path(__file__).resolve().parents[2]

# `llmplane up` in miniature: a runtime with one replica of the stand-in engine, then wait.
RUNTIME_SNIPPET = """
import asyncio, json, sys
from pathlib import Path
from llmplane.runtime.local import LocalRuntime
from tests.integration.standin_engine import engine_plan

async def main():
    rt = LocalRuntime(Path(sys.argv[1]))
    await rt.start()
    await rt.realise(engine_plan(*json.loads(sys.argv[2])))
    while not rt.endpoints():
        await asyncio.sleep(0.05)
    item = rt.status("default/chat").items[0]
    print(json.dumps({"pid": item.pid, "address": item.address}), flush=True)
    await asyncio.sleep(3600)

if sys.argv[3] == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


@pytest.fixture
def cleanup() -> Iterator[list[int]]:
    """Pids to SIGKILL after the test, whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


async def run_and_kill_runtime(
    state_dir: Path, cleanup: list[int], *engine_args: str, loop: str = "asyncio"
) -> dict:
    """Start a runtime process with one ready engine, SIGKILL the runtime; the engine's info."""
    runtime = subprocess.Popen(
        [sys.executable, "-c", RUNTIME_SNIPPET, str(state_dir), json.dumps(engine_args), loop],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
    )
    cleanup.append(runtime.pid)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(runtime.stdout.readline), 20)
        engine = json.loads(line)
        cleanup.append(engine["pid"])
        _, body = await get(engine["address"], "/info")
        engine.update(orjson.loads(body))
        if engine["child"]:
            cleanup.append(engine["child"])
    finally:
        runtime.kill()
        runtime.wait()
        runtime.stdout.close()
    return engine


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_engine_dies_with_its_runtime(tmp_path: Path, cleanup: list[int], loop: str) -> None:
    engine = await run_and_kill_runtime(tmp_path, cleanup, loop=loop)
    await eventually(lambda: not is_alive(engine["pid"]), 5, what="PDEATHSIG to stop the engine")
    rt = LocalRuntime(tmp_path)
    await rt.start()  # nothing left to do; forgets the old records
    assert orjson.loads((tmp_path / "runtime" / "processes.json").read_bytes())["processes"] == []
    await rt.shutdown()


async def test_next_start_kills_an_engine_that_ignored_sigterm(
    tmp_path: Path, cleanup: list[int]
) -> None:
    engine = await run_and_kill_runtime(tmp_path, cleanup, "--ignore-sigterm")
    await keeps(lambda: is_alive(engine["pid"]), 1, what="the engine ignoring SIGTERM, running")
    rt = LocalRuntime(tmp_path, stop_timeout=0.5)
    await rt.start()
    try:
        assert not is_alive(engine["pid"])
    finally:
        await rt.shutdown()


async def test_next_start_kills_the_engines_children(tmp_path: Path, cleanup: list[int]) -> None:
    engine = await run_and_kill_runtime(tmp_path, cleanup, "--spawn-child")
    await eventually(lambda: not is_alive(engine["pid"]), 5, what="PDEATHSIG to stop the engine")
    child = engine["child"]
    assert is_alive(child), "no PDEATHSIG for the engine's own children"
    rt = LocalRuntime(tmp_path, stop_timeout=2)
    await rt.start()
    try:
        assert not is_alive(child)
    finally:
        await rt.shutdown()


async def test_start_never_kills_a_process_that_is_not_ours(tmp_path: Path) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        table = ProcessTable(tmp_path / "runtime" / "processes.json")
        for pid in (os.getpid(), stranger.pid):  # recycled pids: same number, other start time
            table.add(
                ProcessRecord(
                    pid=pid,
                    pgid=pid,
                    start_ticks=(start_ticks(pid) or 0) + 1,
                    token=f"gone-{pid}",
                    workload="default/chat",
                    replica=0,
                    argv=["engine"],
                )
            )
        rt = LocalRuntime(tmp_path, stop_timeout=0.5)
        await rt.start()
        await rt.shutdown()
        assert is_alive(stranger.pid) and stranger.poll() is None
        assert TOKEN_ENV not in os.environ
    finally:
        stranger.kill()
        stranger.wait()
