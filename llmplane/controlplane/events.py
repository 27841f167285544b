"""Kubernetes-style Events about resources, kept in the store (bounded per object)."""

from __future__ import annotations

import itertools
import time
from typing import Any

from llmplane.controlplane.conditions import now
from llmplane.store.base import Store

EVENT_KIND = "Event"
MAX_EVENTS_PER_OBJECT = 20
_counter = itertools.count()


def record_event(
    store: Store, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal"
) -> None:
    """Add an event (or bump the count of the same latest one) about ``obj``."""
    meta = obj["metadata"]
    involved = {"kind": obj["kind"], "name": meta["name"], "namespace": meta.get("namespace")}
    existing = events_for(store, obj)
    latest = existing[-1] if existing else None
    if latest and latest.get("reason") == reason and latest.get("message") == message:
        latest = dict(latest)
        latest["count"] = latest.get("count", 1) + 1
        latest["lastTimestamp"] = now()
        latest["metadata"] = {
            k: v for k, v in latest["metadata"].items() if k in ("name", "namespace")
        }
        store.apply(latest)
        return
    name = f"{meta['name']}.{time.time_ns():x}{next(_counter):x}"
    event = event_object(obj, reason, message, type_, name)
    event["involvedObject"] = {k: v for k, v in involved.items() if v is not None}
    store.apply(event)
    for old in existing[: max(0, len(existing) + 1 - MAX_EVENTS_PER_OBJECT)]:
        store.delete(EVENT_KIND, old["metadata"]["name"], old["metadata"]["namespace"])


def event_object(
    obj: dict[str, Any], reason: str, message: str, type_: str, name: str
) -> dict[str, Any]:
    """A core/v1 Event named ``name`` about ``obj``, count 1, stamped now (the store's Events
    and the operator's, posted to the API server)."""
    meta = obj["metadata"]
    namespace = meta.get("namespace") or "default"
    stamp = now()
    return {
        "apiVersion": "v1",
        "kind": EVENT_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": meta["name"],
            "namespace": namespace,
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message,
        "type": type_,
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
    }


def events_for(store: Store, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Events about ``obj``, oldest first."""
    meta = obj["metadata"]
    namespace = meta.get("namespace") or "default"
    found = [
        e
        for e in store.list(EVENT_KIND, namespace)
        if e.get("involvedObject", {}).get("kind") == obj["kind"]
        and e.get("involvedObject", {}).get("name") == meta["name"]
    ]
    return sorted(found, key=lambda e: (e.get("firstTimestamp", ""), e["metadata"]["name"]))
