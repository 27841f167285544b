"""``llmplane up --workers N``: N gateway processes on ``up``'s port, one platform.

The ``up`` process stays the platform (store, controller, local runtime, autoscaler, console)
and is gateway worker 0. Before its event loop starts, ``UpWorkers`` binds the N listening
sockets (one ``SO_REUSEPORT`` group: worker i serves socket i), creates the workers' shared
memory (``gateway/workers/share.py``, plus the ``EndpointBoard`` the runtime's replica list is
published on) and forks one supervisor process, which forks workers 1 .. N-1 and replaces any
that dies, exactly as ``llmplane gateway --workers N``'s supervisor does (it is the same
``Supervisor``). Forking a supervisor early, rather than forking workers from the platform
later, keeps every fork away from a running event loop, the runtime's threads and its engine
processes.

A worker 1 .. N-1 is a gateway like ``llmplane gateway``'s over the same state directory,
except where ``up``'s own gateway reads the runtime: its endpoints come from the board, the
console's paths are relayed to worker 0 (``console/relay.py``), and a request its activator
holds wakes the autoscaler in worker 0 (a ``wake`` on worker 0's private socket); the
autoscaler reads every worker's requests and held counts (``GatewaySignals.refresh``).
In-flight counts, scraped metrics, token buckets, prefix picks, /metrics and the access log
are shared as for ``llmplane gateway --workers N``; each worker reports its request totals
once a second in shared memory for the console's charts (``Seat.report``).

Stopping: SIGTERM / SIGINT to ``up`` drains its own gateway and passes SIGTERM to the
supervisor, which drains the workers; the engines stop once every worker has. The supervisor
dies with ``up`` (``PR_SET_PDEATHSIG``), the workers with the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from llmplane.aio import Periodic, run
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.workers.board import BoardDiscovery, EndpointBoard
from llmplane.gateway.workers.share import Seat, Share, listen
from llmplane.gateway.workers.supervisor import Supervisor, fork

log = logging.getLogger("llmplane.up")

PLATFORM = 0


class UpWorkers:
    """Everything made before ``up``'s event loop for workers 1 .. N-1 (see the module
    docstring). ``seat`` is worker 0's place, the platform's gateway."""

    def __init__(
        self, workers: int, host: str, port: int, state_dir: Path, config: GatewayConfig
    ) -> None:
        socks = listen(host, port, workers)
        self.port = socks[0].getsockname()[1]
        self.share = Share(workers, socks)
        self.board = EndpointBoard()
        self.seat: Seat = self.share.seat(PLATFORM)
        self.grace = config.shutdown_grace
        self._ready_r, ready_w = os.pipe()

        def supervise() -> int:  # workers 1 .. N-1
            os.close(self._ready_r)
            socks[PLATFORM].close()  # the platform's own: it serves it, not us

            def worker(seat: Seat, ready: Any) -> int:
                run(_serve(seat, ready, host, state_dir, config, self.board))
                return 0

            supervisor = Supervisor(self.share, worker, self.grace, range(1, workers))
            return supervisor.run(lambda: os.write(ready_w, b"1"))

        self.pid = fork(supervise)
        os.close(ready_w)
        # The supervisor holds workers 1 .. N-1's sockets; were the platform to hold them too,
        # a dead supervisor's would stay in the group and take connections nobody accepts.
        self.share.keep_only(PLATFORM)
        self._exited = False

    async def serving(self) -> None:
        """Until workers 1 .. N-1 all serve; RuntimeError if their supervisor gave up."""
        got = await asyncio.to_thread(os.read, self._ready_r, 1)
        if not got:
            raise RuntimeError("the gateway workers failed to start (see above)")

    def stop(self) -> None:
        """SIGTERM to the supervisor: its workers drain."""
        if not self._exited:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)

    def _reaped(self) -> bool:
        if self._exited:
            return True
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid = self.pid
        self._exited = pid == self.pid
        return self._exited

    async def wait(self) -> None:
        """Until the supervisor has exited (it SIGKILLs a worker that drains too long)."""
        deadline = time.monotonic() + self.grace + 15.0
        while not self._reaped() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def close(self) -> None:
        """No supervisor or worker left (blocking; also after a failed start)."""
        self.stop()
        deadline = time.monotonic() + self.grace + 15.0
        while not self._reaped() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self._reaped():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self._exited = True
        with contextlib.suppress(OSError):
            os.close(self._ready_r)
        self.share.close()


async def _serve(
    seat: Seat, ready: Any, host: str, state_dir: Path, config: GatewayConfig, board: EndpointBoard
) -> None:
    """Worker ``seat`` (1 .. N-1): a gateway over the state directory's routes and the
    endpoints the platform publishes, until signalled or orphaned."""
    from llmplane.console.relay import ConsoleRelay
    from llmplane.console.stats import report_totals, totals
    from llmplane.gateway.cli import until_signalled
    from llmplane.gateway.observability import flush_access_log
    from llmplane.gateway.server import start_gateway
    from llmplane.gcpolicy import freeze_survivors
    from llmplane.store.paths import open_store

    store = open_store(state_dir)
    wakes: set[asyncio.Task[Any]] = set()

    def wake(workload: str) -> None:  # worker 0's autoscaler looks now
        task = asyncio.get_running_loop().create_task(
            seat.ask(PLATFORM, b"wake", workload.encode())
        )
        wakes.add(task)
        task.add_done_callback(wakes.discard)

    gateway = await start_gateway(
        store,
        BoardDiscovery(board),
        host,
        0,
        config,
        extensions=[lambda _gateway: ConsoleRelay(seat)],
        seat=seat,
        wake=wake,
    )
    # Our request totals for the console's charts (worker 0's console reads every report).
    report = report_totals(seat)
    reporter = Periodic(lambda: report(totals(gateway.metrics)), 1.0, "request totals report")
    reporter.start()
    ready()
    collector = asyncio.create_task(freeze_survivors(), name="gc")  # as worker 0 (run_up)
    try:
        await until_signalled(os.getppid())
    finally:
        collector.cancel()
        await reporter.close()
        await gateway.close()
        store.close()
        flush_access_log()
