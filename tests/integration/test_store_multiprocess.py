"""The SQLite store shared by several real processes: watches see their writes, none is lost."""

import asyncio
import contextlib
import itertools
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from llmplane.store import SQLiteStore
from llmplane.store.sqlite import _waiters
from llmplane.testing import eventually

REPO = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent(
    """
    import os, sys, time
    from llmplane.store import SQLiteStore

    path, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with SQLiteStore(path) as store:
        gate = path + ".go"  # the test creates it once every writer is ready
        print("ready", flush=True)
        while len(sys.argv) > 4 and not os.path.exists(gate):
            time.sleep(0.005)
        for i in range(count):
            store.apply({
                "apiVersion": "inference.llmaz.io/v1alpha1",
                "kind": "Playground",
                "metadata": {"name": f"{prefix}-{i}", "namespace": "default",
                             "labels": {"writer": prefix}},
                "spec": {"replicas": i},
            })
            if i % 10 == 0:
                store.update_status("Playground", f"{prefix}-{i}", "default", {"by": prefix})
            if len(sys.argv) > 4:
                time.sleep(0.0005)  # like a real controller, not a tight loop
    """
)


def start_writer(db: Path, prefix: str, count: int, gated: bool = False) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db), prefix, str(count), *(["gated"] if gated else [])],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def wait_writer(proc: subprocess.Popen, timeout: float = 60) -> None:
    _out, err = await asyncio.to_thread(proc.communicate, timeout=timeout)
    assert proc.returncode == 0, err


async def test_watch_sees_write_from_another_process(tmp_path):
    db = tmp_path / "llmplane.db"
    with SQLiteStore(db) as store:
        async with contextlib.aclosing(store.watch(kind="Playground")) as watch:
            waiting = asyncio.ensure_future(anext(watch))
            # The watch has its starting point once it waits for changes to this file.
            await eventually(lambda: _waiters.get(store._key), what="the watch waiting")
            assert not waiting.done()
            proc = start_writer(db, "remote", 1)
            await wait_writer(proc)
            written = time.monotonic()
            event = await asyncio.wait_for(waiting, 2.0)
            latency = time.monotonic() - written
            assert event.type == "ADDED"
            assert event.object["metadata"]["name"] == "remote-0"
            assert event.object["metadata"]["labels"] == {"writer": "remote"}
            # then the status the writer set
            event = await asyncio.wait_for(anext(watch), 2.0)
            assert (event.type, event.object["status"]) == ("MODIFIED", {"by": "remote"})
            assert latency < 2.0


@pytest.mark.slow
async def test_concurrent_writers_lose_nothing(tmp_path):
    db = tmp_path / "llmplane.db"
    n = 400
    with SQLiteStore(db) as store:
        async with contextlib.aclosing(store.watch(since="0")) as watch:
            procs = [start_writer(db, prefix, n, gated=True) for prefix in ("w1", "w2")]
            for proc in procs:  # both are up, so their writes really overlap
                assert await asyncio.to_thread(proc.stdout.readline) == "ready\n"
            Path(f"{db}.go").touch()
            # this process writes too, while the others do
            for i in range(50):
                store.apply(
                    {
                        "apiVersion": "v1",
                        "kind": "Playground",
                        "metadata": {"name": f"local-{i}", "namespace": "default"},
                        "spec": {},
                    }
                )
                await asyncio.sleep(0)
            for proc in procs:
                await wait_writer(proc)

            names = {o["metadata"]["name"] for o in store.list("Playground")}
            assert names == {f"{p}-{i}" for p in ("w1", "w2") for i in range(n)} | {
                f"local-{i}" for i in range(50)
            }
            assert len(store.list(label_selector="writer=w1")) == n
            statuses = [o for o in store.list("Playground") if "status" in o]
            assert len(statuses) == 2 * len(range(0, n, 10))

            total = 2 * n + 2 * len(range(0, n, 10)) + 50
            assert store.resource_version() == str(total)
            # the watcher saw every change exactly once, in resourceVersion order
            events = [await asyncio.wait_for(anext(watch), 5.0) for _ in range(total)]
            assert [int(e.resource_version) for e in events] == list(range(1, total + 1))
            assert sum(e.type == "ADDED" for e in events) == 2 * n + 50
            # and the writers did contend: their changes interleave in the log
            writers = [e.object["metadata"].get("labels", {}).get("writer") for e in events]
            remote = [w for w in writers if w]
            switches = sum(a != b for a, b in itertools.pairwise(remote))
            assert switches > 1
