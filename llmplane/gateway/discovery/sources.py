"""The ``Discovery`` protocol and the sources that need no watch of their own (static, the
embedded runtime's, several as one); the watching ones are in ``pods`` and ``store_endpoints``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from llmplane.runtime.base import Runtime
from llmplane.runtime.endpoint import Endpoint

Callback = Callable[[], None]


@runtime_checkable
class Discovery(Protocol):
    def endpoints(self) -> list[Endpoint]: ...

    def subscribe(self, callback: Callback) -> None: ...


@runtime_checkable
class Following(Protocol):
    """A source that follows a watch of its own: the gateway starts and closes it."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class Subscribers:
    """The subscriber list every source keeps: ``_changed()`` calls them all."""

    def __init__(self) -> None:
        self._callbacks: list[Callback] = []

    def subscribe(self, callback: Callback) -> None:
        self._callbacks.append(callback)

    def _changed(self) -> None:
        for callback in list(self._callbacks):
            callback()


class StaticDiscovery(Subscribers):
    """A list of endpoints given by the caller; ``set()`` replaces it and notifies."""

    def __init__(self, endpoints: Iterable[Endpoint] = ()) -> None:
        super().__init__()
        self._endpoints = list(endpoints)

    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    def set(self, endpoints: Iterable[Endpoint]) -> None:
        self._endpoints = list(endpoints)
        self._changed()

    def remove(self, address: str) -> None:
        self.set([e for e in self._endpoints if e.address != address])


class RuntimeDiscovery(Subscribers):
    """The embedded runtime's ready replicas; the runtime calls ``notify`` when they change."""

    def __init__(self, runtime: Runtime | None = None) -> None:
        super().__init__()
        self.runtime = runtime

    def endpoints(self) -> list[Endpoint]:
        if self.runtime is None:
            return []
        return list(self.runtime.endpoints())

    def notify(self, *_args: Any, **_kwargs: Any) -> None:
        self._changed()


class CombinedDiscovery(Subscribers):
    """Several sources as one (the first source wins for a duplicated address)."""

    def __init__(self, *sources: Discovery) -> None:
        super().__init__()
        self.sources = sources
        for source in sources:
            source.subscribe(self._changed)

    def endpoints(self) -> list[Endpoint]:
        seen: dict[str, Endpoint] = {}
        for source in self.sources:
            for endpoint in source.endpoints():
                seen.setdefault(endpoint.address, endpoint)
        return list(seen.values())
