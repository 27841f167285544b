"""One replica: an engine process, the coroutine that supervises it, its probes and its drain.

    Pending -> Starting -> Ready <-> NotReady
       ^          |          |
       +-- back-off (CrashLoopBackOff; Restarting if it was Ready) <- exit / probe failure
    any -> Terminating (removed from endpoints, drained: its streams handed over to other
           replicas after the grace period; SIGTERM, SIGKILL after 10 s)
    Pending -> Failed (EngineNotInstalled: no restarts until the next realise())

Probes follow Kubernetes semantics (``probes.py``); process groups and the leftover record are
in ``processes.py``; ports and argv in ``launch.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from llmplane.controlplane.plan import PLAYGROUND_LABEL, REPLICA_LABEL, HttpProbe, WorkloadPlan
from llmplane.runtime import probes
from llmplane.runtime.endpoint import Endpoint, max_num_seqs, priority_scheduling
from llmplane.runtime.launch import (
    LOCAL_HOST,
    engine_argv,
    kv_events_argv,
    kv_socket_dir,
    missing_engine,
    rewrite_argv,
)
from llmplane.runtime.placement import UNSCHEDULABLE, FlavorOption, Placement
from llmplane.runtime.processes import (
    TOKEN_ENV,
    ProcessRecord,
    signal_group,
    spawn,
    start_ticks,
    stop_group,
)
from llmplane.runtime.sockets import beyond_loopback
from llmplane.runtime.status import (
    CRASH_LOOP,
    ENGINE_NOT_INSTALLED,
    FAILED,
    LISTENS_BEYOND_LOOPBACK,
    LIVENESS_PROBE_FAILED,
    NOT_READY,
    PENDING,
    READY,
    RESTARTING,
    SHORT_OF_RESOURCES,
    STARTING,
    STARTUP_PROBE_FAILED,
    TERMINATING,
    ReplicaStatus,
)
from llmplane.shortage import own_shortage

if TYPE_CHECKING:
    from llmplane.runtime.workload import Workload

log = logging.getLogger("llmplane.runtime.local")

LOG_TAIL_LINES = 10  # of the engine log, in a crash-loop message
ENGINE_MISSING_EXIT = 127  # what shells return for "command not found"
SHORTAGE_RETRY = 2.0  # seconds before starting again after llmplane's own shortage
HANDOVER_WAIT = 3.0  # seconds for handed-over streams to leave a drained replica


class Replica:
    """One engine process and the supervisor coroutine that keeps it running."""

    def __init__(self, workload: Workload, index: int, generation: int, plan: WorkloadPlan):
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
        self.placement: Placement | None = None  # accelerators held while a process runs
        self.token: str | None = None
        self.started_at = 0.0  # event-loop time of the current process' start
        self.ready_since: float | None = None
        self.longest_ready = 0.0  # longest ready stretch of the current process, in seconds
        self.was_ready = False  # this process was an endpoint at some point (drain it)
        self.supervisor: asyncio.Task[None] | None = None
        self.spawning: asyncio.Task[None] | None = None
        self.stopping = False  # terminating: nothing may start a process for this replica again
        self.slot = False  # holds one of the runtime's start slots (spawned, not yet Ready)
        self.kv_events = self.kv_events_replay = ""  # where its engine publishes KV events

    @property
    def name(self) -> str:
        return f"{self.plan.key} replica {self.index}"

    @property
    def address(self) -> str | None:
        if self.proc is None or self.proc.returncode is not None or self.port is None:
            return None
        return f"{LOCAL_HOST}:{self.port}"

    def endpoint(self) -> Endpoint:
        plan = self.plan
        return Endpoint(
            address=self.address or "",
            labels={**plan.labels, REPLICA_LABEL: str(self.index)},
            model_name=plan.model_name,
            backend=plan.backend,
            namespace=plan.namespace or "default",
            engine=(plan.backend or "vllm").lower(),
            fixed_port=True,  # every process has a port of its own
            workload=plan.key,
            replica=self.index,
            max_num_seqs=max_num_seqs([*plan.command, *plan.args]),
            priority_scheduling=priority_scheduling([*plan.command, *plan.args]),
            model_path=next((m.path for m in plan.models if m.role != "draft"), ""),
            kv_events=self.kv_events,
            kv_events_replay=self.kv_events_replay,
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
        if phase == READY:
            self._give_slot()
        self.workload.changed()

    async def _take_slot(self) -> None:
        """Wait for one of the runtime's start slots (``capacity.start_concurrency``)."""
        starting = self.runtime.starting
        if starting.locked():
            self._set(PENDING, None, "waiting to start: other engines of this machine are starting")
        await starting.acquire()
        self.slot = True

    def _give_slot(self) -> None:
        if self.slot:
            self.slot = False
            self.runtime.starting.release()

    # -- supervision -------------------------------------------------------------------------------

    def run(self) -> None:
        if self._must_stop():
            return
        if self.supervisor is None or self.supervisor.done():
            self._set(PENDING, None, "checking the engine is installed")
            self.supervisor = asyncio.get_running_loop().create_task(self._supervise())

    async def _supervise(self) -> None:
        local = self.plan.local
        assert local is not None
        env = {**os.environ, **self.plan.env}
        crashes = 0  # consecutive, for the back-off
        try:
            # Checked at every step that leads to a start, not only through cancellation: a
            # cancellation can be lost (Python 3.11's wait_for), and a supervisor that carries on
            # after terminate() would start an engine nobody stops.
            while not self._must_stop():
                missing = await missing_engine(engine_argv(local.argv), env)
                if missing:
                    hint = local.install_hint or f"install the {self.plan.backend} engine"
                    self._set(FAILED, ENGINE_NOT_INSTALLED, f"{missing}. {hint}")
                    return
                placement = await self._place()
                if not self._must_stop():
                    await self._take_slot()
                if self._must_stop():
                    self._release_devices()
                    return
                self.spawning = asyncio.get_running_loop().create_task(
                    self._spawn({**env, **placement.env()})
                )
                try:
                    await asyncio.shield(self.spawning)
                except FileNotFoundError as err:
                    hint = local.install_hint or f"install the {self.plan.backend} engine"
                    self._set(FAILED, ENGINE_NOT_INSTALLED, f"{err}. {hint}")
                    return
                except OSError as err:
                    if own_shortage(err):  # ours, not the engine's: no crash counted
                        self._give_slot()
                        self.runtime.short_of(f"starting {self.name}: {err}")
                        self._set(
                            PENDING,
                            SHORT_OF_RESOURCES,
                            f"llmplane could not start the engine ({err}); "
                            f"trying again in {SHORTAGE_RETRY:g}s",
                        )
                        await asyncio.sleep(SHORTAGE_RETRY)
                        continue
                    reason, cause = CRASH_LOOP, f"the engine could not be started: {err}"
                else:
                    reason, cause = await self._watch()
                    if self._must_stop():
                        return
                    if reason == LISTENS_BEYOND_LOOPBACK:
                        self._set(FAILED, reason, cause)
                        return
                    if self.last_exit_code == ENGINE_MISSING_EXIT and not self.was_ready:
                        # A launcher (sh -c, llmplane's engine shims) found no engine: the
                        # shell's "command not found" status. Restarting cannot help.
                        hint = local.install_hint or f"install the {self.plan.backend} engine"
                        tail = _tail(self.log_path, 3)
                        self._set(FAILED, ENGINE_NOT_INSTALLED, f"{hint}. Engine log: {tail}")
                        return
                self._give_slot()  # the process is gone: another replica may start
                if self.longest_ready >= self.runtime.backoff_reset:
                    crashes = 0  # it ran well for a while: start the back-off over
                delay = min(self.runtime.backoff_base * 2**crashes, self.runtime.backoff_cap)
                crashes += 1
                self.backoff_seconds = delay
                if self.was_ready:  # it served until now: a restart, not a failing engine
                    reason = RESTARTING
                self._set(PENDING, reason, self._crash_message(cause, delay))
                log.warning("%s: %s; restarting in %gs", self.name, cause, delay)
                await asyncio.sleep(delay)
                if self._must_stop():
                    return
                self.restarts += 1
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug here must not leave an unsupervised engine running
            log.exception("%s: supervisor failed", self.name)
            self._set(FAILED, "RuntimeError", f"the supervisor failed: {err!r}")
            if self.proc is not None:
                await stop_group(self.proc, self.proc.pid, self.runtime.stop_timeout)
                self._forget_process()
        finally:
            self._give_slot()  # however it ended

    def _must_stop(self) -> bool:
        return self.stopping or self.runtime.closed

    async def _spawn(self, env: dict[str, str]) -> None:
        local = self.plan.local
        assert local is not None
        if self._must_stop():
            self._release_devices()
            return
        port = self.runtime.allocate_port(self.port)
        try:
            await self._start_process(env, port)
        except BaseException:
            self.runtime.release_port(port)
            self._release_devices()
            raise

    async def _place(self) -> Placement:
        """Accelerators for the next process: the first flavor whose devices are free; waits
        (Pending, Unschedulable) until another replica releases some."""
        pool = self.runtime.devices
        options = [
            FlavorOption(o.get("name"), o.get("limits") or {}) for o in self.plan.flavor_options
        ] or [FlavorOption(None, self.plan.resources.get("limits") or {})]
        while True:
            result = pool.place(options)
            if isinstance(result, Placement):
                self.placement = result
                return result
            self._set(PENDING, UNSCHEDULABLE, f"waiting for free accelerators: {result}")
            await pool.wait_released()

    def _release_devices(self) -> None:
        self.runtime.devices.release(self.placement)
        self.placement = None

    async def _start_process(self, env: dict[str, str], port: int) -> None:
        local = self.plan.local
        assert local is not None
        argv = rewrite_argv(engine_argv(local.argv), port)
        namespace, _, name = self.plan.key.partition("/")
        argv, self.kv_events, self.kv_events_replay = kv_events_argv(
            argv,
            (self.plan.backend or "vllm").lower(),
            kv_socket_dir(self.runtime.state_dir),
            f"{namespace}-{name}-{self.index}"[-48:],
        )
        token = uuid.uuid4().hex
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab", buffering=0) as log_file:  # unbuffered: nothing at close
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            try:
                log_file.write(
                    f"--- llmplane {stamp}: starting {self.name} (restart {self.restarts}): "
                    f"{' '.join(argv)}\n".encode()
                )
            except OSError as err:  # a full disk: the engine may still run; say so once here
                log.warning("%s: cannot write to %s: %s", self.name, self.log_path, err)
            async with self.runtime.forking:  # each fork blocks the loop: one at a time,
                proc = await spawn(argv, {**env, TOKEN_ENV: token}, log_file)
                await asyncio.sleep(0)  # and the gateway's requests answered in between
        try:
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
        except BaseException:  # unrecorded (out of descriptors?): no process may outlive that
            signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
            with contextlib.suppress(OSError):
                self.runtime.table.discard(token)
            raise
        self.port, self.proc, self.token = port, proc, token
        self.longest_ready = 0.0
        self.was_ready = False
        self.started_at = asyncio.get_running_loop().time()
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
        self._release_devices()
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
            if exposed := self._exposed():
                return LISTENS_BEYOND_LOOPBACK, exposed
        after_startup = loop.time()
        checks = []
        if plan.readiness_probe is not None:
            self._set(STARTING, None, "waiting for the readiness probe")
            checks.append(self._readiness(plan.readiness_probe, started, after_startup))
        elif exposed := self._exposed():
            return LISTENS_BEYOND_LOOPBACK, exposed
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

    def _exposed(self) -> str | None:
        """Why the engine must not serve: it listens beyond loopback (checked before it first
        becomes Ready, so no request ever reaches an exposed engine); None when it does not.

        Only the process llmplane started is checked (the one serving HTTP); the sockets its
        own worker processes open among themselves are the engine's business.
        """
        assert self.proc is not None
        addresses = beyond_loopback(self.proc.pid)
        if not addresses:
            return None
        return (
            f"the engine listens on {', '.join(addresses)}, beyond loopback; a local engine "
            f"must listen on {LOCAL_HOST} only (llmplane passes --host {LOCAL_HOST}): remove "
            "whatever makes it bind elsewhere (an option, an environment variable, a config "
            "file) from the BackendRuntime or Playground; not restarted until then"
        )

    def _url(self, probe: HttpProbe) -> str:
        local = self.plan.local
        path = (local.health_path if local and local.health_path else None) or probe.path or "/"
        if not path.startswith("/"):
            path = "/" + path
        # Whatever port the plan names (the container's 8080), the engine listens on ours.
        return f"http://{LOCAL_HOST}:{self.port}{path}"

    async def _check(self, probe: HttpProbe) -> tuple[bool | None, str]:
        """One attempt: True, False, or None when llmplane lacked the resources to ask (the
        callers count it neither way: an engine is never blamed for our own shortage)."""
        timeout = probe.timeout_seconds if probe.timeout_seconds > 0 else 1
        ok, detail = await probes.http_ok(self._url(probe), timeout)
        if ok is None:
            self.runtime.short_of(f"probing {self.name}: {detail}")
        else:
            self.runtime.not_short()
        return ok, detail

    async def _startup(self, probe: HttpProbe, started: float) -> str | None:
        successes = failures = 0
        async for counted in probes.schedule(probe, started, started, hurry=lambda: True):
            ok, detail = await self._check(probe)
            if ok is None:
                continue
            if ok:
                successes, failures = successes + 1, 0
                if successes >= max(probe.success_threshold, 1):
                    return None
            else:
                successes, failures = 0, failures + counted
                self._set(STARTING, None, f"startup probe: {detail}")
                if failures >= max(probe.failure_threshold, 1):
                    return f"startup probe failed {failures} times ({detail})"
        return None  # unreachable: the schedule never ends

    async def _readiness(
        self, probe: HttpProbe, started: float, not_before: float
    ) -> tuple[str, str]:
        successes = failures = 0
        hurry = lambda: self.phase != READY  # noqa: E731
        async for counted in probes.schedule(
            probe, started, not_before, hurry=hurry, phase=probes.spread(probe)
        ):
            ok, detail = await self._check(probe)
            if ok is None:
                continue
            if ok:
                successes, failures = successes + 1, 0
                if successes >= max(probe.success_threshold, 1):
                    if self.phase != READY and (exposed := self._exposed()):
                        return LISTENS_BEYOND_LOOPBACK, exposed
                    self._set(READY)
            else:
                successes, failures = 0, failures + counted
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
        async for _ in probes.schedule(probe, started, not_before, phase=probes.spread(probe)):
            ok, detail = await self._check(probe)
            if ok is None:
                continue
            failures = 0 if ok else failures + 1
            if failures >= max(probe.failure_threshold, 1):
                return LIVENESS_PROBE_FAILED, f"liveness probe failed {failures} times ({detail})"
        return "", ""  # unreachable

    def _crash_message(self, cause: str, delay: float) -> str:
        what = "the engine stopped after serving" if self.was_ready else "the engine is failing"
        lines = [f"{what}: {cause}"]
        if self.last_exit_code is not None:
            lines[0] += f" (last exit code {self.last_exit_code})"
        lines[0] += f"; restarting in {delay:g}s; see `{logs_command(self.plan, self.index)}`"
        tail = _tail(self.log_path, LOG_TAIL_LINES)
        if tail:
            lines.append(f"last lines of {self.log_path}:\n{tail}")
        hint = self.plan.local.install_hint if self.plan.local else None
        if hint and ("ModuleNotFoundError" in tail or "No module named" in tail):
            lines.append(hint)
        return "\n".join(lines)

    # -- termination -------------------------------------------------------------------------------

    def begin_termination(self) -> None:
        self.stopping = True
        self._set(TERMINATING, None, "draining" if self.was_ready else "stopping")

    async def terminate(self) -> None:
        """Stop supervising, drain (bounded by the grace period), SIGTERM, SIGKILL after 10 s."""
        self.stopping = True
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
        """Wait until nothing is in flight to ``address``, at most ``grace`` seconds; then
        have the gateway hand the streams still running over to other replicas and wait for
        them to leave, at most ``HANDOVER_WAIT`` seconds more."""
        if await self._idle(address, grace):
            return
        handover = self.runtime.handover
        if handover is not None:
            try:
                moved = handover(address)
            except Exception:
                log.exception("handover callback failed for %s", address)
                moved = 0
            if moved:
                self._set(TERMINATING, None, f"handing {moved} stream(s) over to other replicas")
                if await self._idle(address, HANDOVER_WAIT):
                    return
        if self.proc is not None and self.proc.returncode is None:
            log.warning("%s: grace period of %gs over with requests in flight", self.name, grace)

    async def _idle(self, address: str, grace: float) -> bool:
        """Whether nothing is in flight to ``address`` (or the process is gone) within
        ``grace`` seconds (looked at once at least)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(grace, 0)
        inflight = self.runtime.inflight
        proc = self.proc
        while proc is not None and proc.returncode is None:
            if inflight is not None:
                try:
                    running: int | None = inflight(address)
                except Exception:
                    log.exception("inflight callback failed for %s", address)
                    return True
                pause = 0.1
            else:
                running = await probes.running_requests(
                    self.runtime.session, address, min(1.0, max(deadline - loop.time(), 0.05))
                )
                pause = 0.25
            if not running:
                return True
            if loop.time() >= deadline:
                return False
            self._set(TERMINATING, None, f"draining {running} in-flight request(s)")
            await asyncio.sleep(min(pause, max(deadline - loop.time(), 0)))
        return True


def logs_command(plan: WorkloadPlan, index: int) -> str:
    """The ``llmplane logs`` command that shows this replica's engine log."""
    kind = "pl" if PLAYGROUND_LABEL in plan.labels else "isvc"
    namespace = f" -n {plan.namespace}" if plan.namespace != "default" else ""
    replica = f" -r {index}" if index else ""
    return f"llmplane logs {kind}/{plan.name}{replica}{namespace}"


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
