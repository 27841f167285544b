import asyncio
import contextlib
import time

import pytest

from llmplane.store import Expired, SQLiteStore
from llmplane.store import sqlite as sqlite_store
from llmplane.testing import eventually


def pg(name, ns="default", replicas=1):
    return {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Playground",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas},
    }


def model(name):
    return {"apiVersion": "llmaz.io/v1alpha1", "kind": "OpenModel", "metadata": {"name": name}}


async def take(watch, n, timeout=2.0):
    return [await asyncio.wait_for(anext(watch), timeout) for _ in range(n)]


def summary(events):
    return [
        (e.type, e.object["kind"], e.object["metadata"]["name"], e.resource_version) for e in events
    ]


@pytest.fixture
def store(tmp_path):
    with SQLiteStore(tmp_path / "llmplane.db") as s:
        yield s


async def test_initial_list_then_changes_in_order(store):
    store.apply(pg("a"))
    store.apply(pg("b"))
    store.apply(pg("a", replicas=2))  # a is now rv 3, so it is listed after b
    async with contextlib.aclosing(store.watch()) as watch:
        initial = await take(watch, 2)
        assert summary(initial) == [
            ("ADDED", "Playground", "b", "2"),
            ("ADDED", "Playground", "a", "3"),
        ]
        store.apply(pg("b", replicas=5))
        store.update_status("Playground", "a", "default", {"phase": "Ready"})
        store.delete("Playground", "b", "default")
        store.apply(pg("c"))
        events = await take(watch, 4)
        assert summary(events) == [
            ("MODIFIED", "Playground", "b", "4"),
            ("MODIFIED", "Playground", "a", "5"),
            ("DELETED", "Playground", "b", "6"),
            ("ADDED", "Playground", "c", "7"),
        ]
        assert events[0].object["spec"] == {"replicas": 5}
        assert events[1].object["status"] == {"phase": "Ready"}
        # no-op writes produce no events
        store.apply(pg("c"))
        store.update_status("Playground", "a", "default", {"phase": "Ready"})
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(watch), 0.3)


async def test_since_resumes(store):
    store.apply(pg("a"))
    mark = store.apply(pg("b"))["metadata"]["resourceVersion"]
    store.apply(pg("a", replicas=2))
    store.delete("Playground", "b", "default")
    async with contextlib.aclosing(store.watch(since=mark)) as watch:
        assert summary(await take(watch, 2)) == [
            ("MODIFIED", "Playground", "a", "3"),
            ("DELETED", "Playground", "b", "4"),
        ]
    # resuming from the last event yields only what comes after it
    async with contextlib.aclosing(store.watch(since="4")) as watch:
        store.apply(pg("d"))
        assert summary(await take(watch, 1)) == [("ADDED", "Playground", "d", "5")]
    async with contextlib.aclosing(store.watch(since="0")) as watch:
        assert [e.resource_version for e in await take(watch, 5)] == ["1", "2", "3", "4", "5"]


async def test_filters(store):
    store.apply_many([pg("a"), pg("a", ns="team"), model("m")])
    async with contextlib.aclosing(store.watch(kind="Playground", namespace="team")) as watch:
        assert summary(await take(watch, 1)) == [("ADDED", "Playground", "a", "2")]
        store.apply(pg("x"))
        store.apply(model("n"))
        store.apply(pg("y", ns="team"))
        assert summary(await take(watch, 1)) == [("ADDED", "Playground", "y", "6")]
    async with contextlib.aclosing(store.watch(kind="OpenModel")) as watch:
        assert [e.object["metadata"]["name"] for e in await take(watch, 2)] == ["m", "n"]
    async with contextlib.aclosing(store.watch(namespace="")) as watch:  # cluster-scoped only
        assert [e.object["kind"] for e in await take(watch, 2)] == ["OpenModel", "OpenModel"]


def parked(store: SQLiteStore) -> bool:
    """A watch of ``store`` has read everything and waits for a wakeup (or its next poll)."""
    return any(w.event._waiters for w in sqlite_store._waiters.get(store._key, ()))


async def test_same_process_writes_wake_watchers_immediately(tmp_path):
    # A long poll interval proves the wakeup, not the poll, delivers the event.
    with SQLiteStore(tmp_path / "s.db", poll_interval=30) as store:
        other = SQLiteStore(tmp_path / "s.db", poll_interval=30)  # same file, other instance
        async with contextlib.aclosing(store.watch(since="0")) as watch:
            waiting = asyncio.ensure_future(anext(watch))
            await eventually(lambda: parked(store), what="the watch waiting for a wakeup")
            started = time.monotonic()
            store.apply(pg("a"))
            assert (await asyncio.wait_for(waiting, 2)).type == "ADDED"
            waiting = asyncio.ensure_future(anext(watch))
            await eventually(lambda: parked(store), what="the watch waiting again")
            await asyncio.to_thread(other.apply, pg("b"))  # from another thread too
            assert (await asyncio.wait_for(waiting, 2)).object["metadata"]["name"] == "b"
            assert time.monotonic() - started < 1.0
        other.close()


async def test_watch_does_not_block_the_loop(store):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    async with contextlib.aclosing(store.watch()) as watch:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(watch), 0.5)
    task.cancel()
    assert ticks >= 20


async def test_many_watchers_and_large_backlog(store):
    store.apply_many([pg(f"p{i}") for i in range(1200)])
    watches = [store.watch(since="0") for _ in range(3)]
    try:
        for w in watches:
            rvs = [int(e.resource_version) for e in await take(w, 1200)]
            assert rvs == list(range(1, 1201))
    finally:
        for w in watches:
            await w.aclose()


async def test_expired_since(tmp_path):
    with SQLiteStore(tmp_path / "s.db", max_events=10, compact_every=5) as store:
        for i in range(40):
            store.apply(pg("a", replicas=i))
        with pytest.raises(Expired, match="too old"):
            await anext(store.watch(since="1"))
        with pytest.raises(Expired, match="ahead of the store"):
            await anext(store.watch(since="1000"))
        with pytest.raises(ValueError, match="invalid resourceVersion"):
            await anext(store.watch(since="abc"))
        # a fresh list+watch always works
        async with contextlib.aclosing(store.watch()) as watch:
            (event,) = await take(watch, 1)
            assert event.object["spec"] == {"replicas": 39}


async def test_watcher_that_falls_behind_compaction_gets_expired(tmp_path):
    with SQLiteStore(tmp_path / "s.db", max_events=10, compact_every=5) as store:
        store.apply(pg("a"))
        async with contextlib.aclosing(store.watch(since="0")) as watch:
            await take(watch, 1)
            for i in range(40):
                store.apply(pg("a", replicas=i + 2))
            with pytest.raises(Expired):
                await take(watch, 40)
