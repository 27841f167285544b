"""A read-only ``Store`` over the Kubernetes API, for the in-cluster gateway.

``KubeStore`` lists and watches the kinds the gateway reads (Playground, OpenModel, ModelRoute,
ModelServer, InferencePool, InferenceModel and llmplane.io Endpoint) through kubernetes_asyncio
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

Every write (``apply``, ``apply_many``, ``delete``, ``update_status``) raises ``ReadOnly``: the
gateway only reads, and its RBAC grants only get / list / watch.

``Informer`` (one resource in one namespace or all, with callbacks) is also what
``llmplane.gateway.discovery.pods.PodDiscovery`` uses to follow Pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from llmplane.store.base import Expired, LabelSelector, StoreError, WatchEvent
from llmplane.store.selectors import as_selector

log = logging.getLogger("llmplane.store.kube")

# What the gateway reads: routing kinds, models (served names) and external endpoints.
GATEWAY_KINDS = (
    "Playground",
    "OpenModel",
    "ModelRoute",
    "ModelServer",
    "InferencePool",
    "InferenceModel",
    "Endpoint",
)

# metadata fields kept in the cache (the API models forbid unknown ones; managedFields is big)
_META = (
    "name",
    "namespace",
    "labels",
    "annotations",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "ownerReferences",
    "finalizers",
)


class ReadOnly(StoreError):
    """A write to the Kubernetes store: the gateway's view of the API is read-only."""


@dataclass(frozen=True)
class Resource:
    """An API resource to follow: ``/api/v1/pods``, ``/apis/{group}/{version}/{plural}``."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace)}"
        return f"{base}/{self.plural}"

    @classmethod
    def of(cls, kind: str) -> Resource:
        """The resource of an llmplane kind (``Playground``, ``ModelRoute``, ...)."""
        from llmplane.api.registry import KINDS

        model = KINDS[kind]
        return cls(model.group, model.version, model.plural, kind, model.namespaced)


POD = Resource("", "v1", "pods", "Pod")


class _Gone(Exception):
    """The watch's resourceVersion was compacted (410): list again."""


def slim(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with only the metadata fields llmplane's API models know (no managedFields)."""
    meta = obj.get("metadata") or {}
    return {**obj, "metadata": {k: meta[k] for k in _META if k in meta}}


Handler = Callable[[str, dict[str, Any]], None]


class Informer:
    """List + watch one resource in one namespace (``None``: all, or cluster-scoped).

    Keeps ``objects`` by (namespace, name) and calls ``on_event(type, obj)`` for every change:
    ADDED for what the first list finds, then the watch's events, and after a relist (410 Gone,
    repeated failures) the difference to what it had. Objects get ``apiVersion`` and ``kind``
    (list items may lack them) and pass through ``transform`` (default ``slim``).
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        resource: Resource,
        namespace: str | None,
        on_event: Handler,
        *,
        transform: Callable[[dict[str, Any]], dict[str, Any]] = slim,
        watch_timeout: int = 300,
        retry: float = 1.0,
        missing_retry: float = 30.0,
    ) -> None:
        self.api = api
        self.resource = resource
        self.namespace = namespace if resource.namespaced else None
        self.on_event = on_event
        self.transform = transform
        self.watch_timeout = watch_timeout
        self.retry = retry
        self.missing_retry = missing_retry
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.missing = False  # not served (CRD not installed, or forbidden)
        self._rv: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def where(self) -> str:
        return self.resource.path(self.namespace)

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """List once (raising if the API cannot be reached), then watch in the background."""
        await self._relist()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"informer {self.where}")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --- list / watch ------------------------------------------------------------------------

    def _normalise(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = self.transform(obj)
        obj["apiVersion"] = self.resource.api_version
        obj["kind"] = self.resource.kind
        return obj

    @staticmethod
    def _key(obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj["metadata"]
        return (meta.get("namespace") or "", meta["name"])

    async def _relist(self) -> None:
        try:
            data = await self.api.call_api(
                self.where,
                "GET",
                query_params=[],
                header_params={"Accept": "application/json"},
                response_types_map={200: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _request_timeout=aiohttp.ClientTimeout(total=60, sock_connect=10),
            )
        except ApiException as err:
            if err.status in (403, 404):
                if not self.missing:
                    log.warning(
                        "%s: %s (%s); treating it as empty and retrying every %g s",
                        self.where,
                        "not installed" if err.status == 404 else "forbidden",
                        err.status,
                        self.missing_retry,
                    )
                self.missing = True
                self._rv = None
                self._replace({})
                return
            raise
        self.missing = False
        items = {}
        for item in data.get("items") or []:
            obj = self._normalise(item)
            items[self._key(obj)] = obj
        self._replace(items)
        self._rv = str((data.get("metadata") or {}).get("resourceVersion") or "") or None

    def _replace(self, items: dict[tuple[str, str], dict[str, Any]]) -> None:
        old = self.objects
        self.objects = items
        for key, obj in old.items():
            if key not in items:
                self._emit("DELETED", obj)
        for key, obj in items.items():
            before = old.get(key)
            if before is None:
                self._emit("ADDED", obj)
            elif before["metadata"].get("resourceVersion") != obj["metadata"].get(
                "resourceVersion"
            ):
                self._emit("MODIFIED", obj)

    def _emit(self, type_: str, obj: dict[str, Any]) -> None:
        try:
            self.on_event(type_, obj)
        except Exception:
            log.exception("%s: handling a %s event failed", self.where, type_)

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                if self.missing:
                    await asyncio.sleep(self.missing_retry)
                    await self._relist()
                    continue
                if self._rv is None:
                    await self._relist()
                    if self.missing:
                        continue
                await self._watch()
                failures = 0
            except asyncio.CancelledError:
                raise
            except _Gone:
                log.info("%s: resourceVersion %s is gone; listing again", self.where, self._rv)
                self._rv = None
            except Exception as err:
                failures += 1
                log.warning("%s: watch failed (%s); retrying", self.where, err)
                await asyncio.sleep(min(self.retry * failures, 30.0))
                if failures >= 3:
                    self._rv = None  # list again: events may have been missed

    async def _watch(self) -> None:
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.watch_timeout)),
        ]
        if self._rv:
            query.append(("resourceVersion", self._rv))
        response = await self.api.call_api(
            self.where,
            "GET",
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(
                sock_connect=10, sock_read=self.watch_timeout + 30
            ),
        )
        try:
            if response.status == 410:
                raise _Gone()
            if response.status != 200:
                body = await response.read()
                raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._event(json.loads(line))
            if buffer.strip():
                self._event(json.loads(buffer))
        finally:
            response.release()

    def _event(self, event: dict[str, Any]) -> None:
        type_ = event.get("type")
        raw = event.get("object") or {}
        if type_ == "ERROR":
            if raw.get("code") == 410:
                raise _Gone()
            raise RuntimeError(f"watch error: {raw.get('message') or raw}")
        rv = (raw.get("metadata") or {}).get("resourceVersion")
        if type_ == "BOOKMARK":
            if rv:
                self._rv = rv
            return
        if type_ not in ("ADDED", "MODIFIED", "DELETED"):
            return
        obj = self._normalise(raw)
        key = self._key(obj)
        if rv:
            self._rv = rv
        if type_ == "DELETED":
            if self.objects.pop(key, None) is not None:
                self._emit("DELETED", obj)
            return
        before = self.objects.get(key)
        if before is not None and before["metadata"].get("resourceVersion") == rv:
            return  # already seen (a replay after a reconnect)
        self.objects[key] = obj
        self._emit("MODIFIED" if before is not None else "ADDED", obj)


@dataclass(frozen=True)
class KubeWatchEvent(WatchEvent):
    """A ``WatchEvent`` whose ``resource_version`` is the store's own event sequence."""

    seq: int = 0

    @property
    def resource_version(self) -> str:
        return str(self.seq)


async def connect_api(server: str | None = None, token: str | None = None) -> k8s.ApiClient:
    """An API client: ``server`` (tests, local runs), else in-cluster config, else kubeconfig."""
    from llmplane.operator.client import KubeClient

    return (await KubeClient.connect(server, token)).api


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
    ) -> None:
        self.api = api
        self.namespaces = tuple(namespaces or ()) or None
        self.kinds = tuple(kinds)
        self.owns_api = owns_api
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._log: deque[KubeWatchEvent] = deque(maxlen=history)
        self._seq = 0
        self._changed = asyncio.Event()
        self.informers: list[Informer] = []
        for kind in self.kinds:
            resource = Resource.of(kind)
            scopes = self.namespaces if resource.namespaced and self.namespaces else (None,)
            for namespace in scopes:
                self.informers.append(
                    Informer(api, resource, namespace, self._record, watch_timeout=watch_timeout)
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
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace") or "", meta["name"])
        if type_ == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = obj
        self._seq += 1
        self._log.append(KubeWatchEvent(type_, obj, self._seq))  # type: ignore[arg-type]
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

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        raise self._read_only("apply")

    def apply_many(self, objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
