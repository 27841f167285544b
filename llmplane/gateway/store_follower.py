"""Follow a set of kinds in the store: a local cache kept current by list + watch.

``StoreFollower`` lists the kinds once, then watches from the store's resourceVersion; every
change marks the cache dirty and one callback runs after ``debounce`` seconds, however many
events arrived (a burst of applies rebuilds the routing table once). On ``Expired`` it lists
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from llmplane.store.base import Expired, Store

log = logging.getLogger("llmplane.gateway")

Key = tuple[str, str, str]


def _key(obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace") or "", meta["name"])


class StoreFollower:
    def __init__(
        self,
        store: Store,
        kinds: Iterable[str],
        on_change: Callable[[dict[Key, dict[str, Any]]], None],
        debounce: float = 0.005,
    ) -> None:
        self.store = store
        self.kinds = frozenset(kinds)
        self.on_change = on_change
        self.debounce = debounce
        self.objects: dict[Key, dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None
        self._scheduled: asyncio.Handle | None = None
        self._since: str | None = None
        self.load()

    def load(self) -> None:
        """List every followed kind now (synchronously) and notify."""
        version = getattr(self.store, "resource_version", None)  # read first: watch from it
        self._since = version() if callable(version) else None
        self.objects = {_key(o): o for kind in sorted(self.kinds) for o in self.store.list(kind)}
        self.on_change(dict(self.objects))

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._follow(), name="gateway-store-watch")

    async def close(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def _dirty(self) -> None:
        if self._scheduled is None:
            loop = asyncio.get_running_loop()
            self._scheduled = loop.call_later(self.debounce, self._fire)

    def _fire(self) -> None:
        self._scheduled = None
        try:
            self.on_change(dict(self.objects))
        except Exception:
            log.exception("rebuilding from the store failed")

    async def _follow(self) -> None:
        while True:
            try:
                if self._since is None:
                    self.objects = {}  # the watch replays every object as ADDED
                watch = self.store.watch(None, None, self._since)
                async with contextlib.aclosing(watch):
                    async for event in watch:
                        obj = event.object
                        if obj.get("kind") not in self.kinds:
                            continue
                        if event.type == "DELETED":
                            self.objects.pop(_key(obj), None)
                        else:
                            self.objects[_key(obj)] = obj
                        self._dirty()
            except asyncio.CancelledError:
                raise
            except Expired:
                self.load()
            except Exception:
                log.exception("watching the store failed; listing again in 1 s")
                await asyncio.sleep(1.0)
                self.load()
