"""External endpoints: model servers running elsewhere, registered as ``Endpoint`` store objects
(``llmplane.io/v1alpha1``; the fields: docs/gateway.md, "Registering an external endpoint").

A port in ``spec.address`` is the server's own: routes' ``workloadPort`` / ``targetPortNumber``
do not change it, unless ``fixedPort: false`` (as for a Kubernetes pod) or the address is a
bare host (the port then comes from the route, 8080 without one). ``StoreEndpoints`` reads them
from the store and follows changes with a watch.
"""

from __future__ import annotations

import logging
from typing import Any

from llmplane.gateway.discovery.sources import Subscribers
from llmplane.gateway.scraper import engine_of
from llmplane.gateway.store_follower import StoreFollower
from llmplane.runtime.endpoint import MAX_CONCURRENCY, Endpoint, valid_events_address
from llmplane.store.base import Store

ENDPOINT_KIND = "Endpoint"
ENDPOINT_API_VERSION = "llmplane.io/v1alpha1"

log = logging.getLogger("llmplane.gateway")


def endpoint_from_object(obj: dict[str, Any]) -> Endpoint | None:
    """The Endpoint an ``Endpoint`` store object describes, or None if it is unusable."""
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    address = spec.get("address")
    if isinstance(address, str):
        address = address.removeprefix("http://").rstrip("/")
    if not isinstance(address, str) or not address:
        log.warning("Endpoint %s has no spec.address (host:port)", meta.get("name"))
        return None
    labels = dict(meta.get("labels") or {})
    labels.update(spec.get("labels") or {})
    return Endpoint(
        address=address,
        labels={str(k): str(v) for k, v in labels.items()},
        model_name=str(spec.get("modelName") or ""),
        backend=str(spec.get("backend") or ""),
        namespace=meta.get("namespace") or "default",
        engine=engine_of(str(spec.get("engine") or "")),
        fixed_port=spec.get("fixedPort", True) is not False,
        max_num_seqs=_max_num_seqs(spec.get("maxNumSeqs"), meta.get("name")),
        priority_scheduling=spec.get("schedulingPolicy") == "priority",
        kv_events=_events_address(spec.get("kvEvents"), meta.get("name")),
        kv_events_replay=_events_address(spec.get("kvEventsReplay"), meta.get("name")),
    )


def _events_address(value: Any, name: object) -> str:
    """A KV events address (``tcp://host:port`` or ``ipc:///path``), else "" (logged)."""
    if value is None or value == "":
        return ""
    if isinstance(value, str) and valid_events_address(value):
        return value
    log.warning("Endpoint %s: a KV events address must be tcp://host:port or ipc:///path", name)
    return ""


def _max_num_seqs(value: Any, name: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_CONCURRENCY:
        return value
    log.warning("Endpoint %s: spec.maxNumSeqs must be an integer in 1..%d", name, MAX_CONCURRENCY)
    return 0


def endpoint_object(
    name: str,
    address: str,
    model_name: str,
    *,
    labels: dict[str, str] | None = None,
    engine: str = "vllm",
    namespace: str = "default",
    fixed_port: bool = True,
    max_num_seqs: int = 0,
    scheduling_policy: str = "",
    kv_events: str = "",
    kv_events_replay: str = "",
) -> dict[str, Any]:
    """The store object that registers an external endpoint."""
    optional = {
        "kvEvents": kv_events,
        "kvEventsReplay": kv_events_replay,
        "maxNumSeqs": max_num_seqs,
        "schedulingPolicy": scheduling_policy,
        "labels": labels,
    }
    spec: dict[str, Any] = {"address": address, "modelName": model_name, "engine": engine}
    spec |= {k: v for k, v in optional.items() if v}
    if not fixed_port:
        spec["fixedPort"] = False
    return {
        "apiVersion": ENDPOINT_API_VERSION,
        "kind": ENDPOINT_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


class StoreEndpoints(Subscribers):
    """``Discovery`` over the store's ``Endpoint`` objects; ``await start()`` to follow changes."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self._endpoints: list[Endpoint] = []
        self._follower = StoreFollower(store, [ENDPOINT_KIND], self._rebuild, debounce=0.0)

    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    def _rebuild(self, objects: dict[Any, dict[str, Any]]) -> None:
        endpoints = [endpoint_from_object(o) for o in objects.values()]
        self._endpoints = [e for e in endpoints if e is not None]
        self._changed()

    async def start(self) -> None:
        await self._follower.start()

    async def close(self) -> None:
        await self._follower.close()
