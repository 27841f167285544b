"""List + watch one Kubernetes resource, like a client-go informer.

``Informer`` keeps a resource's objects (in one namespace or all) current and reports every
change; ``llmplane.store.kube.KubeStore`` caches the gateway's kinds with it and the gateway's
pod discovery follows Pods with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from llmplane.kube.kinds import Kind
from llmplane.kube.metadata import slim

log = logging.getLogger("llmplane.kube.informer")


class _Gone(Exception):
    """The watch's resourceVersion was compacted (410): list again."""


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
        resource: Kind,
        namespace: str | None,
        on_event: Handler,
        *,
        transform: Callable[[dict[str, Any]], dict[str, Any]] = slim,
        watch_timeout: int = 300,
        retry: float = 1.0,
        missing_retry: float = 30.0,
        label_selector: str | None = None,
    ) -> None:
        self.api = api
        self.label_selector = label_selector  # only objects it selects (list and watch)
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

    def _selector(self) -> list[tuple[str, str]]:
        return [("labelSelector", self.label_selector)] if self.label_selector else []

    async def _relist(self) -> None:
        try:
            data = await self.api.call_api(
                self.where,
                "GET",
                query_params=self._selector(),
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
            *self._selector(),
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
