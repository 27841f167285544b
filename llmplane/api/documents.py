"""From YAML/JSON text to validated resources, or to a complete list of what is wrong.

Nothing here raises anything but ``InvalidResources`` for bad input, so callers can show the
messages and exit without a traceback, and store nothing when any document is invalid.
"""

from __future__ import annotations

import copy
import difflib
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from llmplane.api import safe_yaml
from llmplane.api.base import Resource, join_path
from llmplane.api.legacy import upgrade_legacy_fields
from llmplane.api.registry import KINDS, SERVED, to_storage

YAML_SUFFIXES = (".yaml", ".yml", ".json")


class InvalidResources(Exception):
    """Every violation found in a set of documents, one message per line."""

    def __init__(self, messages: list[str]):
        self.messages = messages
        super().__init__("\n".join(messages))


@dataclass
class Parsed:
    resources: list[Resource] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _model_at(model: type[BaseModel], loc: Iterable[str | int]) -> type[BaseModel] | None:
    """The model class found by following a pydantic error location from ``model``."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        by_alias = {(f.alias or n): f for n, f in current.model_fields.items()}
        info = by_alias.get(part) or current.model_fields.get(part)
        if info is None:
            continue  # map key
        current = _inner_model(info.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _inner_model(annotation: Any) -> Any:
    """Unwrap Optional / list / dict / Annotated down to a model class, if there is one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, dict, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = _inner_model(arg)
            if found is not None:
                return found
    return None


def _format_loc(loc: tuple[str | int, ...]) -> str:
    path = ""
    for part in loc:
        path = join_path(path, part)
    return path


def _pydantic_messages(cls: type[Resource], err: ValidationError) -> list[str]:
    out: list[str] = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        kind = e["type"]
        if kind == "extra_forbidden":
            parent = _model_at(cls, loc[:-1])
            unknown = str(loc[-1])
            msg = "unknown field"
            if parent is not None:
                names = [f.alias or n for n, f in parent.model_fields.items()]
                close = difflib.get_close_matches(unknown, names, n=1, cutoff=0.6)
                if not close:
                    lowered = {n.lower(): n for n in names}
                    close = [lowered[unknown.lower()]] if unknown.lower() in lowered else []
                if close:
                    msg += f" (did you mean {close[0]!r}?)"
            out.append(f"{_format_loc(loc)}: {msg}")
            continue
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        elif msg.startswith("Input should be "):
            msg = "must be " + msg[len("Input should be ") :]
        if kind == "missing":
            msg = "required field is missing"
        elif kind == "string_type" and isinstance(e.get("input"), bool | int | float):
            msg = f'must be a string (write it in quotes: "{_yaml_scalar(e["input"])}")'
        out.append(f"{_format_loc(loc)}: {msg}")
    return out


def _rule_messages_despite(
    cls: type[Resource], doc: dict[str, Any], err: ValidationError
) -> list[str]:
    """Cross-field rule violations of a document that also has structural errors.

    The structurally bad fields are pruned and the rest validated again, so one run lists
    every mistake instead of making the user fix them one pass at a time.
    """
    pruned = copy.deepcopy(doc)
    for _ in range(3):
        for e in err.errors(include_url=False):
            if e["type"] == "missing" or not _prune(pruned, tuple(e["loc"])):
                return []
        try:
            resource = cls.model_validate(pruned)
        except ValidationError as again:
            err = again
            continue
        return [str(v) for v in resource.violations()]
    return []


def _prune(doc: Any, loc: tuple[str | int, ...]) -> bool:
    """Remove the field (or the enclosing list's owner key) at ``loc``; False if not found."""
    parent: Any = doc
    for i, part in enumerate(loc[:-1]):
        if isinstance(loc[i + 1], int) and i + 1 == len(loc) - 1 and isinstance(parent, dict):
            return parent.pop(part, None) is not None
        try:
            parent = parent[part]
        except (KeyError, IndexError, TypeError):
            return False
    if isinstance(parent, dict) and loc and loc[-1] in parent:
        del parent[loc[-1]]
        return True
    return False


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _label(doc: dict[str, Any]) -> str:
    kind = doc.get("kind") if isinstance(doc.get("kind"), str) else "?"
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{kind}/{name if isinstance(name, str) else '?'}"


def parse_document(doc: Any, where: str = "") -> tuple[Resource, list[str]]:
    """Validate one decoded document; returns the resource (defaults applied) and warnings."""
    prefix = f"{where}: " if where else ""
    if not isinstance(doc, dict):
        raise InvalidResources([f"{prefix}a resource must be a mapping, got {type(doc).__name__}"])
    kind = doc.get("kind")
    label = _label(doc)
    if not isinstance(kind, str) or not kind:
        raise InvalidResources([f"{prefix}{label}: kind: required field is missing"])
    cls = KINDS.get(kind)
    if cls is None:
        close = difflib.get_close_matches(kind, list(KINDS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InvalidResources(
            [f"{prefix}{label}: kind: unknown kind {kind!r}{hint}; known: {', '.join(KINDS)}"]
        )
    expected = cls.api_version_string()
    api_version = doc.get("apiVersion")
    served = SERVED.get((api_version, kind)) if isinstance(api_version, str) else None
    if api_version != expected and served is None:
        accepted = [expected, *(v for v, k in SERVED if k == kind)]
        raise InvalidResources(
            [
                f"{prefix}{label}: apiVersion: must be "
                f"{' or '.join(repr(v) for v in accepted)} for {kind}, got {api_version!r}"
            ]
        )
    doc, warnings = upgrade_legacy_fields(doc)
    if served is not None and served.model is None:
        # The same schema under an older group: validated and stored as the current one.
        doc = served.to_storage(doc)
        warnings.append(f"apiVersion {api_version} is deprecated: stored as {expected}")
    elif served is not None:
        cls = served.model  # validated as written; ``to_storage`` converts it for the store
    warnings = [f"{prefix}{label}: {w}" for w in warnings]
    try:
        resource = cls.model_validate(doc)
    except ValidationError as err:
        messages = _pydantic_messages(cls, err)
        bad_paths = {m.split(": ", 1)[0] for m in messages}
        messages += [
            m for m in _rule_messages_despite(cls, doc, err) if m.split(": ", 1)[0] not in bad_paths
        ]
        raise InvalidResources([f"{prefix}{label}: {m}" for m in messages]) from None
    if cls.namespaced:
        if resource.metadata.namespace is None:
            resource.metadata.namespace = "default"
    else:
        resource.metadata.namespace = None
    violations = resource.violations()
    if violations:
        raise InvalidResources([f"{prefix}{resource.ref}: {v}" for v in violations])
    return resource, warnings


def parse_text(text: str, source: str = "<stdin>") -> Parsed:
    """All documents in a YAML or JSON text; any invalid document fails the whole text."""
    try:
        docs = [d for d in safe_yaml.load_all(text) if d is not None]
    except yaml.YAMLError as err:
        where, problem = safe_yaml.describe(err, source)
        raise InvalidResources([f"{where}: invalid YAML: {problem}"]) from None
    parsed = Parsed()
    errors: list[str] = []
    for index, doc in enumerate(_flatten_lists(docs)):
        where = source if len(docs) == 1 else f"{source}#{index + 1}"
        try:
            resource, warnings = parse_document(doc, where)
        except InvalidResources as err:
            errors.extend(err.messages)
            continue
        parsed.resources.append(resource)
        parsed.warnings.extend(warnings)
    if errors:
        raise InvalidResources(errors)
    return parsed


def _flatten_lists(docs: list[Any]) -> list[Any]:
    """``kind: List`` (what ``kubectl get -o yaml`` prints) expands to its items."""
    out: list[Any] = []
    for doc in docs:
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "List"
            and isinstance(doc.get("items"), list)
        ):
            out.extend(doc["items"])
        else:
            out.append(doc)
    return out


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files named directly, plus every YAML/JSON file under named directories (sorted)."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(
                sorted(f for f in p.rglob("*") if f.suffix in YAML_SUFFIXES and f.is_file())
            )
        else:
            files.append(p)
    return files


def parse_paths(paths: Iterable[str | Path]) -> Parsed:
    """Every document in every file; errors from all files are reported together."""
    parsed = Parsed()
    errors: list[str] = []
    for path in expand_paths(paths):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            errors.append(f"{path}: cannot read: {err.strerror or err}")
            continue
        except UnicodeDecodeError:
            errors.append(f"{path}: not a UTF-8 text file")
            continue
        try:
            one = parse_text(text, str(path))
        except InvalidResources as err:
            errors.extend(err.messages)
            continue
        parsed.resources.extend(one.resources)
        parsed.warnings.extend(one.warnings)
    if errors:
        raise InvalidResources(errors)
    return parsed


def _was_set(model: BaseModel, path: list[str]) -> bool:
    """Whether the document gave the field at ``path`` (wire names), not only its default."""
    node: Any = model
    for part in path:
        if not isinstance(node, BaseModel):
            return True  # below a free-form value: it was given with it
        name = next((n for n, f in type(node).model_fields.items() if (f.alias or n) == part), None)
        if name is None or name not in node.model_fields_set:
            return False
        node = getattr(node, name)
    return True


def _drop(data: dict[str, Any], path: list[str]) -> None:
    for part in path[:-1]:
        data = data.get(part)  # type: ignore[assignment]
        if not isinstance(data, dict):
            return
    data.pop(path[-1], None)


def stored_form(resource: Resource) -> dict[str, Any]:
    """What the store keeps: the wire form in the kind's storage version (a v1alpha2
    InferencePool becomes a v1 one)."""
    data = dump_resource(resource)
    converted = to_storage(data)
    if converted is data:
        return data
    return dump_resource(KINDS[data["kind"]].model_validate(converted))


def dump_resource(resource: Resource) -> dict[str, Any]:
    """The wire form: user's fields plus defaults, in Kubernetes' top-level key order.

    API-owned fields (``Resource.api_owned``) the document did not set are left out, not
    defaulted: an apply of it then keeps what llmplane's commands wrote there."""
    data = resource.to_dict()
    for owned in type(resource).api_owned:
        if not _was_set(resource, owned.path.split(".")):
            _drop(data, owned.path.split("."))
    ordered = {
        k: data[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in data
    }
    ordered.update({k: v for k, v in data.items() if k not in ordered})
    return ordered
