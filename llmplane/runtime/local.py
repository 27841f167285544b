"""The embedded runtime: realise a WorkloadPlan as supervised engine processes on this machine.

One :class:`LocalRuntime` serves every workload of ``llmplane up``. A workload is a set of
replicas (``workload.py``); each replica is one engine process watched by its own supervisor
coroutine (``replica.py``, with its state machine); statuses and endpoints are ``status.py``'s
types. Process groups, PDEATHSIG and the record that lets the next run kill leftovers live in
``processes.py``; ports and argv in ``launch.py``; probe schedules in ``probes.py``.
Everything runs on the caller's event loop; nothing here blocks it for longer than a small file
write or a /proc scan.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import aiohttp

from llmplane.controlplane.plan import WorkloadPlan
from llmplane.runtime import capacity, logs
from llmplane.runtime.endpoint import Endpoint
from llmplane.runtime.launch import free_port
from llmplane.runtime.placement import NVIDIA_GPU, DevicePool, detect_nvidia_gpus
from llmplane.runtime.processes import ProcessTable, kill_leftovers
from llmplane.runtime.status import READY, WorkloadStatus
from llmplane.runtime.workload import Workload
from llmplane.shortage import ShortageLog

log = logging.getLogger(__name__)


class StateDirInUse(RuntimeError):
    """Another runtime holds the state directory's lock (one ``up`` per state directory)."""


class LocalRuntime:
    """Supervised local engine processes for every workload of one ``llmplane up``.

    ``state_dir`` holds ``logs/<ns>/<name>/replica-<i>.log`` and ``runtime/processes.json``.
    ``on_change()`` is called (on the event loop) whenever endpoints or statuses change.
    ``inflight(address)`` is the gateway's count of requests in flight to an endpoint; draining
    waits for it to reach 0. Without it, draining waits for the engine's running-requests gauge
    (``vllm:num_requests_running``) when ``/metrics`` answers. ``handover(address)``: at the end
    of a drain's grace period, the gateway moves the streams still running on the replica to
    other ones (stream migration) and says how many; the drain then waits a few seconds more.

    ``backoff_base``/``backoff_cap``: restart delays ``base * 2**n`` capped at ``cap`` seconds,
    back to ``base`` once a replica has been ready for ``backoff_reset`` seconds.
    ``stop_timeout``: seconds between SIGTERM and SIGKILL.
    ``log_max_bytes``: engine logs are rotated past this size (checked every
    ``log_check_interval`` seconds, see ``logs.py``).
    ``gpus``: the host's NVIDIA GPUs (``--gpus``); None asks ``nvidia-smi``. Replicas get
    distinct devices per their flavors' limits (``placement.py``).
    ``max_replicas``: the most replicas one workload runs, whatever its plan asks;
    ``start_concurrency``: engines started at once (spawned, not yet Ready), one fork at a
    time. None: ``capacity.py``'s defaults.
    """

    def __init__(
        self,
        state_dir: Path,
        on_change: Callable[[], None] | None = None,
        inflight: Callable[[str], int] | None = None,
        handover: Callable[[str], int] | None = None,
        *,
        backoff_base: float = 10.0,
        backoff_cap: float = 300.0,
        backoff_reset: float = 600.0,
        stop_timeout: float = 10.0,
        log_max_bytes: int = logs.DEFAULT_MAX_BYTES,
        log_check_interval: float = logs.CHECK_INTERVAL,
        gpus: Sequence[str] | None = None,
        max_replicas: int | None = None,
        start_concurrency: int | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.on_change = on_change
        self.inflight = inflight
        self.handover = handover
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.backoff_reset = backoff_reset
        self.stop_timeout = stop_timeout
        self.log_max_bytes = log_max_bytes
        self.log_check_interval = log_check_interval
        self._log_keeper: asyncio.Task[None] | None = None
        self.devices = DevicePool(
            {NVIDIA_GPU: list(gpus) if gpus is not None else detect_nvidia_gpus()}
        )
        self.max_replicas = max_replicas if max_replicas is not None else capacity.replica_ceiling()
        self.starting = asyncio.Semaphore(start_concurrency or capacity.start_concurrency())
        self.forking = asyncio.Lock()  # one fork at a time: each blocks the event loop
        self.table = ProcessTable(self.state_dir / "runtime" / "processes.json")
        self._workloads: dict[str, Workload] = {}
        self._removing: dict[str, Workload] = {}
        self._session: aiohttp.ClientSession | None = None
        self._lock_file: IO[bytes] | None = None
        self._ports: set[int] = set()  # allocated to replicas of this runtime
        self._start_lock = asyncio.Lock()
        self._started = False
        self._closed = False
        self._shortage = ShortageLog(
            log,
            "llmplane is short of its own resources (%s): probes that cannot be made count "
            "as unknown and no engine is stopped for them; see docs/security.md (open files)",
            "llmplane has its resources back: probing engines as usual",
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the state directory and stop engine processes left over from a previous run."""
        async with self._start_lock:
            if self._closed:
                raise RuntimeError("the local runtime has been shut down")
            if not self._started:
                await self._take_state_dir()

    @property
    def closed(self) -> bool:
        """Shutdown has begun: nothing may start an engine process any more."""
        return self._closed

    async def _take_state_dir(self) -> None:
        runtime_dir = self.state_dir / "runtime"
        runtime_dir.mkdir(parents=True, exist_ok=True)
        lock = open(runtime_dir / "lock", "ab")  # noqa: SIM115 (held for the runtime's lifetime)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise StateDirInUse(
                f"another llmplane runtime is running with the state directory {self.state_dir}: "
                "stop it first, or pass --state-dir DIR"
            ) from None
        self._lock_file = lock
        leftovers = await kill_leftovers(self.table.load(), self.stop_timeout)
        if leftovers:
            log.warning("stopped leftover engine processes %s", leftovers)
        self.table.clear()
        self._log_keeper = asyncio.get_running_loop().create_task(
            logs.keep_rotated(self.state_dir / "logs", self.log_max_bytes, self.log_check_interval)
        )
        self._started = True

    async def shutdown(self) -> None:
        """Drain and stop every replica of every workload (concurrently), then let go.

        Once it begins no replica starts a process; any process still recorded after the
        replicas stopped (a start that raced the stop) is killed with its group before the
        record is cleared.
        """
        self._closed = True
        async with self._start_lock:  # a start() under way finishes first
            keys = set(self._workloads) | set(self._removing)
            await asyncio.gather(*(self.remove(k) for k in keys))
            if self._started and self.table.records():
                left = await kill_leftovers(self.table.records(), self.stop_timeout)
                if left:
                    log.error("killed engine processes that outlived their replicas: %s", left)
        if self._log_keeper is not None:
            self._log_keeper.cancel()
            await asyncio.wait([self._log_keeper])
            self._log_keeper = None
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
        if self._closed:  # shutdown() began while start() took the state directory
            raise RuntimeError("the local runtime has been shut down")
        workload = self._workloads.get(plan.key)
        if workload is None:
            workload = self._workloads[plan.key] = Workload(self, plan)
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

    def short_of(self, what: str) -> None:
        """llmplane itself lacks a resource (EMFILE, ENOMEM ... while probing or starting an
        engine). No engine is blamed for it; it is logged once per burst (``ShortageLog``)."""
        self._shortage.short(what)

    def not_short(self) -> None:
        """A probe could be made again."""
        self._shortage.back()

    def release_port(self, port: int | None) -> None:
        self._ports.discard(port)  # type: ignore[arg-type]

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # A new connection per call: engines restart on the same port. (Probes use
            # probes.http_ok, which needs no session.)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True, limit=0)
            )
        return self._session
