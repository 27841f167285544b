"""The ``Store`` interface every substrate implements, and the types it shares.

Objects are plain dicts in wire form (``apiVersion``, ``kind``, ``metadata``, ``spec``,
``status``), already validated by ``llmplane.api.documents``. A store never interprets a spec;
it only owns the server fields of ``metadata`` (``uid``, ``resourceVersion``, ``generation``,
``creationTimestamp``) and keeps ``status`` apart from what users apply.

Cluster-scoped kinds (OpenModel, BackendRuntime) carry no ``metadata.namespace``; pass
``namespace=None`` (or ``""``) for them. Namespaced objects always carry one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from llmplane.store.selectors import Selector

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
LabelSelector = str | Mapping[str, Any] | Selector | None

# metadata fields only the store writes; values users send for them are ignored
# (resourceVersion is checked for optimistic concurrency, then ignored).
SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp")


def ref(kind: str, name: str, namespace: str | None = None) -> str:
    """``Kind/name`` (``Kind/namespace/name`` outside the default namespace), as in messages."""
    if namespace and namespace != "default":
        return f"{kind}/{namespace}/{name}"
    return f"{kind}/{name}"


class StoreError(Exception):
    """Anything the store refuses to do, with a message fit to show a user."""


class StoreUnavailable(StoreError):
    """The store cannot be read or written right now (disk full, another process holding its
    write lock past the busy timeout, an I/O error): nothing was changed, and the same call may
    work later."""


class Conflict(StoreError):
    """The caller's resourceVersion is stale: the object changed (or vanished) since it was read."""


class NotFound(StoreError):
    """The object does not exist."""


class InvalidObject(StoreError, ValueError):
    """The dict is not a storable object (missing kind or metadata.name, wrong types)."""


class CorruptObject(StoreError):
    """A stored row is not a readable object (damaged file, hand edits, a foreign writer).

    Lists skip such rows (and report them); reading one by name raises this; deleting it or
    applying the object again replaces it.
    """


class Expired(StoreError):
    """A watch asked to resume from a resourceVersion whose events were already compacted.

    Watch again with ``since=None`` (list + watch) to resynchronise.
    """


@dataclass(frozen=True)
class WatchEvent:
    type: EventType
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        """Resume a watch after this event with ``since=event.resource_version``."""
        return self.object["metadata"]["resourceVersion"]

    @property
    def key(self) -> tuple[str, str, str]:
        """(kind, namespace, name); namespace is ``""`` for cluster-scoped objects."""
        meta = self.object["metadata"]
        return (self.object["kind"], meta.get("namespace") or "", meta["name"])


def object_key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """(kind, namespace, name) of a wire-form object, validating just enough to store it."""
    if not isinstance(obj, Mapping):
        raise InvalidObject(f"an object must be a mapping, not {type(obj).__name__}")
    kind = obj.get("kind")
    meta = obj.get("metadata")
    if not isinstance(kind, str) or not kind:
        raise InvalidObject("object has no kind")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise InvalidObject(f"{kind} object has no metadata.name")
    namespace = meta.get("namespace") or ""
    if not isinstance(namespace, str):
        raise InvalidObject(f"{ref(kind, meta['name'])}: metadata.namespace must be a string")
    for field in ("labels", "annotations"):
        value = meta.get(field)
        if value is not None and not (
            isinstance(value, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        ):
            raise InvalidObject(
                f"{ref(kind, meta['name'], namespace)}: metadata.{field} must map strings to strings"
            )
    return kind, namespace, meta["name"]


@runtime_checkable
class Store(Protocol):
    """Where resources live. SQLite (embedded) and Kubernetes implement it.

    Every method returns fresh dicts; mutating them never changes what is stored.
    """

    def apply(self, obj: dict[str, Any], *, force_conflicts: bool = False) -> dict[str, Any]:
        """Create or update by (kind, namespace, name) and return the stored object.

        Create sets uid, resourceVersion, generation 1 and creationTimestamp. Update replaces
        spec, labels and annotations (and other user fields) with ``obj``'s and keeps status;
        generation bumps only when spec changes, resourceVersion on any change, and an apply
        that changes nothing changes nothing (no new resourceVersion, no watch event).
        A ``metadata.resourceVersion`` in ``obj`` that differs from the stored one (or any,
        when nothing is stored) raises ``Conflict``.

        API-owned fields (``Resource.api_owned``, e.g. a Tenant's ``spec.keys``) that ``obj``
        leaves out keep their stored values; ``obj`` may not drop or change them unless
        ``force_conflicts`` (``OwnedFieldConflict``; see ``llmplane/store/owned.py``).
        """
        ...

    def apply_many(
        self, objs: list[dict[str, Any]], *, force_conflicts: bool = False
    ) -> list[dict[str, Any]]:
        """``apply`` each object in ONE transaction: all are stored or none is."""
        ...

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None. ``namespace=None`` means cluster-scoped."""
        ...

    def list(
        self,
        kind: str | None = None,
        namespace: str | None = None,
        label_selector: LabelSelector = None,
    ) -> list[dict[str, Any]]:
        """Objects sorted by (namespace, name); ``None`` filters mean "any".

        ``label_selector`` is kubectl syntax (``a=b,c!=d,e,!f,g in (x,y),h notin (z)``), a
        label map, or a Kubernetes ``LabelSelector`` dict. A malformed one raises ValueError.
        """
        ...

    def delete(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """Remove the object and return it (as the DELETED event shows it), or None."""
        ...

    def update_status(
        self,
        kind: str,
        name: str,
        namespace: str | None,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """Replace status only. ``NotFound`` if missing; ``Conflict`` if ``resource_version``
        is given and stale. Bumps resourceVersion when the status changes."""
        ...

    def watch(
        self,
        kind: str | None = None,
        namespace: str | None = None,
        since: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Changes, in order, including those written by other processes.

        With ``since=None`` first yields ADDED for every existing matching object (list +
        watch), then changes. With ``since`` yields changes after that resourceVersion, or
        raises ``Expired`` if they were compacted away. Close it with ``aclose()`` (or
        ``contextlib.aclosing``) when breaking out early.
        """
        ...

    def close(self) -> None: ...
