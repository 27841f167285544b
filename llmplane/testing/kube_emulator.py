"""An in-process Kubernetes API emulator (aiohttp) for testing the operator, the Kubernetes store
and the gateway's Kubernetes discovery without a cluster. It is NOT a Kubernetes API server:
it implements only the few REST endpoints llmplane uses, with the semantics below.

PyPI ``kmock`` (0.8) was evaluated first: its ``KubernetesEmulator`` stores objects as merged
dicts, so a server-side apply to a missing object is a 404, and it has no uid / generation /
resourceVersion bookkeeping, no status subresource, no label selectors and no garbage
collection - all of which the operator depends on. This emulator implements the few REST
endpoints used, with those semantics:

- discovery: ``/version``, ``/api``, ``/apis``, ``/api/v1``, ``/apis/{group}/{version}``;
- list (``labelSelector``: equality, inequality, existence, ``in`` / ``notin``), get, create,
  delete, across namespaces (``/api/v1/pods``) or in one;
- watch (``?watch=true``, from ``resourceVersion``, ``timeoutSeconds``, ``labelSelector``),
  JSON lines; ``compact()`` drops the event history, after which a watch from an older
  resourceVersion gets an ``ERROR`` event with a ``410 Gone`` Status (as after etcd compaction);
- Pods are plain objects: nothing schedules or runs them; ``pod()`` builds one with a podIP and
  a Ready condition, and ``set_pod_ready()`` flips it (the kubelet's part);
- PATCH ``application/merge-patch+json`` and ``application/apply-patch+yaml`` (server-side
  apply, simplified: a manager's fields are replaced by its latest applied configuration -
  fields it applied before and no longer applies are removed; lists are atomic);
- the ``status`` subresource (writes to the main resource keep status; ``/status`` writes change
  only status); the ``scale`` subresource of any kind (an ``autoscaling/v1`` Scale over
  ``spec.replicas``; a resourceVersion in the body is a precondition); ``metadata.generation`` bumps when anything outside metadata/status changes;
  a write that changes nothing keeps the resourceVersion and emits no event (like the real one);
- garbage collection: deleting an object deletes, transitively, every object whose
  ``ownerReferences`` name its uid, and an object created with owners that no longer exist is
  deleted at once (the real API server's garbage collector does both, asynchronously).

No authentication, no admission, no defaulting, no validation, no strategic merge patch.

Over 500 lines on purpose: one emulator whose list, watch, apply, status and garbage-collection
paths share the same object store and resourceVersion clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import yaml
from aiohttp import web

from llmplane.aio import wait_event


@dataclass(frozen=True)
class EmulatedKind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status: bool = True

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


def default_kinds() -> list[EmulatedKind]:
    from llmplane.api.registry import KINDS, SERVED

    kinds = [
        EmulatedKind("", "v1", "services", "Service"),
        EmulatedKind("", "v1", "pods", "Pod"),
        EmulatedKind("", "v1", "secrets", "Secret", status=False),
        EmulatedKind("", "v1", "events", "Event", status=False),
        EmulatedKind("", "v1", "namespaces", "Namespace", namespaced=False),
        EmulatedKind("apps", "v1", "deployments", "Deployment"),
        EmulatedKind("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler"),
        EmulatedKind("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet"),
        EmulatedKind("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", status=False),
        EmulatedKind("events.k8s.io", "v1", "events", "Event", status=False),
    ]
    for kind, cls in KINDS.items():
        kinds.append(EmulatedKind(cls.group, cls.version, cls.plural, kind, cls.namespaced))
    for served in SERVED.values():  # older groups with CRDs of their own (InferencePool v1alpha2)
        own = served.model
        if served.crd and own is not None:
            kinds.append(EmulatedKind(own.group, own.version, own.plural, served.kind))
    return kinds


_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>status|scale))?$"
)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _drop_unapplied(current: dict[str, Any], before: dict[str, Any], now: dict[str, Any]) -> None:
    for key, old in before.items():
        if key not in now:
            current.pop(key, None)
        elif (
            isinstance(old, dict)
            and isinstance(now[key], dict)
            and isinstance(current.get(key), dict)
        ):
            _drop_unapplied(current[key], old, now[key])


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    """kubectl label selector syntax: ``a=b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``,
    ``a notin (x)``."""
    if not selector:
        return True
    from llmplane.store.selectors import parse_selector

    return parse_selector(selector).matches(labels)


@dataclass
class _Stored:
    obj: dict[str, Any]
    applied: dict[str, dict[str, Any]] = field(default_factory=dict)  # field manager -> config


class KubeEmulator:
    """``async with KubeEmulator() as kube:`` then point clients at ``kube.url``."""

    def __init__(self, kinds: list[EmulatedKind] | None = None, gc: bool = True):
        self.kinds = kinds or default_kinds()
        self.gc = gc
        self._by_path = {(k.group, k.version, k.plural): k for k in self.kinds}
        self.objects: dict[tuple[str, str, str, str], _Stored] = {}  # (group, plural, ns, name)
        self.events: list[tuple[int, EmulatedKind, str, dict[str, Any]]] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self._rv = 0
        self._compacted = 0  # events up to this resourceVersion are gone
        self._watch_epoch = 0  # compact() bumps it: open watches end
        self._changed = asyncio.Condition()
        self._tick = asyncio.Event()  # replaced (after being set) on every event; for watches
        self._runner: web.AppRunner | None = None
        self.url = ""

    # lifecycle -------------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> KubeEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # direct access for tests (same semantics as the REST calls) -------------------------------

    def kind(self, api_version: str, kind: str) -> EmulatedKind:
        group, _, version = api_version.rpartition("/")
        for k in self.kinds:
            if k.group == group and k.version == version and k.kind == kind:
                return k
        raise KeyError(f"{api_version} {kind}")

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        k = self.kind(api_version, kind)
        stored = self.objects.get((k.group, k.plural, namespace if k.namespaced else "", name))
        return copy.deepcopy(stored.obj) if stored else None

    def list(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        k = self.kind(api_version, kind)
        return [
            copy.deepcopy(s.obj)
            for (g, p, _, _), s in sorted(self.objects.items())
            if (g, p) == (k.group, k.plural)
        ]

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        k = self.kind(obj["apiVersion"], obj["kind"])
        return await self._create(
            k, obj.get("metadata", {}).get("namespace") or ("default" if k.namespaced else ""), obj
        )

    async def patch_status(
        self, api_version: str, kind: str, name: str, namespace: str | None, status: dict[str, Any]
    ) -> dict[str, Any]:
        k = self.kind(api_version, kind)
        key = (k.group, k.plural, namespace if k.namespaced else "", name)
        return await self._write(
            k,
            key,
            lambda cur: {**cur, "status": merge_patch(cur.get("status"), status)},
            subresource="status",
        )

    async def patch(
        self, api_version: str, kind: str, name: str, namespace: str | None, patch: dict[str, Any]
    ) -> dict[str, Any]:
        k = self.kind(api_version, kind)
        key = (k.group, k.plural, namespace if k.namespaced else "", name)
        return await self._write(k, key, lambda cur: merge_patch(cur, patch))

    async def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> None:
        k = self.kind(api_version, kind)
        await self._delete((k.group, k.plural, namespace if k.namespaced else "", name))

    async def wait_for(self, predicate: Any, timeout: float = 10.0) -> Any:
        """Wait until ``predicate()`` returns something truthy (re-checked on every change)."""

        async def loop() -> Any:
            async with self._changed:
                while True:
                    value = predicate()
                    if value:
                        return value
                    await self._changed.wait()

        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation.
        async with asyncio.timeout(timeout):
            return await loop()

    def compact(self) -> None:
        """etcd compaction plus the end of every open watch (as on an API server restart):
        clients watch again from their last resourceVersion, which is now too old, get
        ``410 Gone`` and must list again."""
        self._compacted = self._rv
        self._watch_epoch += 1
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    async def set_pod_ready(
        self, name: str, ready: bool, namespace: str = "default", pod_ip: str | None = None
    ) -> dict[str, Any]:
        """Play the kubelet: set the Pod's Ready condition (and, given a podIP, the IP and
        phase Running)."""
        status: dict[str, Any] = {"conditions": [_ready_condition(ready)]}
        if pod_ip is not None:  # scheduled and started
            status.update(phase="Running", podIP=pod_ip, podIPs=[{"ip": pod_ip}])
        return await self.patch_status("v1", "Pod", name, namespace, status)

    # storage semantics -----------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    async def _emit(self, kind: EmulatedKind, type_: str, obj: dict[str, Any]) -> None:
        self.events.append((self._rv, kind, type_, copy.deepcopy(obj)))
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()
        async with self._changed:
            self._changed.notify_all()

    async def _create(
        self, kind: EmulatedKind, namespace: str, obj: dict[str, Any], manager: str | None = None
    ) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            if meta.get("generateName"):
                name = meta["generateName"] + uuid.uuid4().hex[:5]
                meta["name"] = name
            else:
                raise web.HTTPUnprocessableEntity(
                    text=_status(422, "Invalid", "metadata.name required"),
                    content_type="application/json",
                )
        key = (kind.group, kind.plural, namespace, name)
        if key in self.objects:
            raise web.HTTPConflict(
                text=_status(409, "AlreadyExists", f"{kind.plural} {name!r} already exists"),
                content_type="application/json",
            )
        obj["apiVersion"], obj["kind"] = kind.group_version, kind.kind
        if kind.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["generation"] = 1
        meta["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta["resourceVersion"] = self._next_rv()
        stored = _Stored(obj)
        self.objects[key] = stored
        await self._emit(kind, "ADDED", obj)
        owners = {r.get("uid") for r in meta.get("ownerReferences") or []}
        if self.gc and owners and not owners & self._uids():
            # Every owner is gone (e.g. created by a reconcile racing the owner's deletion):
            # the garbage collector deletes it.
            await self._delete(key)
        return copy.deepcopy(obj)

    def _uids(self) -> set[str]:
        return {s.obj["metadata"]["uid"] for s in self.objects.values()}

    async def _write(
        self,
        kind: EmulatedKind,
        key: tuple[str, str, str, str],
        change: Any,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        stored = self.objects.get(key)
        if stored is None:
            raise web.HTTPNotFound(
                text=_status(404, "NotFound", f"{kind.plural} {key[3]!r} not found"),
                content_type="application/json",
            )
        current = stored.obj
        new = change(copy.deepcopy(current))
        return await self._replace(kind, stored, new, subresource)

    async def _replace(
        self, kind: EmulatedKind, stored: _Stored, new: dict[str, Any], subresource: str | None
    ) -> dict[str, Any]:
        current = stored.obj
        server_meta = {
            k: current["metadata"][k]
            for k in ("uid", "creationTimestamp", "generation", "resourceVersion", "name")
            if k in current["metadata"]
        }
        if kind.namespaced:
            server_meta["namespace"] = current["metadata"]["namespace"]
        if subresource == "status":
            new = {**copy.deepcopy(current), "status": new.get("status")}
            if new["status"] is None:
                del new["status"]
        else:
            if kind.status:
                new.pop("status", None)
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
            new.setdefault("metadata", {}).update(server_meta)
        new["apiVersion"], new["kind"] = kind.group_version, kind.kind

        def body(o: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in o.items() if k not in ("metadata", "status")}

        if new == current:
            return copy.deepcopy(current)
        if body(new) != body(current):
            new["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
        new["metadata"]["resourceVersion"] = self._next_rv()
        stored.obj = new
        await self._emit(kind, "MODIFIED", new)
        return copy.deepcopy(new)

    async def _apply(
        self, kind: EmulatedKind, namespace: str, name: str, applied: dict[str, Any], manager: str
    ) -> dict[str, Any]:
        key = (kind.group, kind.plural, namespace, name)
        stored = self.objects.get(key)
        if stored is None:
            obj = await self._create(kind, namespace, applied)
            if key in self.objects:  # not garbage-collected at once
                self.objects[key].applied[manager] = copy.deepcopy(applied)
            return obj
        previous = stored.applied.get(manager, {})
        new = copy.deepcopy(stored.obj)
        _drop_unapplied(new, previous, applied)
        new = _deep_merge(new, applied)
        stored.applied[manager] = copy.deepcopy(applied)
        return await self._replace(kind, stored, new, None)

    async def _delete(self, key: tuple[str, str, str, str]) -> dict[str, Any] | None:
        stored = self.objects.pop(key, None)
        if stored is None:
            return None
        kind = next(k for k in self.kinds if (k.group, k.plural) == key[:2])
        stored.obj["metadata"]["resourceVersion"] = self._next_rv()
        await self._emit(kind, "DELETED", stored.obj)
        if self.gc:
            uid = stored.obj["metadata"]["uid"]
            dependents = [
                k
                for k, s in self.objects.items()
                if any(r.get("uid") == uid for r in s.obj["metadata"].get("ownerReferences") or [])
            ]
            for dependent in dependents:
                await self._delete(dependent)
        return stored.obj

    # HTTP ------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        self.requests.append((request.method, path))
        if request.method == "GET":
            discovery = self._discovery(path)
            if discovery is not None:
                return web.json_response(discovery)
        match = _PATH.match(path)
        if not match:
            return _error(404, "NotFound", f"no route {path}")
        group = match.group("group") or ""
        version = match.group("core") or match.group("version")
        kind = self._by_path.get((group, version, match.group("plural")))
        if kind is None:
            return _error(
                404, "NotFound", f"the server could not find the requested resource {path}"
            )
        ns = match.group("ns") or ""
        name = match.group("name")
        sub = match.group("sub")
        if not kind.namespaced:
            ns = ""
        try:
            if name is None:
                if request.method == "GET" and request.query.get("watch") in ("true", "1"):
                    return await self._watch(request, kind, match.group("ns"))
                if request.method == "GET":
                    return web.json_response(
                        self._list(kind, match.group("ns"), request.query.get("labelSelector"))
                    )
                if request.method == "POST":
                    body = await request.json()
                    return web.json_response(
                        await self._create(
                            kind,
                            ns
                            or body.get("metadata", {}).get("namespace")
                            or ("default" if kind.namespaced else ""),
                            body,
                        ),
                        status=201,
                    )
                return _error(405, "MethodNotAllowed", request.method)
            key = (kind.group, kind.plural, ns, name)
            if sub == "scale":
                return await self._scale(request, kind, key)
            if request.method == "GET":
                stored = self.objects.get(key)
                if stored is None:
                    return _error(404, "NotFound", f'{kind.plural} "{name}" not found')
                return web.json_response(stored.obj)
            if request.method == "DELETE":
                deleted = await self._delete(key)
                if deleted is None:
                    return _error(404, "NotFound", f'{kind.plural} "{name}" not found')
                return web.json_response(deleted)
            if request.method == "PATCH":
                ctype = request.content_type
                text = await request.text()
                if ctype == "application/apply-patch+yaml":
                    if sub:
                        return _error(415, "UnsupportedMediaType", "apply to a subresource")
                    applied = yaml.safe_load(text) or {}
                    manager = request.query.get("fieldManager")
                    if not manager:
                        return _error(422, "Invalid", "fieldManager is required for apply")
                    return web.json_response(await self._apply(kind, ns, name, applied, manager))
                if ctype == "application/merge-patch+json":
                    patch = json.loads(text or "{}")
                    return web.json_response(
                        await self._write(kind, key, lambda cur: merge_patch(cur, patch), sub)
                    )
                return _error(415, "UnsupportedMediaType", ctype)
            if request.method == "PUT":
                body = await request.json()
                return web.json_response(await self._write(kind, key, lambda cur: body, sub))
            return _error(405, "MethodNotAllowed", request.method)
        except web.HTTPException as exc:
            return web.Response(status=exc.status, text=exc.text, content_type="application/json")

    async def _scale(
        self, request: web.Request, kind: EmulatedKind, key: tuple[str, str, str, str]
    ) -> web.Response:
        """The ``scale`` subresource (``autoscaling/v1`` Scale over ``spec.replicas``): GET,
        merge PATCH and PUT; a ``metadata.resourceVersion`` in the body is a precondition
        (409 Conflict when the object changed since)."""
        stored = self.objects.get(key)
        if stored is None:
            return _error(404, "NotFound", f'{kind.plural} "{key[3]}" not found')
        if request.method not in ("GET", "PATCH", "PUT"):
            return _error(405, "MethodNotAllowed", request.method)
        if request.method != "GET":
            if request.method == "PATCH" and request.content_type != "application/merge-patch+json":
                return _error(415, "UnsupportedMediaType", request.content_type)
            body = json.loads(await request.text() or "{}")
            current = _scale_of(stored.obj)
            scale = merge_patch(current, body) if request.method == "PATCH" else body
            wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
            if wanted_rv and wanted_rv != stored.obj["metadata"]["resourceVersion"]:
                return _error(409, "Conflict", "the object has been modified; apply again")
            replicas = (scale.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                return _error(422, "Invalid", "spec.replicas must be an integer >= 0")
            await self._write(
                kind,
                key,
                lambda cur: {**cur, "spec": {**(cur.get("spec") or {}), "replicas": replicas}},
            )
        return web.json_response(_scale_of(self.objects[key].obj))

    def _list(
        self, kind: EmulatedKind, namespace: str | None, selector: str | None
    ) -> dict[str, Any]:
        items = [
            s.obj
            for (g, p, ns, _), s in sorted(self.objects.items())
            if (g, p) == (kind.group, kind.plural)
            and (not namespace or ns == namespace)
            and _matches(s.obj["metadata"].get("labels") or {}, selector)
        ]
        return {
            "apiVersion": kind.group_version,
            "kind": kind.kind + "List",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    async def _watch(
        self, request: web.Request, kind: EmulatedKind, namespace: str | None
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        since = request.query.get("resourceVersion")
        selector = request.query.get("labelSelector")
        timeout = float(request.query.get("timeoutSeconds") or 3600)
        deadline = asyncio.get_running_loop().time() + timeout
        if since in (None, "", "0"):
            for obj in self._list(kind, namespace, selector)["items"]:
                await response.write(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
            position = len(self.events)
        elif int(since) < self._compacted:
            gone = json.loads(
                _status(410, "Expired", f"too old resource version: {since} ({self._compacted})")
            )
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response
        else:
            position = next(
                (i for i, e in enumerate(self.events) if e[0] > int(since)), len(self.events)
            )

        def wanted(event: tuple[int, EmulatedKind, str, dict[str, Any]]) -> bool:
            _, k, _, obj = event
            meta = obj["metadata"]
            return (
                k == kind
                and (not namespace or meta.get("namespace") == namespace)
                and _matches(meta.get("labels") or {}, selector)
            )

        epoch = self._watch_epoch
        with contextlib.suppress(asyncio.CancelledError, ConnectionResetError, TimeoutError):
            while epoch == self._watch_epoch:
                while position < len(self.events):
                    event = self.events[position]
                    position += 1
                    if wanted(event):
                        line = json.dumps({"type": event[2], "object": event[3]})
                        await response.write(line.encode() + b"\n")
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                # An Event, not the Condition: a watch cancelled while waiting (client gone,
                # server stopping) must not have to re-acquire a lock.
                tick = self._tick
                if position >= len(self.events):
                    await wait_event(tick, min(remaining, 1.0))
        return response

    def _discovery(self, path: str) -> dict[str, Any] | None:
        if path == "/version":
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.0-llmplane-emulator"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"]}
        if path == "/apis":
            groups: dict[str, list[str]] = {}
            for k in self.kinds:
                if k.group:
                    versions = groups.setdefault(k.group, [])
                    if k.version not in versions:
                        versions.append(k.version)
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": g,
                        "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                        "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                    }
                    for g, vs in groups.items()
                ],
            }
        m = re.fullmatch(r"/api/(v1)|/apis/([^/]+)/([^/]+)", path)
        if not m:
            return None
        group, version = (m.group(2) or ""), (m.group(1) or m.group(3))
        kinds = [k for k in self.kinds if (k.group, k.version) == (group, version)]
        if not kinds:
            return None
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        resources = []
        for k in kinds:
            resources.append(
                {
                    "name": k.plural,
                    "singularName": k.kind.lower(),
                    "namespaced": k.namespaced,
                    "kind": k.kind,
                    "verbs": verbs,
                }
            )
            if k.status:
                resources.append(
                    {
                        "name": f"{k.plural}/status",
                        "singularName": "",
                        "namespaced": k.namespaced,
                        "kind": k.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": kinds[0].group_version,
            "resources": resources,
        }


def _ready_condition(ready: bool) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": "True" if ready else "False",
        "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def pod(
    name: str,
    labels: dict[str, str],
    pod_ip: str | None = "10.0.0.1",
    *,
    ready: bool = True,
    namespace: str = "default",
    port: int = 8080,
) -> dict[str, Any]:
    """A running Pod as the kubelet reports it (``model-runner`` container, ``http`` port),
    to ``create`` in the emulator. ``pod_ip=None``: not scheduled yet (Pending, no IP)."""
    status: dict[str, Any] = {"phase": "Pending" if pod_ip is None else "Running"}
    if pod_ip is not None:
        status.update(
            podIP=pod_ip,
            podIPs=[{"ip": pod_ip}],
            conditions=[_ready_condition(ready)],
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "containers": [
                {
                    "name": "model-runner",
                    "image": "llmplane/sim",
                    "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
                }
            ]
        },
        "status": status,
    }


def _scale_of(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    status = obj.get("status") or {}
    scale: dict[str, Any] = {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        "spec": {"replicas": int((obj.get("spec") or {}).get("replicas", 1))},
        "status": {"replicas": int(status.get("replicas") or 0)},
    }
    if status.get("selector"):
        scale["status"]["selector"] = status["selector"]
    return scale


def _deep_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _status(code: int, reason: str, message: str) -> str:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
        }
    )


def _error(code: int, reason: str, message: str) -> web.Response:
    return web.Response(
        status=code, text=_status(code, reason, message), content_type="application/json"
    )
