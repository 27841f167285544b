"""Hugging Face Hub models with huggingface_hub's own ``hf_hub_download`` / ``snapshot_download``.

Files land in the repo directory as in the repo (``local_dir``), which is what engines expect.
``HF_ENDPOINT`` (mirrors, a local hub) is read at every load, ``HF_TOKEN`` is sent when set.
A connection that breaks mid-file is resumed by the hub client with a Range request.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from llmplane.loader.errors import (
    DOWNLOAD_FAILED,
    NETWORK_ERROR,
    NOT_FOUND,
    UNAUTHORIZED,
    LoadError,
    causes,
    from_os_error,
    require,
)
from llmplane.loader.locate import HubModel
from llmplane.loader.progress import Progress

_PURPOSE = "Loading from the Hugging Face Hub"


def fetch(model: HubModel, local_dir: Path, progress: Progress) -> None:
    hub = require("huggingface_hub", _PURPOSE)
    endpoint = os.environ.get("HF_ENDPOINT") or None
    bar = progress_bar_class(progress)
    try:
        if model.filename is not None:
            hub.hf_hub_download(
                model.model_id,
                model.filename,
                revision=model.revision,
                local_dir=local_dir,
                endpoint=endpoint,
                tqdm_class=bar,
            )
        else:
            hub.snapshot_download(
                model.model_id,
                revision=model.revision,
                local_dir=local_dir,
                allow_patterns=list(model.allow_patterns) if model.allow_patterns else None,
                ignore_patterns=list(model.ignore_patterns) if model.ignore_patterns else None,
                endpoint=endpoint,
                tqdm_class=bar,
            )
    except Exception as err:
        raise translate(err, model) from err
    if model.filename is None:
        present = snapshot_files(local_dir)
        matching = hub.utils.filter_repo_objects(
            present, allow_patterns=model.allow_patterns, ignore_patterns=model.ignore_patterns
        )
        if not list(matching):
            raise LoadError(
                NOT_FOUND, f"no file of {model.model_id}@{model.revision} {_patterns(model)}"
            )


def snapshot_files(local_dir: Path) -> list[str]:
    """Files of the repo in ``local_dir`` (not the hub's ``.cache`` nor our marker)."""
    if not local_dir.is_dir():
        return []
    return [
        p.relative_to(local_dir).as_posix()
        for p in local_dir.rglob("*")
        if p.is_file()
        and p.relative_to(local_dir).parts[0] != ".cache"
        and not p.name.startswith(".llmplane")
    ]


def _patterns(model: HubModel) -> str:
    if not model.allow_patterns and not model.ignore_patterns:
        return "exists (empty repository)"
    return (
        f"matches allowPatterns {list(model.allow_patterns or [])} "
        f"and ignorePatterns {list(model.ignore_patterns or [])}"
    )


def translate(err: Exception, model: HubModel) -> LoadError:
    """huggingface_hub's exceptions (often wrapped in LocalEntryNotFoundError) as LoadError."""
    errors = require("huggingface_hub.errors", _PURPOSE)
    transport_errors = _transport_errors()
    repo = f"{model.model_id}@{model.revision}"
    for cause in causes(err):
        if isinstance(cause, errors.GatedRepoError):
            return LoadError(
                UNAUTHORIZED,
                f"{repo} is gated: accept its terms on the Hub and set HF_TOKEN to a token with access",
            )
        if isinstance(cause, errors.RepositoryNotFoundError):
            hint = "" if os.environ.get("HF_TOKEN") else " (a private repo needs HF_TOKEN)"
            return LoadError(NOT_FOUND, f"repository {model.model_id!r} not found{hint}")
        if isinstance(cause, errors.RevisionNotFoundError):
            return LoadError(
                NOT_FOUND, f"revision {model.revision!r} of {model.model_id!r} not found"
            )
        if isinstance(cause, errors.RemoteEntryNotFoundError):
            return LoadError(NOT_FOUND, f"file {_file_of(cause, model)!r} not found in {repo}")
        if isinstance(cause, errors.HfHubHTTPError) and cause.response is not None:
            status = cause.response.status_code
            if status in (401, 403):
                return LoadError(UNAUTHORIZED, f"{repo}: HTTP {status}: check HF_TOKEN")
            if status == 404:
                return LoadError(NOT_FOUND, f"{repo}: HTTP 404 for {cause.response.url}")
            return LoadError(DOWNLOAD_FAILED, f"{repo}: HTTP {status} from the hub")
        if isinstance(cause, transport_errors):
            return LoadError(NETWORK_ERROR, f"{repo}: cannot reach the hub: {cause}")
        if isinstance(cause, errors.OfflineModeIsEnabled):
            return LoadError(NETWORK_ERROR, f"{repo}: HF_HUB_OFFLINE is set and it is not cached")
        if isinstance(cause, ConnectionError | TimeoutError):
            return LoadError(NETWORK_ERROR, f"{repo}: {cause}")
    if isinstance(err, errors.LocalEntryNotFoundError):
        return LoadError(NETWORK_ERROR, f"{repo}: cannot reach the hub ({err})")
    if isinstance(err, OSError) and err.errno is not None:
        return from_os_error(err, str(model.model_id))
    return LoadError(DOWNLOAD_FAILED, f"{repo}: {type(err).__name__}: {err}")


def _file_of(err: Any, model: HubModel) -> str:
    url = str(getattr(getattr(err, "response", None), "url", "") or "")
    marker = f"/resolve/{model.revision}/"
    return url.split(marker, 1)[1] if marker in url else (model.filename or url)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level errors of the HTTP client huggingface_hub uses (httpx2 in 2.x, httpx in 1.x)."""
    found: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def progress_bar_class(progress: Progress) -> type:
    """A silent tqdm for huggingface_hub that adds downloaded bytes to ``progress``.

    Byte bars are the per-file bar of ``hf_hub_download`` and the aggregated bar of
    ``snapshot_download`` (whose total grows as files start); the files-count bar and the
    "transfer" twin of the aggregated bar are ignored so nothing is counted twice.
    """
    tqdm_base = require("huggingface_hub.utils", _PURPOSE).tqdm

    class _Bar(tqdm_base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            name = kwargs.get("name") or ""
            self.__dict__["_counts"] = kwargs.get("unit") == "B" and not name.endswith(".transfer")
            self.__dict__["_total"] = None
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            if self._counts and kwargs.get("initial"):
                progress.advance(int(kwargs["initial"]))

        @property
        def total(self) -> Any:
            return self.__dict__.get("_total")

        @total.setter
        def total(self, value: Any) -> None:
            old = self.__dict__.get("_total")
            self.__dict__["_total"] = value
            if self.__dict__.get("_counts"):
                delta = int(value or 0) - int(old or 0)
                if delta:
                    progress.add_total(delta)

        def update(self, n: float | None = 1) -> bool | None:
            if self._counts and n:
                progress.advance(int(n))
            return None

        def update_transfer(self, n: float | None = 1) -> None:
            return None

        def close(self) -> None:
            return None

    return _Bar
