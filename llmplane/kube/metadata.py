"""The object metadata llmplane keeps from the API server, defined once.

llmplane's API models forbid unknown metadata fields, and ``managedFields`` is large: objects
read from the API keep only these keys before they are cached or parsed.
"""

from __future__ import annotations

from typing import Any

META_KEYS = (
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


def slim(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` (shallow copy) with only the ``META_KEYS`` of its metadata."""
    meta = obj.get("metadata") or {}
    return {**obj, "metadata": {k: meta[k] for k in META_KEYS if k in meta}}
