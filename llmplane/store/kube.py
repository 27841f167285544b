"""A read-only ``Store`` over the Kubernetes API, for the in-cluster gateway.

``KubeStore`` lists and watches the kinds the gateway reads (Playground, OpenModel, ModelRoute,
ModelServer, InferencePool of both groups, InferenceModel, InferenceObjective,
InferenceModelRewrite and llmplane.io Endpoint) through kubernetes_asyncio
(in-cluster config, else kubeconfig, or an explicit server URL) and serves ``list`` / ``get``
from an in-memory cache that the watches keep current, like a client-go informer:

- ``await store.start()`` lists every kind once (a kind whose CRD is not installed, or that RBAC
  forbids, counts as empty and is retried in the background; an API server that cannot be
  reached at all makes ``start`` raise), then one watch per kind and namespace follows changes;
- a watch that ends (server timeout) resumes from the last resourceVersion; ``410 Gone``
  (compacted) lists again and turns the difference into ADDED / MODIFIED / DELETED events;
- ``watch(kind, namespace, since)`` is the ``Store`` watch: ``since`` is this store's own
  event sequence (``resource_version()``, and ``event.resource_version`` of the events it
  yields), not the API server's; a ``since`` older than the retained history raises
  ``Expired``.

With ``key_secrets`` it also follows the Secrets labelled ``llmplane.io/api-key`` (kind
``Secret``): those a Tenant's ``keys[].secretRef`` names, holding a key's salt and hash. Only
labelled ones: the selector is sent to the API server, so no other Secret reaches the
gateway's memory (its RBAC must still grant reading secrets: opt-in).

Every write (``apply``, ``apply_many``, ``delete``, ``update_status``) raises ``ReadOnly``: the
gateway only reads, and its RBAC grants only get / list / watch.

The Kubernetes plumbing (``Informer``, ``Kind``, ``connect_api``) lives in ``llmplane.kube``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client as k8s

from llmplane.api.llmplane import API_KEY_SECRET_LABEL
from llmplane.api.registry import SERVED, to_storage
from llmplane.kube.client import connect_api
from llmplane.kube.informer import Informer
from llmplane.kube.kinds import SECRET, Kind
from llmplane.store.base import Expired, LabelSelector, StoreError, WatchEvent
from llmplane.store.selectors import as_selector

# What the gateway reads: routing kinds, models (served names), external endpoints, tenants.
GATEWAY_KINDS = (
    "Playground",
    "OpenModel",
    "ModelRoute",
    "ModelServer",
    "InferencePool",
    "InferenceModel",
    "InferenceObjective",
    "InferenceModelRewrite",
    "Endpoint",
    "Tenant",
)


class ReadOnly(StoreError):
    """A write to the Kubernetes store: the gateway's view of the API is read-only."""


@dataclass(frozen=True)
class KubeWatchEvent(WatchEvent):
    """A ``WatchEvent`` whose ``resource_version`` is the store's own event sequence."""

    seq: int = 0

    @property
    def resource_version(self) -> str:
        return str(self.seq)


class KubeStore:
    """The ``Store`` the in-cluster gateway reads: list / get / watch from a watched cache.

    ``namespaces``: the namespaces to read (``None`` or empty: all); cluster-scoped kinds
    (OpenModel) are always read cluster-wide. ``history`` events are kept for ``watch(since=)``.
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        namespaces: Sequence[str] | None = None,
        kinds: Iterable[str] = GATEWAY_KINDS,
        *,
        history: int = 10_000,
        owns_api: bool = False,
        watch_timeout: int = 300,
        key_secrets: bool = False,
    ) -> None:
        self.api = api
        self.namespaces = tuple(namespaces or ()) or None
        self.kinds = tuple(kinds)
        self.owns_api = owns_api
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        # Per key, the object from the storage version's group (False) and an older one (True).
        self._sources: dict[tuple[str, str, str], dict[bool, dict[str, Any]]] = {}
        self._log: deque[KubeWatchEvent] = deque(maxlen=history)
        self._seq = 0
        self._changed = asyncio.Event()
        self.informers: list[Informer] = []
        watched: list[tuple[Kind, str | None]] = [(Kind.of(kind), None) for kind in self.kinds]
        # Older groups Kubernetes serves as resources of their own (InferencePool v1alpha2):
        # read too, kept in the storage version's shape (``_record``).
        watched += [(k, None) for k in Kind.served_of(self.kinds)]
        if key_secrets:  # Tenant keys' hashes (keys[].secretRef), labelled Secrets only
            watched.append((SECRET, API_KEY_SECRET_LABEL))
        for resource, selector in watched:
            scopes = self.namespaces if resource.namespaced and self.namespaces else (None,)
            for namespace in scopes:
                self.informers.append(
                    Informer(
                        api,
                        resource,
                        namespace,
                        self._record,
                        watch_timeout=watch_timeout,
                        label_selector=selector,
                    )
                )

    @classmethod
    async def connect(
        cls,
        namespaces: Sequence[str] | None = None,
        server: str | None = None,
        token: str | None = None,
        **kwargs: Any,
    ) -> KubeStore:
        """A started store over a new API client (closed by ``aclose``)."""
        store = cls(await connect_api(server, token), namespaces, owns_api=True, **kwargs)
        try:
            await store.start()
        except BaseException:
            await store.aclose()
            raise
        return store

    async def start(self) -> None:
        """List every kind (concurrently), then follow them."""
        await asyncio.gather(*(i.start() for i in self.informers))

    async def aclose(self) -> None:
        for informer in self.informers:
            await informer.close()
        if self.owns_api:
            await self.api.close()

    def close(self) -> None:
        """Stop the watches (``aclose`` also closes the API client this store opened)."""
        for informer in self.informers:
            if informer._task is not None:
                informer._task.cancel()

    # --- the cache -----------------------------------------------------------------------------

    def _record(self, type_: str, obj: dict[str, Any]) -> None:
        """One change. An object of an older group (InferencePool v1alpha2) is kept converted to
        its kind's storage version; when both groups hold one of the same name in the same
        namespace, the storage version's is the one the store shows, and deleting either
        leaves the other."""
        older = (obj.get("apiVersion"), obj.get("kind")) in SERVED
        # Not the shape its CRD promises: kept as is, and routing reports it invalid.
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            obj = to_storage(obj)
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace") or "", meta["name"])
        sources = self._sources.setdefault(key, {})
        if type_ == "DELETED":
            sources.pop(older, None)
        else:
            sources[older] = obj
        visible = sources.get(False) or sources.get(True)
        before = self._objects.get(key)
        if visible is None:
            del self._sources[key]
            self._objects.pop(key, None)
            type_, shown = "DELETED", before or obj
        else:
            self._objects[key] = visible
            if visible is before:
                return  # the shadowed older object changed: nothing the store shows did
            type_, shown = ("MODIFIED" if before is not None else "ADDED"), visible
        self._seq += 1
        self._log.append(KubeWatchEvent(type_, shown, self._seq))  # type: ignore[arg-type]
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # --- Store: reads --------------------------------------------------------------------------

    def resource_version(self) -> str:
        """Where a ``watch(since=...)`` started now resumes: the store's event sequence."""
        return str(self._seq)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        obj = self._objects.get((kind, namespace or "", name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(
        self,
        kind: str | None = None,
        namespace: str | None = None,
        label_selector: LabelSelector = None,
    ) -> list[dict[str, Any]]:
        selector = as_selector(label_selector)
        out = [
            copy.deepcopy(obj)
            for (k, ns, _), obj in self._objects.items()
            if (kind is None or k == kind)
            and (namespace is None or ns == namespace)
            and selector.matches(obj["metadata"].get("labels") or {})
        ]
        out.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        return out

    async def watch(
        self,
        kind: str | None = None,
        namespace: str | None = None,
        since: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        def wanted(event: WatchEvent) -> bool:
            k, ns, _ = event.key
            return (kind is None or k == kind) and (namespace is None or ns == namespace)

        if since is None:
            position = self._seq
            for obj in self.list(kind, namespace):
                yield KubeWatchEvent("ADDED", obj, position)
        else:
            try:
                position = int(since)
            except ValueError:
                raise Expired(f"resourceVersion {since!r} is not one of this store's") from None
            if position > self._seq:
                raise Expired(f"resourceVersion {since} is not one of this store's")
        while True:
            changed = self._changed
            if position >= self._seq:
                await changed.wait()
                continue
            oldest = self._log[0].seq
            if position + 1 < oldest:
                raise Expired(f"resourceVersion {position} is no longer in the watch history")
            for event in list(itertools.islice(self._log, position + 1 - oldest, None)):
                position = event.seq
                if wanted(event):
                    yield KubeWatchEvent(event.type, copy.deepcopy(event.object), event.seq)

    # --- Store: writes -------------------------------------------------------------------------

    def _read_only(self, action: str) -> ReadOnly:
        return ReadOnly(
            f"read-only: the Kubernetes store does not {action}; change resources with kubectl "
            "(the gateway only reads the API)"
        )

    def apply(self, obj: dict[str, Any], *, force_conflicts: bool = False) -> dict[str, Any]:
        raise self._read_only("apply")

    def apply_many(
        self, objs: list[dict[str, Any]], *, force_conflicts: bool = False
    ) -> list[dict[str, Any]]:
        raise self._read_only("apply")

    def delete(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        raise self._read_only("delete")

    def update_status(
        self,
        kind: str,
        name: str,
        namespace: str | None,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        raise self._read_only("update status")
