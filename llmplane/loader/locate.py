"""Where a model source lives in the cache. Pure: no network, nothing written.

Layout under the cache directory (``<state dir>/models`` by default)::

    models--org--name/                  Hugging Face repo (revision main), files as in the repo
    models--org--name@v1.0/             ... another revision (so two revisions never overwrite each other)
    modelscope/models--org--name/       ModelScope repo (same id on both hubs may differ in content)
    s3/<bucket>/<path>                  object or prefix (a prefix becomes a directory)
    oss/<bucket>/<path>
    gcs/<bucket>/<path>
    .locks/                             one lock file per model

``host://p`` is ``p`` itself, ``ollama://tag`` is the tag (the engine pulls it), and
``package://pkg/file`` is the file inside the installed package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from llmplane.api.llmaz import ModelHub, ModelSource, split_uri
from llmplane.loader.errors import INVALID_SOURCE, LoadError

HUGGINGFACE = "huggingface"
MODELSCOPE = "modelscope"
OBJECT_STORES = ("s3", "oss", "gcs")


@dataclass(frozen=True)
class HubModel:
    hub: str  # HUGGINGFACE | MODELSCOPE
    model_id: str
    revision: str = "main"
    filename: str | None = None
    allow_patterns: tuple[str, ...] | None = None
    ignore_patterns: tuple[str, ...] | None = None

    def request(self) -> str:
        """What is asked of the repo directory, as recorded in its completion marker."""
        if self.filename is not None:
            return f"file:{self.filename}"
        return "snapshot:" + json.dumps(
            {
                "allow": list(self.allow_patterns) if self.allow_patterns is not None else None,
                "ignore": list(self.ignore_patterns) if self.ignore_patterns is not None else None,
            },
            sort_keys=True,
        )


@dataclass(frozen=True)
class StoredObject:
    """An object or a prefix in s3 / oss / gcs. ``endpoint`` is set for oss (``bucket.endpoint``)."""

    proto: str
    bucket: str
    path: str
    endpoint: str | None = None

    @property
    def uri(self) -> str:
        bucket = f"{self.bucket}.{self.endpoint}" if self.endpoint else self.bucket
        return f"{self.proto}://{bucket}/{self.path}"


@dataclass(frozen=True)
class Location:
    """A model source and where it is on disk.

    ``unit`` is what one download writes and one lock guards; ``request`` is recorded in the
    unit's completion marker. Both are None for sources that are never downloaded.
    """

    kind: str  # huggingface, modelscope, s3, oss, gcs, host, ollama, package
    path: Path
    unit: Path | None = None
    request: str | None = None
    hub: HubModel | None = field(default=None, compare=False)
    stored: StoredObject | None = field(default=None, compare=False)
    address: str = ""

    @property
    def downloads(self) -> bool:
        return self.unit is not None


def hub_folder(model_id: str) -> str:
    """``org/name`` -> ``models--org--name`` (the Hugging Face cache naming llmaz uses)."""
    return "models--" + model_id.replace("/", "--")


def _safe_parts(text: str, what: str) -> tuple[str, ...]:
    parts = tuple(p for p in PurePosixPath(text).parts if p not in ("", "/"))
    if text.startswith("/") or not parts or any(p in (".", "..") for p in parts):
        raise LoadError(INVALID_SOURCE, f"{what} {text!r} must be a relative path without '..'")
    return parts


def hub_model(hub: ModelHub) -> HubModel:
    kind = HUGGINGFACE if hub.name == "Huggingface" else MODELSCOPE
    parts = _safe_parts(hub.model_id, "modelID")
    if len(parts) > 2:
        raise LoadError(INVALID_SOURCE, f"modelID {hub.model_id!r} must be 'org/name' or 'name'")
    if hub.filename is not None:
        _safe_parts(hub.filename, "filename")
    return HubModel(
        hub=kind,
        model_id=hub.model_id,
        revision=hub.revision or "main",
        filename=hub.filename,
        allow_patterns=tuple(hub.allow_patterns) if hub.allow_patterns is not None else None,
        ignore_patterns=tuple(hub.ignore_patterns) if hub.ignore_patterns is not None else None,
    )


def locate(source: ModelSource | str, cache_dir: Path | str) -> Location:
    """The Location of ``source`` (a ModelSource or a URI) under ``cache_dir``."""
    cache = Path(cache_dir)
    if isinstance(source, str):
        source = ModelSource(uri=source)
    if source.model_hub is not None and source.uri is not None:
        raise LoadError(INVALID_SOURCE, "only one of modelHub or uri may be set")
    if source.model_hub is not None:
        return _locate_hub(hub_model(source.model_hub), cache)
    if source.uri is None:
        raise LoadError(INVALID_SOURCE, "one of modelHub or uri is required")
    try:
        proto, address = split_uri(source.uri)
    except ValueError as err:
        raise LoadError(INVALID_SOURCE, str(err)) from None
    if proto == "host":
        return Location("host", Path(address), address=address)
    if proto == "ollama":
        from llmplane.loader.ollama import tag_path

        return Location("ollama", tag_path(address), address=address)
    if proto == "package":
        from llmplane.loader.package import package_file

        return Location("package", package_file(address), address=address)
    return _locate_object(_stored_object(proto, address), cache)


def _stored_object(proto: str, address: str) -> StoredObject:
    bucket_part, _, path = address.partition("/")
    endpoint = None
    if proto == "oss":
        bucket_part, _, endpoint = bucket_part.partition(".")
    _safe_parts(bucket_part, "bucket")
    _safe_parts(path, "object path")
    return StoredObject(proto, bucket_part, path.strip("/"), endpoint)


def _locate_hub(hub: HubModel, cache: Path) -> Location:
    folder = hub_folder(hub.model_id)
    if hub.revision != "main":
        folder += "@" + hub.revision.replace("/", "--")
    unit = cache / folder if hub.hub == HUGGINGFACE else cache / MODELSCOPE / folder
    path = unit / hub.filename if hub.filename else unit
    return Location(hub.hub, path, unit=unit, request=hub.request(), hub=hub)


def _locate_object(stored: StoredObject, cache: Path) -> Location:
    path = cache / stored.proto / stored.bucket / Path(*_safe_parts(stored.path, "object path"))
    return Location(stored.proto, path, unit=path, request=stored.uri, stored=stored)
