"""A small async Kubernetes client over kubernetes_asyncio: raw paths, dicts in and out.

Only what llmplane needs: get, list, create, server-side apply (field manager ``llmplane``),
status merge-patch, the scale subresource and delete. Typed clients per kind would add nothing: objects are built as dicts by
``llmplane.runtime.kube`` and read back as dicts. ``connect_api`` is the one place that decides
how to reach the API server (explicit server, in-cluster config, kubeconfig).
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from llmplane.kube.kinds import Kind

log = logging.getLogger("llmplane.kube")

FIELD_MANAGER = "llmplane"
_JSON = {200: "object", 201: "object"}


class NotFound(Exception):
    pass


class Conflict(Exception):
    """409: the object changed since it was read (a resourceVersion precondition failed)."""


async def connect_api(server: str | None = None, token: str | None = None) -> k8s.ApiClient:
    """An API client: ``server`` (tests, local runs), else in-cluster config, else kubeconfig."""
    if server:
        configuration = k8s.Configuration(host=server)
        configuration.verify_ssl = False
        if token:
            configuration.api_key = {"BearerToken": f"Bearer {token}"}
        return k8s.ApiClient(configuration)
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        await k8s_config.load_kube_config()
    return k8s.ApiClient()


class KubeClient:
    def __init__(self, api: k8s.ApiClient):
        self.api = api

    @classmethod
    async def connect(cls, server: str | None = None, token: str | None = None) -> KubeClient:
        """In-cluster config, else kubeconfig; or an explicit server (tests, local runs)."""
        return cls(await connect_api(server, token))

    async def close(self) -> None:
        await self.api.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            return await self.api.call_api(
                path,
                method,
                query_params=query or [],
                header_params=headers,
                body=body,
                response_types_map=_JSON,
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )
        except ApiException as err:
            if err.status == 404:
                raise NotFound(path) from None
            if err.status == 409:
                raise Conflict(path) from None
            raise

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self._call("GET", kind.path(namespace, name))

    async def get_or_none(
        self, kind: Kind, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        try:
            return await self.get(kind, name, namespace)
        except NotFound:
            return None

    async def list(
        self, kind: Kind, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        query = [("labelSelector", label_selector)] if label_selector else None
        try:
            data = await self._call("GET", kind.path(namespace), query=query)
        except NotFound:
            return []  # the resource (e.g. LeaderWorkerSet) is not installed
        return list(data.get("items") or [])

    async def apply(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply: this manager's fields become ``obj``'s; others' are kept."""
        meta = obj["metadata"]
        return await self._call(
            "PATCH",
            kind.path(meta.get("namespace"), meta["name"]),
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            body=obj,
            content_type="application/apply-patch+yaml",
        )

    async def patch_status(
        self, kind: Kind, name: str, namespace: str | None, status: dict[str, Any]
    ) -> dict[str, Any]:
        return await self._call(
            "PATCH",
            kind.path(namespace, name) + "/status",
            query=[("fieldManager", FIELD_MANAGER)],
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    async def create(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._call(
            "POST",
            kind.path(obj["metadata"].get("namespace")),
            query=[("fieldManager", FIELD_MANAGER)],
            body=obj,
        )

    async def scale(
        self,
        kind: Kind,
        name: str,
        namespace: str | None,
        replicas: int,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """Set ``spec.replicas`` through the scale subresource, as an HPA does; with
        ``resource_version``, only if the object is unchanged since (else ``Conflict``)."""
        body: dict[str, Any] = {"spec": {"replicas": replicas}}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self._call(
            "PATCH",
            kind.path(namespace, name) + "/scale",
            query=[("fieldManager", FIELD_MANAGER)],
            body=body,
            content_type="application/merge-patch+json",
        )

    async def merge_patch(
        self, kind: Kind, name: str, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        """A JSON merge patch of the object; a ``metadata.resourceVersion`` in ``body`` makes
        it apply only if the object is unchanged since (else ``Conflict``)."""
        return await self._call(
            "PATCH",
            kind.path(namespace, name),
            query=[("fieldManager", FIELD_MANAGER)],
            body=body,
            content_type="application/merge-patch+json",
        )

    async def delete(self, kind: Kind, name: str, namespace: str | None = None) -> bool:
        try:
            await self._call(
                "DELETE",
                kind.path(namespace, name),
                body={"propagationPolicy": "Background"},
            )
        except NotFound:
            return False
        return True
