"""What an apply does with API-owned fields (``Resource.api_owned``: a Tenant's ``spec.keys``).

Kubernetes' server-side apply tracks which field manager owns each field: an apply that leaves
out a field another manager set keeps it, and one that would change it is a conflict unless
forced. llmplane has two managers per object, the user's files and its own commands
(``llmplane keys``), and the kinds declare which fields the commands own, so this needs no
per-object bookkeeping:

- the object leaves the field out: the stored value is kept;
- the object gives it: it may add to it (new items of a keyed list, a value where none was
  stored) but not drop or change what is stored: ``OwnedFieldConflict``, nothing is written;
- ``force``: the object's value replaces the stored one, like any other field (what the
  commands that own the field do, and ``llmplane apply --force-conflicts``).
"""

from __future__ import annotations

from typing import Any

from llmplane.api.base import ApiOwned
from llmplane.api.registry import KINDS
from llmplane.store.base import StoreError, ref

_MISSING = object()


class OwnedFieldConflict(StoreError):
    """An apply would drop or change what llmplane's own commands wrote into the object."""


def owned_fields(kind: str) -> tuple[ApiOwned, ...]:
    cls = KINDS.get(kind)
    return cls.api_owned if cls is not None else ()


def _get(obj: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


def _put(obj: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        child = obj.get(part)
        if not isinstance(child, dict):
            child = obj[part] = {}
        obj = child
    obj[path[-1]] = value


def _losses(stored: Any, given: Any, list_key: str | None) -> list[str]:
    """What applying ``given`` over ``stored`` would lose, in words; [] when nothing."""
    if stored in (None, [], {}, "") or stored == given:
        return []
    if list_key is None or not isinstance(stored, list) or not isinstance(given, list):
        return ["replace it"]
    by_key = {item.get(list_key): item for item in given if isinstance(item, dict)}
    lost = []
    for item in stored:
        key = item.get(list_key) if isinstance(item, dict) else None
        if key not in by_key:
            lost.append(f"remove {key!r}")
        elif by_key[key] != item:
            lost.append(f"change {key!r}")
    return lost


def keep_owned(current: dict[str, Any] | None, desired: dict[str, Any], force: bool) -> None:
    """Put into ``desired`` (the object about to be stored over ``current``) the API-owned
    fields it leaves out; raise ``OwnedFieldConflict`` if it would drop or change them."""
    if current is None:
        return
    kind, meta = desired["kind"], desired["metadata"]
    for owned in owned_fields(kind):
        path = owned.path.split(".")
        stored = _get(current, path)
        if stored is _MISSING:
            continue
        given = _get(desired, path)
        if given is _MISSING:
            _put(desired, path, stored)
            continue
        lost = [] if force else _losses(stored, given, owned.list_key)
        if lost:
            raise OwnedFieldConflict(
                f"{ref(kind, meta['name'], meta.get('namespace'))}: {owned.path} is written by "
                f"`{owned.writer}`, and this apply would {', '.join(lost)}; leave "
                f"{owned.path} out of the file to keep it as stored, or pass --force-conflicts "
                "to replace it with the file's"
            )
