"""The gateway's view of ready model-server endpoints and their labels.

A ``Discovery`` lists endpoints and calls subscribers when the list changes. Three sources:

- ``StaticDiscovery``: a fixed (or hand-updated) list, for tests and external servers;
- ``RuntimeDiscovery``: the embedded runtime's supervised processes (duck-typed);
- ``llmplane.gateway.external.StoreEndpoints``: ``Endpoint`` objects registered in the store
  (a vLLM already running elsewhere);

and ``CombinedDiscovery`` to merge several.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from llmplane.controlplane.plan import MODEL_NAME_LABEL

Callback = Callable[[], None]


@dataclass
class Endpoint:
    """One ready model-server replica.

    ``address`` is ``host:port`` (or a bare host that takes its port from the route). ``labels`` are pod-like labels (``llmaz.io/model-name`` ...)
    that ModelServer and InferencePool selectors match. ``model_name`` is the name the server
    serves (its ``--served-model-name``). ``fixed_port`` marks endpoints whose port is their own
    (the embedded runtime gives every process its own port), so ``workloadPort`` and
    ``targetPortNumber``, which name a pod's container port in Kubernetes, do not replace it.
    """

    address: str
    labels: dict[str, str] = field(default_factory=dict)
    model_name: str = ""
    backend: str = ""
    namespace: str = "default"
    engine: str = "vllm"
    fixed_port: bool = False

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0] or self.address

    def with_port(self, port: int | None) -> str:
        """The address to send inference to when a route names a port (a ModelServer's
        ``workloadPort``, an InferencePool's ``targetPortNumber``): it replaces the port unless
        the endpoint's port is its own; an address without a port takes it (8080 if none)."""
        host, sep, own = self.address.rpartition(":")
        if not sep or not own.isdigit():
            return f"{self.address}:{port or 8080}"
        if port is None or self.fixed_port:
            return self.address
        return f"{host}:{port}"

    def served_names(self) -> set[str]:
        """Names a client may send that this endpoint serves without any route."""
        names = {self.model_name} if self.model_name else set()
        claimed = self.labels.get(MODEL_NAME_LABEL)
        if claimed:
            names.add(claimed)
        return names


@runtime_checkable
class Discovery(Protocol):
    def endpoints(self) -> list[Endpoint]: ...

    def subscribe(self, callback: Callback) -> None: ...


class _Subscribers:
    def __init__(self) -> None:
        self._callbacks: list[Callback] = []

    def subscribe(self, callback: Callback) -> None:
        self._callbacks.append(callback)

    def _changed(self) -> None:
        for callback in list(self._callbacks):
            callback()


class StaticDiscovery(_Subscribers):
    """A list of endpoints given by the caller; ``set()`` replaces it and notifies."""

    def __init__(self, endpoints: Iterable[Endpoint] = ()) -> None:
        super().__init__()
        self._endpoints = list(endpoints)

    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    def set(self, endpoints: Iterable[Endpoint]) -> None:
        self._endpoints = list(endpoints)
        self._changed()

    def add(self, endpoint: Endpoint) -> None:
        self.set([*self._endpoints, endpoint])

    def remove(self, address: str) -> None:
        self.set([e for e in self._endpoints if e.address != address])


def _from_runtime(obj: Any) -> Endpoint:
    labels = dict(getattr(obj, "labels", None) or {})
    workload = getattr(obj, "workload", None)  # "namespace/name" (plan.key)
    namespace = getattr(obj, "namespace", None)
    if not namespace and isinstance(workload, str) and "/" in workload:
        namespace = workload.partition("/")[0]
    engine = getattr(obj, "engine", None) or getattr(obj, "backend", None) or "vllm"
    return Endpoint(
        address=obj.address,
        labels=labels,
        model_name=getattr(obj, "model_name", "") or "",
        backend=getattr(obj, "backend", "") or "",
        namespace=namespace or "default",
        engine=str(engine).lower(),
        fixed_port=True,
    )


class RuntimeDiscovery(_Subscribers):
    """Adapts the embedded runtime: ``runtime.endpoints()`` returns objects with ``.address,
    .labels, .model_name, .backend, .workload``.

    The runtime takes its ``on_change`` callback at construction, so pass
    ``discovery.notify`` there (or call it yourself after a change).
    """

    def __init__(self, runtime: Any = None) -> None:
        super().__init__()
        self.runtime = runtime

    def endpoints(self) -> list[Endpoint]:
        if self.runtime is None:
            return []
        return [_from_runtime(e) for e in self.runtime.endpoints()]

    def notify(self, *_args: Any, **_kwargs: Any) -> None:
        self._changed()


class CombinedDiscovery(_Subscribers):
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
