"""The embedded runtime: realise a WorkloadPlan as supervised engine processes on this machine.

One :class:`LocalRuntime` serves every workload of ``llmplane up``. A workload is a set of
replicas; each replica is one engine process watched by its own supervisor coroutine:

    Pending -> Starting -> Ready <-> NotReady
       ^          |          |
       +-- back-off (CrashLoopBackOff) <- process exit / startup or liveness probe failure
    any -> Terminating (removed from endpoints, drained, SIGTERM, SIGKILL after 10 s)
    Pending -> Failed (EngineNotInstalled: no restarts until the next realise())

Probes follow Kubernetes semantics (see ``probes.py``). Process groups, PDEATHSIG and the record
that lets the next run kill leftovers live in ``processes.py``; ports and argv in ``launch.py``.
Everything runs on the caller's event loop; nothing here blocks it for longer than a small file
write or a /proc scan.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import aiohttp

from llmplane.controlplane.plan import REPLICA_LABEL, HttpProbe, WorkloadPlan
from llmplane.runtime import probes
from llmplane.runtime.launch import (
    LOCAL_HOST,
    engine_argv,
    free_port,
    missing_engine,
    rewrite_argv,
)
from llmplane.runtime.processes import (
    TOKEN_ENV,
    ProcessRecord,
    ProcessTable,
    kill_leftovers,
    spawn,
    start_ticks,
    stop_group,
)

log = logging.getLogger(__name__)

PENDING, STARTING, READY, NOT_READY, TERMINATING, FAILED = (
    "Pending",
    "Starting",
    "Ready",
    "NotReady",
    "Terminating",
    "Failed",
)
ENGINE_NOT_INSTALLED = "EngineNotInstalled"
CRASH_LOOP = "CrashLoopBackOff"
NO_LOCAL_COMMAND = "NoLocalCommand"
STARTUP_PROBE_FAILED = "StartupProbeFailed"
LIVENESS_PROBE_FAILED = "LivenessProbeFailed"
# Reasons a replica waits out a restart back-off with.
RESTART_REASONS = (CRASH_LOOP, STARTUP_PROBE_FAILED, LIVENESS_PROBE_FAILED)

LOG_TAIL_LINES = 10


@dataclass
class Endpoint:
    """A ready replica the gateway may route to."""

    address: str  # "127.0.0.1:PORT"
    labels: dict[str, str]  # plan.labels + {"llmplane.io/replica-index": "0"}
    workload: str  # plan.key, "namespace/name"
    replica: int
    model_name: str
    backend: str


@dataclass
class ReplicaStatus:
    index: int
    phase: str  # Pending | Starting | Ready | NotReady | Terminating | Failed
    reason: str | None  # EngineNotInstalled | CrashLoopBackOff | NoLocalCommand | ...
    message: str
    restarts: int
    pid: int | None
    address: str | None
    log_path: Path
    last_exit_code: int | None = None  # of the previous process (negative: killed by signal)
    backoff_seconds: float | None = None  # the current or last restart delay
    template_hash: str = ""  # the plan template this replica runs


@dataclass
class WorkloadStatus:
    replicas: int  # desired
    ready: int  # replica indexes with a Ready process
    items: list[ReplicaStatus] = field(default_factory=list)
    reason: str | None = None  # of the worst replica, for conditions; None when all are ready
    message: str = ""
    updated: int = 0  # replica indexes running the current template


# Which replica speaks for the workload's conditions: higher is worse.
def _severity(s: ReplicaStatus) -> int:
    if s.phase == FAILED:
        return 6
    if s.phase == PENDING and s.reason in RESTART_REASONS:
        return 5
    return {NOT_READY: 4, STARTING: 3, PENDING: 2, TERMINATING: 1}.get(s.phase, 0)


class LocalRuntime:
    """Supervised local engine processes for every workload of one ``llmplane up``.

    ``state_dir`` holds ``logs/<ns>/<name>/replica-<i>.log`` and ``runtime/processes.json``.
    ``on_change()`` is called (on the event loop) whenever endpoints or statuses change.
    ``inflight(address)`` is the gateway's count of requests in flight to an endpoint; draining
    waits for it to reach 0. Without it, draining waits for the engine's running-requests gauge
    (``vllm:num_requests_running``) when ``/metrics`` answers.

    ``backoff_base``/``backoff_cap``: restart delays ``base * 2**n`` capped at ``cap`` seconds,
    back to ``base`` once a replica has been ready for ``backoff_reset`` seconds.
    ``stop_timeout``: seconds between SIGTERM and SIGKILL.
    """

    def __init__(
        self,
        state_dir: Path,
        on_change: Callable[[], None] | None = None,
        inflight: Callable[[str], int] | None = None,
        *,
        backoff_base: float = 10.0,
        backoff_cap: float = 300.0,
        backoff_reset: float = 600.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.on_change = on_change
        self.inflight = inflight
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.backoff_reset = backoff_reset
        self.stop_timeout = stop_timeout
        self.table = ProcessTable(self.state_dir / "runtime" / "processes.json")
        self._workloads: dict[str, _Workload] = {}
        self._removing: dict[str, _Workload] = {}
        self._session: aiohttp.ClientSession | None = None
        self._lock_file: IO[bytes] | None = None
        self._ports: set[int] = set()  # allocated to replicas of this runtime
        self._start_lock = asyncio.Lock()
        self._started = False
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the state directory and stop engine processes left over from a previous run."""
        async with self._start_lock:
            if not self._started:
                await self._take_state_dir()

    async def _take_state_dir(self) -> None:
        runtime_dir = self.state_dir / "runtime"
        runtime_dir.mkdir(parents=True, exist_ok=True)
        lock = open(runtime_dir / "lock", "ab")  # noqa: SIM115 (held for the runtime's lifetime)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise RuntimeError(
                f"another llmplane runtime is using {self.state_dir}; stop it first"
            ) from None
        self._lock_file = lock
        leftovers = await kill_leftovers(self.table.load(), self.stop_timeout)
        if leftovers:
            log.warning("stopped leftover engine processes %s", leftovers)
        self.table.clear()
        self._started = True

    async def shutdown(self) -> None:
        """Drain and stop every replica of every workload (concurrently), then let go."""
        self._closed = True
        keys = set(self._workloads) | set(self._removing)
        await asyncio.gather(*(self.remove(k) for k in keys))
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._started:
            self.table.clear()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
        self._started = False

    # -- the Runtime interface ---------------------------------------------------------------------

    async def realise(self, plan: WorkloadPlan) -> None:
        """Make the workload's processes match ``plan``; returns once the changes are under way.

        Idempotent. Scales up and down (highest indexes first) and replaces replicas whose
        template changed one at a time, the new process ready before the old one stops.
        Replicas that found their engine missing check again on every call.
        """
        if self._closed:
            raise RuntimeError("the local runtime has been shut down")
        await self.start()
        workload = self._workloads.get(plan.key)
        if workload is None:
            workload = self._workloads[plan.key] = _Workload(self, plan)
        else:
            workload.plan = plan
        workload.retry_missing_engines()
        workload.reconcile()
        self.notify()

    async def remove(self, key: str) -> None:
        """Drain and stop every replica of a workload; returns when all its processes are gone."""
        workload = self._workloads.pop(key, None)
        if workload is not None:
            self._removing[key] = workload
            workload.removed = True
            for replica in sorted(workload.live, key=lambda r: -r.index):
                workload.stop(replica)
        else:
            workload = self._removing.get(key)
            if workload is None:
                return
        while workload.stop_tasks:
            await asyncio.gather(*list(workload.stop_tasks), return_exceptions=True)
        if self._removing.get(key) is workload:
            del self._removing[key]
            self.notify()

    def endpoints(self, selector: dict[str, str] | None = None) -> list[Endpoint]:
        """Ready replicas whose labels include every ``selector`` label."""
        out = []
        for workload in self._workloads.values():
            for replica in workload.live:
                if replica.phase != READY or replica.address is None:
                    continue
                endpoint = replica.endpoint()
                if selector and any(endpoint.labels.get(k) != v for k, v in selector.items()):
                    continue
                out.append(endpoint)
        return sorted(out, key=lambda e: (e.workload, e.replica, e.address))

    def status(self, key: str) -> WorkloadStatus | None:
        workload = self._workloads.get(key) or self._removing.get(key)
        return workload.status() if workload is not None else None

    def log_path(self, key: str, replica: int) -> Path:
        namespace, _, name = key.partition("/")
        return self.state_dir / "logs" / namespace / name / f"replica-{replica}.log"

    # -- helpers for replicas ----------------------------------------------------------------------

    def notify(self) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change()
        except Exception:
            log.exception("on_change callback failed")

    def allocate_port(self, preferred: int | None) -> int:
        """A free port no other replica of this runtime holds (the kernel may hand one out twice
        between a probe-bind and the engine's bind)."""
        for _ in range(50):
            port = free_port(preferred)
            if port not in self._ports:
                self._ports.add(port)
                return port
            preferred = None
        raise RuntimeError("no free TCP port on 127.0.0.1")

    def release_port(self, port: int | None) -> None:
        self._ports.discard(port)  # type: ignore[arg-type]

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # A new connection per check, as the kubelet does: engines restart on the same port.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True, limit=0)
            )
        return self._session


class _Workload:
    """The replicas of one plan; ``reconcile()`` moves them towards the latest plan."""

    def __init__(self, runtime: LocalRuntime, plan: WorkloadPlan) -> None:
        self.runtime = runtime
        self.plan = plan
        self.live: list[_Replica] = []  # serving or trying to; several per index mid-rollout
        self.terminating: list[_Replica] = []
        self.stop_tasks: set[asyncio.Task[None]] = set()
        self.removed = False
        self._generation = 0
        self._reconcile_scheduled = False

    def changed(self) -> None:
        """A replica changed: tell the runtime's listener and reconcile again soon."""
        if not self._reconcile_scheduled and not self.removed:
            self._reconcile_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_reconcile)
        self.runtime.notify()

    def _scheduled_reconcile(self) -> None:
        self._reconcile_scheduled = False
        self.reconcile()

    def retry_missing_engines(self) -> None:
        current = self.plan.template_hash()
        for replica in self.live:
            if (
                replica.phase == FAILED
                and replica.reason == ENGINE_NOT_INSTALLED
                and replica.template_hash == current  # others are replaced by reconcile()
            ):
                replica.run()

    def reconcile(self) -> None:
        """Start and stop replicas (never waits); called on realise() and on replica changes."""
        if self.removed:
            return
        plan = self.plan
        if plan.local is None:
            for replica in sorted(self.live, key=lambda r: -r.index):
                self.stop(replica)
            return
        wanted = plan.replicas
        current = plan.template_hash()
        for replica in sorted(self.live, key=lambda r: -r.index):
            if replica.index >= wanted:
                self.stop(replica)

        by_index: dict[int, list[_Replica]] = {}
        for replica in self.live:
            by_index.setdefault(replica.index, []).append(replica)
        # A rolling update replaces one index at a time: busy while a new replica is not yet
        # ready next to an old one that still serves.
        rolling = any(
            any(r.template_hash == current and r.phase != READY for r in rs)
            and any(r.template_hash != current and r.phase == READY for r in rs)
            for rs in by_index.values()
        )
        for index in range(wanted):
            replicas = sorted(by_index.get(index, []), key=lambda r: r.generation)
            new = [r for r in replicas if r.template_hash == current]
            old = [r for r in replicas if r.template_hash != current]
            for extra in new[:-1]:
                self.stop(extra)
            target = new[-1] if new else None
            serving = [r for r in old if r.phase == READY]
            keep = serving[-1] if serving and (target is None or target.phase != READY) else None
            for replica in old:
                if replica is not keep:
                    self.stop(replica)
            if target is None:
                if keep is None:
                    self.start(index)
                elif not rolling:
                    self.start(index)  # the surge replica; `keep` stops once it is ready
                    rolling = True

    def start(self, index: int) -> None:
        self._generation += 1
        replica = _Replica(self, index, self._generation, self.plan)
        self.live.append(replica)
        replica.run()

    def stop(self, replica: _Replica) -> None:
        """Take a replica out of service now; drain and stop its process in the background."""
        if replica not in self.live:
            return
        self.live.remove(replica)
        self.terminating.append(replica)
        replica.begin_termination()
        task = asyncio.get_running_loop().create_task(replica.terminate())
        self.stop_tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self.stop_tasks.discard(t)
            with contextlib.suppress(ValueError):
                self.terminating.remove(replica)
            if not t.cancelled() and t.exception() is not None:
                log.error("stopping %s failed", replica.name, exc_info=t.exception())
            self.changed()

        task.add_done_callback(done)

    def status(self) -> WorkloadStatus:
        plan = self.plan
        wanted = plan.replicas
        if plan.local is None and not self.removed:
            items = [
                ReplicaStatus(
                    index=i,
                    phase=FAILED,
                    reason=NO_LOCAL_COMMAND,
                    message=f"backend {plan.backend!r} has no local command; "
                    "this workload can only run on Kubernetes",
                    restarts=0,
                    pid=None,
                    address=None,
                    log_path=self.runtime.log_path(plan.key, i),
                )
                for i in range(wanted)
            ]
            items += [r.status() for r in self.terminating]
        else:
            replicas = sorted(self.live + self.terminating, key=lambda r: (r.index, r.generation))
            items = [r.status() for r in replicas]
        current = plan.template_hash()
        ready = {r.index for r in self.live if r.phase == READY and r.index < wanted}
        updated = {r.index for r in self.live if r.template_hash == current and r.index < wanted}
        result = WorkloadStatus(
            replicas=0 if self.removed else wanted,
            ready=len(ready),
            items=items,
            updated=len(updated),
        )
        worst = max(items, key=_severity, default=None)
        if worst is not None and _severity(worst) > 0:
            result.reason = worst.reason or worst.phase
            result.message = f"replica {worst.index}: {worst.message}" if worst.message else ""
        elif len(ready) < wanted:
            result.reason, result.message = PENDING, f"{len(ready)}/{wanted} replicas ready"
        return result


class _Replica:
    """One engine process and the supervisor coroutine that keeps it running."""

    def __init__(self, workload: _Workload, index: int, generation: int, plan: WorkloadPlan):
        self.workload = workload
        self.runtime = workload.runtime
        self.index = index
        self.generation = generation
        self.plan = plan
        self.template_hash = plan.template_hash()
        self.log_path = self.runtime.log_path(plan.key, index)
        self.phase = PENDING
        self.reason: str | None = None
        self.message = ""
        self.restarts = 0
        self.last_exit_code: int | None = None
        self.backoff_seconds: float | None = None
        self.port: int | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.token: str | None = None
        self.started_at = 0.0  # event-loop time of the current process' start
        self.ready_since: float | None = None
        self.longest_ready = 0.0  # longest ready stretch of the current process, in seconds
        self.was_ready = False  # this process was an endpoint at some point (drain it)
        self.supervisor: asyncio.Task[None] | None = None
        self.spawning: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return f"{self.plan.key} replica {self.index}"

    @property
    def address(self) -> str | None:
        if self.proc is None or self.proc.returncode is not None or self.port is None:
            return None
        return f"{LOCAL_HOST}:{self.port}"

    def endpoint(self) -> Endpoint:
        return Endpoint(
            address=self.address or "",
            labels={**self.plan.labels, REPLICA_LABEL: str(self.index)},
            workload=self.plan.key,
            replica=self.index,
            model_name=self.plan.model_name,
            backend=self.plan.backend,
        )

    def status(self) -> ReplicaStatus:
        return ReplicaStatus(
            index=self.index,
            phase=self.phase,
            reason=self.reason,
            message=self.message,
            restarts=self.restarts,
            pid=self.proc.pid if self.address else None,
            address=self.address,
            log_path=self.log_path,
            last_exit_code=self.last_exit_code,
            backoff_seconds=self.backoff_seconds,
            template_hash=self.template_hash,
        )

    def _set(self, phase: str, reason: str | None = None, message: str = "") -> None:
        if (phase, reason, message) == (self.phase, self.reason, self.message):
            return
        now = asyncio.get_running_loop().time()
        if phase == READY and self.phase != READY:
            self.ready_since = now
            self.was_ready = True
        elif phase != READY and self.ready_since is not None:
            self.longest_ready = max(self.longest_ready, now - self.ready_since)
            self.ready_since = None
        self.phase, self.reason, self.message = phase, reason, message
        self.workload.changed()

    # -- supervision -------------------------------------------------------------------------------

    def run(self) -> None:
        if self.supervisor is None or self.supervisor.done():
            self._set(PENDING, None, "checking the engine is installed")
            self.supervisor = asyncio.get_running_loop().create_task(self._supervise())

    async def _supervise(self) -> None:
        local = self.plan.local
        assert local is not None
        env = {**os.environ, **self.plan.env}
        crashes = 0  # consecutive, for the back-off
        try:
            while True:
                missing = await missing_engine(engine_argv(local.argv), env)
                if missing:
                    hint = local.install_hint or f"install the {self.plan.backend} engine"
                    self._set(FAILED, ENGINE_NOT_INSTALLED, f"{missing}. {hint}")
                    return
                self.spawning = asyncio.get_running_loop().create_task(self._spawn(env))
                try:
                    await asyncio.shield(self.spawning)
                except FileNotFoundError as err:
                    hint = local.install_hint or f"install the {self.plan.backend} engine"
                    self._set(FAILED, ENGINE_NOT_INSTALLED, f"{err}. {hint}")
                    return
                except OSError as err:
                    reason, cause = CRASH_LOOP, f"the engine could not be started: {err}"
                else:
                    reason, cause = await self._watch()
                    if self.last_exit_code == ENGINE_MISSING_EXIT and not self.was_ready:
                        # A launcher (sh -c, llmplane's engine shims) found no engine: the
                        # shell's "command not found" status. Restarting cannot help.
                        hint = local.install_hint or f"install the {self.plan.backend} engine"
                        tail = _tail(self.log_path, 3)
                        self._set(FAILED, ENGINE_NOT_INSTALLED, f"{hint}. Engine log: {tail}")
                        return
                if self.longest_ready >= self.runtime.backoff_reset:
                    crashes = 0  # it ran well for a while: start the back-off over
                delay = min(self.runtime.backoff_base * 2**crashes, self.runtime.backoff_cap)
                crashes += 1
                self.backoff_seconds = delay
                self._set(PENDING, reason, self._crash_message(cause, delay))
                log.warning("%s: %s; restarting in %gs", self.name, cause, delay)
                await asyncio.sleep(delay)
                self.restarts += 1
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug here must not leave an unsupervised engine running
            log.exception("%s: supervisor failed", self.name)
            self._set(FAILED, "RuntimeError", f"the supervisor failed: {err!r}")
            if self.proc is not None:
                await stop_group(self.proc, self.proc.pid, self.runtime.stop_timeout)
                self._forget_process()

    async def _spawn(self, env: dict[str, str]) -> None:
        local = self.plan.local
        assert local is not None
        port = self.runtime.allocate_port(self.port)
        try:
            await self._start_process(env, port)
        except BaseException:
            self.runtime.release_port(port)
            raise

    async def _start_process(self, env: dict[str, str], port: int) -> None:
        local = self.plan.local
        assert local is not None
        argv = rewrite_argv(engine_argv(local.argv), port)
        token = uuid.uuid4().hex
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            log_file.write(
                f"--- llmplane {stamp}: starting {self.name} (restart {self.restarts}): "
                f"{' '.join(argv)}\n".encode()
            )
            log_file.flush()
            proc = await spawn(argv, {**env, TOKEN_ENV: token}, log_file)
        self.port, self.proc, self.token = port, proc, token
        self.longest_ready = 0.0
        self.was_ready = False
        self.started_at = asyncio.get_running_loop().time()
        self.runtime.table.add(
            ProcessRecord(
                pid=proc.pid,
                pgid=proc.pid,
                start_ticks=start_ticks(proc.pid),
                token=token,
                workload=self.plan.key,
                replica=self.index,
                argv=argv,
            )
        )
        self._set(STARTING, None, "waiting for the engine to answer its probes")

    async def _watch(self) -> tuple[str, str]:
        """Until the process exits or a startup/liveness probe gives up; returns why it ended.

        The process (group) is gone when this returns.
        """
        proc = self.proc
        assert proc is not None
        exited = asyncio.ensure_future(proc.wait())
        probing = asyncio.ensure_future(self._probe())
        try:
            await asyncio.wait({exited, probing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            probing.cancel()
            exited.cancel()
        if probing.done() and not probing.cancelled() and probing.exception() is None:
            reason, cause = probing.result()
            log.warning("%s: %s; stopping it", self.name, cause)
            self._set(NOT_READY, reason, f"{cause}; stopping the engine")
        elif probing.done() and not probing.cancelled():
            raise probing.exception()  # type: ignore[misc]
        else:
            reason, cause = CRASH_LOOP, ""
            self._set(NOT_READY, None, "the engine exited")
        code = await stop_group(proc, proc.pid, self.runtime.stop_timeout)
        self.last_exit_code = code
        self._forget_process()
        return reason, cause or f"the engine {_describe_exit(code)}"

    def _forget_process(self) -> None:
        if self.token is not None:
            self.runtime.table.discard(self.token)
        self.runtime.release_port(self.port)
        self.proc = None
        self.token = None

    async def _probe(self) -> tuple[str, str]:
        """Run the probes; returns only when the process must be restarted: (reason, why)."""
        plan, loop = self.plan, asyncio.get_running_loop()
        started = self.started_at
        if plan.startup_probe is not None:
            self._set(STARTING, None, "waiting for the startup probe")
            failure = await self._startup(plan.startup_probe, started)
            if failure:
                return STARTUP_PROBE_FAILED, failure
        after_startup = loop.time()
        checks = []
        if plan.readiness_probe is not None:
            self._set(STARTING, None, "waiting for the readiness probe")
            checks.append(self._readiness(plan.readiness_probe, started, after_startup))
        else:
            self._set(READY)
        if plan.liveness_probe is not None:
            checks.append(self._liveness(plan.liveness_probe, started, after_startup))
        if not checks:
            await asyncio.Event().wait()  # nothing to watch but the process itself
        tasks = [asyncio.ensure_future(c) for c in checks]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            return next(iter(done)).result()
        finally:
            for t in tasks:
                t.cancel()

    def _url(self, probe: HttpProbe) -> str:
        local = self.plan.local
        path = (local.health_path if local and local.health_path else None) or probe.path or "/"
        if not path.startswith("/"):
            path = "/" + path
        # Whatever port the plan names (the container's 8080), the engine listens on ours.
        return f"http://{LOCAL_HOST}:{self.port}{path}"

    async def _check(self, probe: HttpProbe) -> tuple[bool, str]:
        timeout = probe.timeout_seconds if probe.timeout_seconds > 0 else 1
        return await probes.http_ok(self.runtime.session, self._url(probe), timeout)

    async def _startup(self, probe: HttpProbe, started: float) -> str | None:
        successes = failures = 0
        async for _ in probes.schedule(probe, started, started):
            ok, detail = await self._check(probe)
            if ok:
                successes, failures = successes + 1, 0
                if successes >= max(probe.success_threshold, 1):
                    return None
            else:
                successes, failures = 0, failures + 1
                self._set(STARTING, None, f"startup probe: {detail}")
                if failures >= max(probe.failure_threshold, 1):
                    return f"startup probe failed {failures} times ({detail})"
        return None  # unreachable: the schedule never ends

    async def _readiness(
        self, probe: HttpProbe, started: float, not_before: float
    ) -> tuple[str, str]:
        successes = failures = 0
        async for _ in probes.schedule(probe, started, not_before):
            ok, detail = await self._check(probe)
            if ok:
                successes, failures = successes + 1, 0
                if successes >= max(probe.success_threshold, 1):
                    self._set(READY)
            else:
                successes, failures = 0, failures + 1
                if self.phase == READY:
                    if failures >= max(probe.failure_threshold, 1):
                        self._set(NOT_READY, None, f"readiness probe: {detail}")
                else:
                    self._set(self.phase, None, f"readiness probe: {detail}")
        return "", ""  # unreachable

    async def _liveness(
        self, probe: HttpProbe, started: float, not_before: float
    ) -> tuple[str, str]:
        failures = 0
        async for _ in probes.schedule(probe, started, not_before):
            ok, detail = await self._check(probe)
            failures = 0 if ok else failures + 1
            if failures >= max(probe.failure_threshold, 1):
                return LIVENESS_PROBE_FAILED, f"liveness probe failed {failures} times ({detail})"
        return "", ""  # unreachable

    def _crash_message(self, cause: str, delay: float) -> str:
        lines = [f"back-off {delay:g}s restarting failed engine: {cause}"]
        if self.last_exit_code is not None:
            lines[0] += f"; last exit code {self.last_exit_code}"
        tail = _tail(self.log_path, LOG_TAIL_LINES)
        if tail:
            lines.append(f"last lines of {self.log_path}:\n{tail}")
        hint = self.plan.local.install_hint if self.plan.local else None
        if hint and ("ModuleNotFoundError" in tail or "No module named" in tail):
            lines.append(hint)
        return "\n".join(lines)

    # -- termination -------------------------------------------------------------------------------

    def begin_termination(self) -> None:
        self._set(TERMINATING, None, "draining" if self.was_ready else "stopping")

    async def terminate(self) -> None:
        """Stop supervising, drain (bounded by the grace period), SIGTERM, SIGKILL after 10 s."""
        if self.supervisor is not None:
            self.supervisor.cancel()
            await asyncio.wait([self.supervisor])
        if self.spawning is not None:
            await asyncio.wait([self.spawning])  # a start under way completes, then stops
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None and self.was_ready and self.address:
            await self._drain(self.address, self.plan.termination_grace_seconds)
        self._set(TERMINATING, None, "stopping")
        self.last_exit_code = await stop_group(proc, proc.pid, self.runtime.stop_timeout)
        self._forget_process()

    async def _drain(self, address: str, grace: float) -> None:
        """Wait until nothing is in flight to ``address``, at most ``grace`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(grace, 0)
        inflight = self.runtime.inflight
        proc = self.proc
        while proc is not None and proc.returncode is None and loop.time() < deadline:
            if inflight is not None:
                try:
                    running: int | None = inflight(address)
                except Exception:
                    log.exception("inflight callback failed for %s", address)
                    return
                pause = 0.1
            else:
                running = await probes.running_requests(
                    self.runtime.session, address, min(1.0, max(deadline - loop.time(), 0.05))
                )
                pause = 0.25
            if not running:
                return
            self._set(TERMINATING, None, f"draining {running} in-flight request(s)")
            await asyncio.sleep(min(pause, max(deadline - loop.time(), 0)))
        if proc is not None and proc.returncode is None and loop.time() >= deadline:
            log.warning("%s: grace period of %gs over with requests in flight", self.name, grace)


ENGINE_MISSING_EXIT = 127  # what shells return for "command not found"


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _tail(path: Path, lines: int, max_bytes: int = 8192) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - max_bytes, 0))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").rstrip("\n")
    return "\n".join(text.splitlines()[-lines:])
