"""ModelScope models with the modelscope library's ``snapshot_download`` / ``model_file_download``.

``MODELSCOPE_ENDPOINT`` and ``MODELSCOPE_API_TOKEN`` are read at every load (the library
itself also honours the older ``MODELSCOPE_DOMAIN``). llmaz's default revision ``main`` means "the library's default"
here: ModelScope repos use ``master``.
"""

from __future__ import annotations

import os
from fnmatch import fnmatch
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

_PURPOSE = "Loading from ModelScope"
_UNAUTHORIZED = {"AuthenticationError", "PermissionDeniedError", "NotLoginException"}
_NOT_FOUND = {"NotExistError", "NoValidRevisionError", "FileNotFoundError", "RepoNotFoundError"}
_NETWORK = {"NetworkError", "RequestTimeoutError", "ConnectionError", "Timeout", "TimeoutError"}


def fetch(model: HubModel, local_dir: Path, progress: Progress) -> None:
    snapshot = require("modelscope.hub.snapshot_download", _PURPOSE)
    files = require("modelscope.hub.file_download", _PURPOSE)
    revision = None if model.revision in ("", "main") else model.revision
    # Read at every load: the library keeps the settings of its first call for the process.
    endpoint = os.environ.get("MODELSCOPE_ENDPOINT") or None
    token = os.environ.get("MODELSCOPE_API_TOKEN") or None
    try:
        if model.filename is not None:
            files.model_file_download(
                model.model_id,
                model.filename,
                revision=revision,
                local_dir=str(local_dir),
                endpoint=endpoint,
                token=token,
            )
        else:
            snapshot.snapshot_download(
                model.model_id,
                revision=revision,
                local_dir=str(local_dir),
                allow_patterns=list(model.allow_patterns) if model.allow_patterns else None,
                ignore_patterns=list(model.ignore_patterns) if model.ignore_patterns else None,
                progress_callbacks=[progress_callback_class(progress)],
                endpoint=endpoint,
                token=token,
            )
    except Exception as err:
        raise translate(err, model) from err
    if model.filename is None and not _any_match(local_dir, model):
        raise LoadError(
            NOT_FOUND,
            f"no file of {model.model_id} matches allowPatterns {list(model.allow_patterns or [])} "
            f"and ignorePatterns {list(model.ignore_patterns or [])}",
        )


def _any_match(local_dir: Path, model: HubModel) -> bool:
    from llmplane.loader.huggingface import snapshot_files

    for name in snapshot_files(local_dir):
        if name.startswith("._"):  # modelscope's temporary files
            continue
        if model.allow_patterns and not any(fnmatch(name, p) for p in model.allow_patterns):
            continue
        if model.ignore_patterns and any(fnmatch(name, p) for p in model.ignore_patterns):
            continue
        return True
    return False


def progress_callback_class(progress: Progress) -> type:
    """A ModelScope ``ProgressCallback`` (instantiated per file) feeding ``progress``."""

    class _Callback:
        def __init__(self, filename: str, file_size: int) -> None:
            self.filename = filename
            if file_size:
                progress.add_total(int(file_size))

        def update(self, size: int) -> None:
            progress.advance(int(size))

        def end(self) -> None:
            return None

    return _Callback


def translate(err: Exception, model: HubModel) -> LoadError:
    repo = f"{model.model_id}@{model.revision}"
    for cause in causes(err):
        names = {cls.__name__ for cls in type(cause).__mro__}
        module = type(cause).__module__
        status = _status(cause)
        if names & _UNAUTHORIZED or status in (401, 403):
            return LoadError(UNAUTHORIZED, f"{repo}: {cause} (check MODELSCOPE_API_TOKEN)")
        if names & _NOT_FOUND or status == 404:
            return LoadError(NOT_FOUND, f"{repo}: {cause}")
        if names & _NETWORK or module.startswith(("requests", "urllib3", "httpx")):
            return LoadError(NETWORK_ERROR, f"{repo}: cannot reach ModelScope: {cause}")
    if isinstance(err, OSError) and err.errno is not None:
        return from_os_error(err, model.model_id)
    return LoadError(DOWNLOAD_FAILED, f"{repo}: {type(err).__name__}: {err}")


def _status(err: BaseException) -> int | None:
    response: Any = getattr(err, "response", None)
    status = getattr(response, "status_code", None) or getattr(err, "status_code", None)
    return status if isinstance(status, int) else None
