"""The local runtime with real processes: the stand-in upstream (``llmplane.testing.upstream``)
as an engine under supervision."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import orjson
import pytest

from llmplane.controlplane.plan import (
    MODEL_NAME_LABEL,
    REPLICA_LABEL,
    HttpProbe,
)
from llmplane.runtime.local import LocalRuntime
from llmplane.runtime.processes import is_alive, spawn, stop_group
from llmplane.testing import eventually, keeps
from tests.integration.standin_engine import engine_plan, get

KEY = "default/chat"


def recorded_pids(state_dir: Path) -> list[int]:
    path = state_dir / "runtime" / "processes.json"
    if not path.exists():
        return []
    return [p["pid"] for p in orjson.loads(path.read_bytes())["processes"]]


def ready(runtime: LocalRuntime, key: str = KEY) -> int:
    status = runtime.status(key)
    return status.ready if status else 0


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[LocalRuntime]:
    """A runtime with fast back-off; every process it started is gone afterwards, pass or fail."""
    changes = Counter()
    inflight: dict[str, int] = {}
    rt = LocalRuntime(
        tmp_path,
        on_change=lambda: changes.update(["change"]),
        inflight=lambda address: inflight.get(address, 0),
        backoff_base=0.2,
        backoff_cap=5,
        stop_timeout=2,
    )
    rt.test_changes = changes  # type: ignore[attr-defined]
    rt.test_inflight = inflight  # type: ignore[attr-defined]
    await rt.start()
    seen: set[int] = set()

    def remember() -> None:
        seen.update(recorded_pids(tmp_path))
        changes.update(["change"])

    rt.on_change = remember
    try:
        yield rt
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(rt.shutdown(), 30)
        for pid in seen:  # belt and braces: nothing may outlive a test
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        assert not [p for p in seen if is_alive(p)], "engine processes outlived the test"


async def test_two_replicas_ready_with_own_ports_and_labels(runtime: LocalRuntime) -> None:
    await runtime.realise(engine_plan("--unhealthy-for", "1.2", replicas=2))
    status = runtime.status(KEY)
    assert status is not None and status.replicas == 2 and status.ready == 0
    await eventually(lambda: all(i.pid for i in runtime.status(KEY).items), what="processes")
    assert {i.phase for i in runtime.status(KEY).items} == {"Starting"}
    assert runtime.endpoints() == []  # started but not ready: not routable
    assert runtime.status(KEY).reason == "Starting"

    await eventually(lambda: ready(runtime) == 2, what="2 ready replicas")
    endpoints = runtime.endpoints()
    assert [e.replica for e in endpoints] == [0, 1]
    assert len({e.address for e in endpoints}) == 2
    for e in endpoints:
        assert e.address.startswith("127.0.0.1:")
        assert e.labels == {MODEL_NAME_LABEL: "fake-model", REPLICA_LABEL: str(e.replica)}
        assert (e.workload, e.model_name, e.backend) == (KEY, "fake-model", "fake")
        # What the gateway needs: the workload's namespace, the engine, a port of its own.
        assert (e.namespace, e.engine, e.fixed_port) == ("default", "fake", True)
        code, body = await get(e.address, "/info")
        info = orjson.loads(body)
        assert code == 200 and info["host"] == "127.0.0.1"
        assert e.address == f"127.0.0.1:{info['port']}"
        assert info["argv"][1:5] == ["--port", str(info["port"]), "--host", "127.0.0.1"]
    assert [e.replica for e in runtime.endpoints({REPLICA_LABEL: "1"})] == [1]
    assert len(runtime.endpoints({MODEL_NAME_LABEL: "fake-model"})) == 2
    assert runtime.endpoints({MODEL_NAME_LABEL: "other"}) == []
    status = runtime.status(KEY)
    assert status.reason is None and status.updated == 2
    assert runtime.test_changes["change"] > 0  # type: ignore[attr-defined]
    log = runtime.log_path(KEY, 1)
    assert log == status.items[1].log_path
    assert "LISTENING 127.0.0.1:" in log.read_text()
    assert sorted(recorded_pids(runtime.state_dir)) == sorted(i.pid for i in status.items)


async def test_killed_replica_comes_back(runtime: LocalRuntime) -> None:
    await runtime.realise(engine_plan(replicas=2))
    await eventually(lambda: ready(runtime) == 2, what="2 ready")
    victim = runtime.status(KEY).items[1]
    os.kill(victim.pid, signal.SIGKILL)
    await eventually(lambda: [e.replica for e in runtime.endpoints()] == [0], what="replica 1 out")
    await eventually(lambda: ready(runtime) == 2, what="replica 1 back")
    back = runtime.status(KEY).items[1]
    assert back.restarts == 1 and back.pid != victim.pid and back.last_exit_code == -9
    assert runtime.status(KEY).items[0].restarts == 0
    assert victim.pid not in recorded_pids(runtime.state_dir)


async def test_crash_loop_backs_off_exponentially(runtime: LocalRuntime) -> None:
    backoffs: list[float] = []

    def watch() -> None:
        status = runtime.status(KEY)
        if status and status.items and status.items[0].reason == "CrashLoopBackOff":
            b = status.items[0].backoff_seconds
            if not backoffs or backoffs[-1] != b:
                backoffs.append(b)

    runtime.on_change = watch
    await runtime.realise(engine_plan("--exit-after", "0", "--exit-code", "3"))
    await eventually(lambda: len(backoffs) >= 4, timeout=15, what="4 back-offs")
    assert backoffs[:4] == [0.2, 0.4, 0.8, 1.6]
    item = runtime.status(KEY).items[0]
    assert item.phase == "Pending" and item.reason == "CrashLoopBackOff"
    assert item.last_exit_code == 3 and item.restarts >= 3
    assert "exited with code 3" in item.message and "last exit code 3" in item.message
    assert "upstream: exiting with code 3 (boom)" in item.message  # the log's last lines
    status = runtime.status(KEY)
    assert status.reason == "CrashLoopBackOff" and status.ready == 0
    assert runtime.endpoints() == []


async def test_scale_down_drains_in_flight_requests(runtime: LocalRuntime) -> None:
    await runtime.realise(engine_plan(replicas=2))
    await eventually(lambda: ready(runtime) == 2, what="2 ready")
    leaving = runtime.status(KEY).items[1]
    inflight = runtime.test_inflight  # type: ignore[attr-defined]

    async def held_request() -> tuple[int, str]:
        inflight[leaving.address] = 1  # what the gateway would count
        try:
            return await get(leaving.address, "/hold?seconds=1.5")
        finally:
            inflight[leaving.address] = 0

    request = asyncio.ensure_future(held_request())
    await eventually(lambda: inflight.get(leaving.address) == 1, what="the request counted")
    started = time.monotonic()
    await runtime.realise(replace(engine_plan(replicas=1)))
    # Out of the endpoints at once, but draining, not stopped.
    assert [e.replica for e in runtime.endpoints()] == [0]
    assert [(i.index, i.phase) for i in runtime.status(KEY).items] == [
        (0, "Ready"),
        (1, "Terminating"),
    ]
    await keeps(
        lambda: is_alive(leaving.pid) or request.done(),
        0.5,
        what="the leaving replica alive while its request is in flight",
    )
    assert await request == (200, "done")
    await eventually(lambda: len(runtime.status(KEY).items) == 1, what="replica 1 gone")
    assert time.monotonic() - started >= 1.0
    assert not is_alive(leaving.pid)
    assert is_alive(runtime.status(KEY).items[0].pid)


async def test_drain_uses_engine_metrics_without_inflight_callback(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path, backoff_base=0.2, stop_timeout=2)
    try:
        await rt.realise(engine_plan())
        await eventually(lambda: ready(rt) == 1, what="ready")
        item = rt.status(KEY).items[0]
        request = asyncio.ensure_future(get(item.address, "/hold?seconds=1.5"))

        async def running() -> bool:
            status, text = await get(item.address, "/metrics")
            return status == 200 and 'running{model_name="fake"} 1.0' in text

        await eventually(running, what="the engine reporting the request running")
        await rt.remove(KEY)
        assert request.done() and request.result() == (200, "done")
        assert not is_alive(item.pid)
        assert rt.status(KEY) is None and rt.endpoints() == []
        assert recorded_pids(tmp_path) == []
    finally:
        await rt.shutdown()


async def test_drain_is_bounded_by_the_grace_period(runtime: LocalRuntime) -> None:
    await runtime.realise(engine_plan(grace=1))
    await eventually(lambda: ready(runtime) == 1, what="ready")
    item = runtime.status(KEY).items[0]
    runtime.test_inflight[item.address] = 5  # type: ignore[attr-defined]  # never drains
    started = time.monotonic()
    await runtime.remove(KEY)
    assert 0.9 <= time.monotonic() - started < 4
    assert not is_alive(item.pid)


async def test_remove_leaves_no_process(runtime: LocalRuntime) -> None:
    await runtime.realise(engine_plan(replicas=2))
    await eventually(lambda: ready(runtime) == 2, what="2 ready")
    pids = [i.pid for i in runtime.status(KEY).items]
    assert all(is_alive(p) for p in pids)
    await runtime.remove(KEY)
    assert not any(is_alive(p) for p in pids)
    assert runtime.status(KEY) is None and runtime.endpoints() == []
    assert recorded_pids(runtime.state_dir) == []
    await runtime.remove(KEY)  # idempotent


async def test_missing_engine_is_reported_once_with_the_hint(runtime: LocalRuntime) -> None:
    plan = engine_plan(argv=[sys.executable, "-m", "not_installed_module", "--port", "8080"])
    await runtime.realise(plan)
    await eventually(lambda: runtime.status(KEY).items[0].phase == "Failed", what="Failed")
    await keeps(  # longer than the back-off: still no attempt to start
        lambda: runtime.status(KEY).items[0].restarts == 0, 0.6, what="no restart"
    )
    item = runtime.status(KEY).items[0]
    assert item.reason == "EngineNotInstalled" and item.restarts == 0 and item.pid is None
    assert "not_installed_module" in item.message and "pip install fake-engine" in item.message
    assert not item.log_path.exists()  # never started a process
    assert runtime.status(KEY).reason == "EngineNotInstalled"

    await runtime.realise(replace(plan, local=replace(plan.local, argv=["no-such-engine-x1"])))
    await eventually(lambda: "no-such-engine-x1" in runtime.status(KEY).items[0].message)
    assert runtime.status(KEY).items[0].reason == "EngineNotInstalled"

    await runtime.realise(engine_plan())  # installed now: starts
    await eventually(lambda: ready(runtime) == 1, what="ready after the fix")


async def test_template_change_rolls_one_replica_at_a_time(runtime: LocalRuntime) -> None:
    await runtime.realise(engine_plan(replicas=2, env={"UPSTREAM_VERSION": "1"}))
    await eventually(lambda: ready(runtime) == 2, what="2 ready")
    old = {i.index: i.pid for i in runtime.status(KEY).items}
    least_ready, most_starting = 2, 0

    def watch() -> None:
        nonlocal least_ready, most_starting
        least_ready = min(least_ready, len(runtime.endpoints()))
        starting = [i for i in runtime.status(KEY).items if i.phase in ("Pending", "Starting")]
        most_starting = max(most_starting, len(starting))

    runtime.on_change = watch
    await runtime.realise(engine_plan(replicas=2, env={"UPSTREAM_VERSION": "2"}))
    status = runtime.status(KEY)
    assert status.updated == 1 and status.ready == 2  # a surge replica for index 0 first

    def rolled() -> bool:
        s = runtime.status(KEY)
        return s.updated == 2 and s.ready == 2 and len(s.items) == 2

    await eventually(rolled, timeout=15, what="rollout")
    assert least_ready >= 2, "a rolling update must keep every replica serving"
    assert most_starting == 1, "one replica at a time"
    for item in runtime.status(KEY).items:
        assert item.pid != old[item.index] and not is_alive(old[item.index])
        _, body = await get(item.address, "/info")
        assert orjson.loads(body)["env"] == {"UPSTREAM_VERSION": "2"}
    await runtime.realise(engine_plan(replicas=2, env={"UPSTREAM_VERSION": "2"}))  # idempotent
    assert [i.pid for i in runtime.status(KEY).items] == [
        i.pid for i in runtime.status(KEY).items if i.phase == "Ready"
    ]


async def test_startup_probe_failure_restarts(runtime: LocalRuntime) -> None:
    startup = HttpProbe(path="/health", port=8080, period_seconds=1, failure_threshold=2)
    await runtime.realise(engine_plan("--unhealthy-for", "60", startup=startup))
    await eventually(
        lambda: runtime.status(KEY).items[0].reason == "StartupProbeFailed",
        timeout=5,
        what="StartupProbeFailed",
    )
    item = runtime.status(KEY).items[0]
    assert "startup probe failed 2 times" in item.message and "HTTP 503" in item.message
    await eventually(lambda: runtime.status(KEY).items[0].restarts >= 1, what="restart")


async def test_ready_follows_the_engine_long_before_the_next_probe_period(
    runtime: LocalRuntime,
) -> None:
    # vLLM's built-in probes every 10 s; an engine healthy after 1 s is Ready well before the
    # second 10 s tick (the runtime asks a starting replica every quarter second).
    startup = HttpProbe(path="/health", port=8080, period_seconds=10, failure_threshold=30)
    readiness = HttpProbe(path="/health", port=8080, period_seconds=10, failure_threshold=3)
    await runtime.realise(engine_plan("--unhealthy-for", "1", startup=startup, readiness=readiness))
    await eventually(lambda: ready(runtime) == 1, timeout=8, what="Ready before the 10 s tick")


async def test_frequent_startup_probing_keeps_the_failure_threshold_timing(
    runtime: LocalRuntime,
) -> None:
    # period 1 s x threshold 3: the third failed tick is 2 s after the start, however many extra
    # attempts ran in between.
    startup = HttpProbe(path="/health", port=8080, period_seconds=1, failure_threshold=3)
    begun = time.monotonic()
    await runtime.realise(engine_plan("--unhealthy-for", "60", startup=startup))
    await eventually(
        lambda: runtime.status(KEY).items[0].reason == "StartupProbeFailed",
        timeout=10,
        what="StartupProbeFailed",
    )
    assert time.monotonic() - begun >= 2.0
    assert "startup probe failed 3 times" in runtime.status(KEY).items[0].message


async def test_readiness_and_liveness_failures(runtime: LocalRuntime) -> None:
    liveness = HttpProbe(path="/health", port=8080, period_seconds=1, failure_threshold=3)
    await runtime.realise(engine_plan(liveness=liveness))
    await eventually(lambda: ready(runtime) == 1, what="ready")
    first = runtime.status(KEY).items[0]
    # Record every phase as it happens: on a loaded machine the NotReady window before the
    # liveness restart can be shorter than a polling interval.
    seen: list[tuple[str, int | None, bool]] = []
    previous = runtime.on_change

    def record() -> None:
        item = runtime.status(KEY).items[0]
        seen.append((item.phase, item.pid, bool(runtime.endpoints())))
        if previous:
            previous()

    runtime.on_change = record
    async with aiohttp.ClientSession() as session:
        await session.post(f"http://{first.address}/admin", json={"healthy": False})
    await eventually(lambda: any(p == "NotReady" for p, _, _ in seen), what="NotReady")
    not_ready = next(s for s in seen if s[0] == "NotReady")
    assert not_ready == ("NotReady", first.pid, False)  # same process, no longer an endpoint
    await eventually(
        lambda: runtime.status(KEY).items[0].restarts == 1, timeout=6, what="liveness restart"
    )
    await eventually(lambda: ready(runtime) == 1, what="ready again")
    item = runtime.status(KEY).items[0]
    assert item.pid != first.pid and not is_alive(first.pid)


async def test_health_path_overrides_probe_paths(runtime: LocalRuntime) -> None:
    probe = HttpProbe(path="/v1/not-served", port="http", period_seconds=1)
    await runtime.realise(engine_plan(readiness=probe, health_path="/health"))
    await eventually(lambda: ready(runtime) == 1, what="ready via health_path")


async def test_plan_without_local_command(runtime: LocalRuntime) -> None:
    await runtime.realise(replace(engine_plan(replicas=2), local=None))
    status = runtime.status(KEY)
    assert status.reason == "NoLocalCommand" and status.ready == 0
    assert [(i.phase, i.reason) for i in status.items] == [("Failed", "NoLocalCommand")] * 2
    assert runtime.endpoints() == []


async def test_second_runtime_on_the_same_state_dir_is_refused(runtime: LocalRuntime) -> None:
    with pytest.raises(RuntimeError, match="another llmplane runtime"):
        await LocalRuntime(runtime.state_dir).start()


async def test_backoff_resets_after_being_ready_long_enough(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path, backoff_base=0.2, backoff_reset=0.1, stop_timeout=2)
    backoffs: list[float] = []
    messages: list[str] = []

    def watch() -> None:
        status = rt.status(KEY)
        item = status.items[0] if status and status.items else None
        # Each run was Ready before it exited: "Restarting" (held at the gateway), not a
        # failing engine.
        if item and item.reason == "Restarting" and item.restarts == len(backoffs):
            backoffs.append(item.backoff_seconds)
            messages.append(item.message)

    rt.on_change = watch
    try:
        # Ready after ~1 s (first probe at 0 s comes too early), exits at 1.3 s: each run was
        # ready longer than backoff_reset, so the delay never grows.
        await rt.realise(engine_plan("--exit-after", "1.3"))
        await eventually(lambda: len(backoffs) >= 2, timeout=10, what="2 crashes")
        assert backoffs[:2] == [0.2, 0.2]
        assert "the engine stopped after serving" in messages[0]
    finally:
        await rt.shutdown()


async def test_shutdown_stops_everything_and_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path, backoff_base=0.2, stop_timeout=0.5)
    pids: list[int] = []
    try:
        await asyncio.gather(  # both start the runtime (once)
            rt.realise(engine_plan("--ignore-sigterm", replicas=2)),
            rt.realise(engine_plan(name="other", replicas=1)),
        )
        await eventually(lambda: ready(rt) == 2 and ready(rt, "default/other") == 1, what="ready")
        pids = [i.pid for k in (KEY, "default/other") for i in rt.status(k).items]
        started = time.monotonic()
        await rt.shutdown()
        assert time.monotonic() - started < 2.5  # concurrently: one 0.5 s SIGKILL wait, not two
        assert not any(is_alive(p) for p in pids)
        assert recorded_pids(tmp_path) == []
        with pytest.raises(RuntimeError, match="shut down"):
            await rt.realise(engine_plan())
    finally:
        await rt.shutdown()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


async def test_engine_logs_are_rotated_by_size(tmp_path: Path) -> None:
    # An engine that writes about 1 MB a second into its log; the runtime keeps the log under
    # 64 KB plus what arrives between two checks, the older part in replica-0.log.1.
    chatty = (
        "import sys, time\n"
        "i = 0\n"
        "while True:\n"
        "    i += 1\n"
        "    sys.stdout.write(f'line {i} ' + 'x' * 990 + '\\n'); sys.stdout.flush()\n"
        "    time.sleep(0.001)\n"
    )
    rt = LocalRuntime(tmp_path, stop_timeout=2, log_max_bytes=64 * 1024, log_check_interval=0.1)
    plan = replace(engine_plan(argv=[sys.executable, "-c", chatty]), readiness_probe=None)
    try:
        await rt.realise(plan)
        log_path = rt.log_path(KEY, 0)
        backup = log_path.with_name("replica-0.log.1")
        await eventually(backup.exists, timeout=20, what="a rotated log")
        await keeps(  # a few more checks while the engine keeps writing
            lambda: log_path.stat().st_size < 2 * 1024 * 1024, 0.5, what="the log kept small"
        )
        assert backup.stat().st_size > 64 * 1024
        # The engine keeps appending to the emptied file: newer lines than the backup's last.
        last_backup = int(backup.read_bytes().splitlines()[-1].split()[1])
        await eventually(lambda: b"line " in log_path.read_bytes(), timeout=5, what="new lines")
        first_new = int(
            next(
                ln for ln in log_path.read_bytes().splitlines() if ln.startswith(b"line ")
            ).split()[1]
        )
        assert first_new > last_backup
    finally:
        await rt.shutdown()


async def test_stop_group_obeys_a_cancellation_that_arrives_as_the_process_exits(
    tmp_path: Path,
) -> None:
    # A replica's supervisor is cancelled by terminate() while it stops its engine. A
    # cancellation landing in the loop iterations that deliver the engine's exit was lost
    # (Python 3.11's wait_for returns the result then), and the supervisor carried on
    # restarting the engine after shutdown. The loop sees the exit at a known point (returncode
    # set, polled every iteration); cancelling 0..7 iterations later covers its delivery.
    for k in range(8):
        with open(tmp_path / "log", "ab") as log_file:
            proc = await spawn(["sleep", "30"], dict(os.environ), log_file)
        stopping = asyncio.ensure_future(stop_group(proc, proc.pid, 5))
        try:
            await eventually(lambda p=proc: p.returncode is not None, every=0, what="exit")
            for _ in range(k):
                await asyncio.sleep(0)
            requested = stopping.cancel()
            await asyncio.wait([stopping])
            assert stopping.cancelled() or not requested, (
                f"stop_group ran on after a cancellation {k} loop iterations after the exit"
            )
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


async def test_realise_racing_shutdown_starts_no_engine(tmp_path: Path) -> None:
    # ``up`` stopping while the controller's first realise() still takes the state directory:
    # the realise must not start an engine after shutdown() returned.
    seen: set[int] = set()
    rt = LocalRuntime(tmp_path, lambda: seen.update(recorded_pids(tmp_path)), stop_timeout=2)
    realising = asyncio.ensure_future(rt.realise(engine_plan()))
    try:
        await asyncio.sleep(0)  # realise() is inside start(), holding the start lock
        await rt.shutdown()
        done, _ = await asyncio.wait([realising], timeout=10)
        assert done, "realise() did not return"
        with pytest.raises(RuntimeError, match="shut down"):
            realising.result()
        assert rt.status(KEY) is None and not seen and recorded_pids(tmp_path) == []
    finally:
        for pid in seen:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
