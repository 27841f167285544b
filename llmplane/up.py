"""``llmplane up``: the embedded platform in one foreground process.

Store, controller, local runtime and gateway share one event loop. Ctrl-C or SIGTERM drains and
stops every engine process it started; a SIGKILLed ``up`` leaves nothing behind either (engines
die with it, and the next ``up`` reaps anything recorded but still alive).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmplane.aio import call_on
from llmplane.api.documents import parse_text, stored_form
from llmplane.gcpolicy import freeze_survivors
from llmplane.store.base import Store
from llmplane.store.sqlite import LOOP_BUSY_TIMEOUT

if TYPE_CHECKING:
    from llmplane.upworkers import UpWorkers

log = logging.getLogger("llmplane.up")
BUILTIN_LABEL = "llmplane.io/builtin"


def builtin_backends() -> list[dict[str, Any]]:
    """The BackendRuntimes shipped with llmplane, in wire form."""
    folder = resources.files("llmplane.engines") / "builtin"
    docs = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            docs += [stored_form(r) for r in parse_text(entry.read_text(), entry.name).resources]
    return docs


def install_builtins(store: Store) -> None:
    """Add or refresh the built-in BackendRuntimes; a user's own one of the same name wins."""
    for doc in builtin_backends():
        existing = store.get("BackendRuntime", doc["metadata"]["name"])
        if (
            existing is None
            or (existing["metadata"].get("labels") or {}).get(BUILTIN_LABEL) == "true"
        ):
            store.apply(doc)


class Platform:
    """Everything ``up`` runs; also used by tests to run the platform in-process."""

    def __init__(
        self,
        state_dir: Path,
        host: str = "127.0.0.1",
        port: int = 8000,
        gateway_config: Any = None,
        gpus: list[str] | None = None,
        autoscaler_config: Any = None,
        workers: UpWorkers | None = None,
    ):
        from llmplane.controlplane.autoscaler import AutoscalerConfig
        from llmplane.controlplane.controller import Controller
        from llmplane.runtime.local import LocalRuntime
        from llmplane.store.paths import open_store

        self.state_dir = state_dir
        self.host, self.port = host, port
        self.store = open_store(state_dir)
        self._listeners: list[Callable[[], None]] = []
        self.runtime = LocalRuntime(
            state_dir,
            on_change=self._changed,
            inflight=self._inflight,
            handover=self._handover,
            gpus=gpus,
        )
        self.controller = Controller(self.store, self.runtime, state_dir / "models")
        self.gateway: Any = None
        self.gateway_config = gateway_config
        self.autoscaler_config = autoscaler_config or AutoscalerConfig()
        self.autoscaler: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        # Gateway workers 1 .. N-1 in other processes (``upworkers.py``); this one is worker 0.
        self.workers = workers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asks: set[asyncio.Task[Any]] = set()  # handovers asked of the other workers

    def _changed(self) -> None:
        self.controller.kick()
        for listener in self._listeners:
            listener()

    def _inflight(self, address: str) -> int:
        # Before the gateway starts nothing can be in flight.
        return self.gateway.inflight(address) if self.gateway is not None else 0

    def _handover(self, address: str) -> int:
        """A drained replica's grace period is over: its streams move to other replicas, in
        this gateway and in workers 1 .. N-1; how many (with workers: what is in flight to it
        in all of them, the in-flight counts being shared)."""
        if self.gateway is None:
            return 0
        moved = self.gateway.handover(address)
        if self.workers is not None:
            seat = self.workers.seat
            for index in range(1, seat.workers):
                task = asyncio.get_running_loop().create_task(
                    seat.ask(index, b"handover", address.encode(), quiet=True)
                )
                self._asks.add(task)
                task.add_done_callback(self._asks.discard)
            moved = moved or self.gateway.inflight(address)
        return moved

    async def start(self) -> None:
        install_builtins(self.store)
        # From here on the store is written on the loop that serves the gateway: a write fails
        # fast when another process holds the lock, and the controllers retry on their next pass.
        self.store.set_busy_timeout(LOOP_BUSY_TIMEOUT)
        await self.runtime.start()
        self._tasks.append(asyncio.create_task(self.controller.run(), name="controller"))
        from llmplane.console.api import Console
        from llmplane.gateway.discovery import RuntimeDiscovery
        from llmplane.gateway.server import start_gateway

        discovery = RuntimeDiscovery(self.runtime)
        self._listeners.append(discovery.notify)
        seat = None
        if self.workers is not None:
            seat = self._seat(self.workers)
        self.gateway = await start_gateway(
            self.store,
            discovery,
            host=self.host,
            port=self.port,
            config=self.gateway_config,
            extensions=[lambda gateway: Console(gateway, self.runtime)],
            seat=seat,
            wake=self._wake,
        )
        self.port = self.gateway.port
        from llmplane.controlplane.autoscaler import Autoscaler
        from llmplane.runtime.usage import ProcessSignals

        self.autoscaler = Autoscaler(
            self.store,
            self.runtime,
            self.gateway.signals,
            self.autoscaler_config,
            extra=[ProcessSignals(self.runtime)],
        )
        self._tasks.append(asyncio.create_task(self.autoscaler.run(), name="autoscaler"))

    def _wake(self, workload: str) -> None:
        """A request waits for ``workload``, scaled to zero: the autoscaler looks now."""
        if self.autoscaler is not None:
            self.autoscaler.kick()

    def _seat(self, workers: UpWorkers) -> Any:
        """Worker 0's seat, answering the other workers: console requests and wake-ups; the
        runtime's replicas published to them now and on every change."""
        from llmplane.console.relay import answer

        self._loop = asyncio.get_running_loop()

        async def console(payload: bytes) -> bytes:
            return await answer(self.gateway.http if self.gateway else None, payload)

        async def wake(payload: bytes) -> bytes:
            if self.autoscaler is not None:
                self.autoscaler.kick()
            return b""

        workers.seat.handlers.update({b"http": console, b"wake": wake})
        self._listeners.append(self._publish_soon)
        self._publish()
        return workers.seat

    def _publish(self) -> None:
        assert self.workers is not None
        self.workers.board.publish(self.runtime.endpoints())

    def _publish_soon(self) -> None:
        """The runtime changed (perhaps told from one of its threads): publish in the loop."""
        call_on(self._loop, self._publish)

    def spawn(self, coroutine: Any, name: str) -> None:
        """Run ``coroutine`` until the platform stops (``up``'s terminal status)."""
        self._tasks.append(asyncio.get_running_loop().create_task(coroutine, name=name))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.workers is not None:
            self.workers.stop()  # they drain while this one does
        if self.gateway is not None:
            await self.gateway.close()
        if self.workers is not None:
            await self.workers.wait()  # every request done before the engines stop
        await self.runtime.shutdown()
        self.store.close()


async def run_up(
    state_dir: Path,
    files: list[dict[str, Any]],
    host: str,
    port: int,
    ready: Callable[[Platform], None],
    gateway_config: Any = None,
    gpus: list[str] | None = None,
    autoscaler_config: Any = None,
    workers: UpWorkers | None = None,
) -> None:
    platform = Platform(
        state_dir,
        host,
        port,
        gateway_config=gateway_config,
        gpus=gpus,
        autoscaler_config=autoscaler_config,
        workers=workers,
    )
    try:
        await platform.runtime.start()  # the state directory's lock, before anything is applied
    except BaseException:
        platform.store.close()
        raise
    if files:
        platform.store.apply_many(files)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await platform.start()
        if workers is not None:
            await workers.serving()
    except BaseException:
        await platform.stop()  # whatever did start must not outlive a failed start
        raise
    ready(platform)
    platform.spawn(freeze_survivors(), "gc")  # no 100 ms full collections under a fleet
    try:
        await stop.wait()
    finally:
        log.info("stopping: draining engines")
        await platform.stop()
