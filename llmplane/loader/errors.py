"""Why a model could not be loaded, in words the OpenModel condition and the CLI can show."""

from __future__ import annotations

import errno
import importlib
from types import ModuleType
from typing import Final

# Condition reasons (CamelCase, like Kubernetes condition reasons).
INVALID_SOURCE: Final = "InvalidSource"  # the source itself is malformed or unsupported
UNAUTHORIZED: Final = "Unauthorized"  # credentials missing, wrong or without access
NOT_FOUND: Final = "NotFound"  # repo, revision, file, bucket, key, path or package missing
NETWORK_ERROR: Final = "NetworkError"  # cannot reach the server, or the connection broke
MISSING_DEPENDENCY: Final = "MissingDependency"  # the optional client library is not installed
DISK_FULL: Final = "DiskFull"  # no space left in the cache
DOWNLOAD_FAILED: Final = "DownloadFailed"  # anything else: server errors, size mismatches

EXTRAS: Final = {
    "huggingface_hub": "hubs",
    "modelscope": "hubs",
    "boto3": "objectstores",
    "botocore": "objectstores",
    "oss2": "objectstores",
    "google.cloud.storage": "objectstores",
}


class LoadError(Exception):
    """A model source could not be made present. ``reason`` is one of the constants above."""

    def __init__(self, reason: str, message: str) -> None:
        # One line: it becomes a condition message and the CLI's single error line.
        message = " ".join(str(message).split())
        if len(message) > 1000:
            message = message[:997] + "..."
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


def require(module: str, purpose: str) -> ModuleType:
    """Import an optional client library, or fail with the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        extra = EXTRAS.get(module, "all")
        raise LoadError(
            MISSING_DEPENDENCY,
            f"{purpose} needs the Python package {module.split('.')[0]!r}: "
            f"pip install 'llmplane[{extra}]'",
        ) from err


def from_os_error(err: OSError, what: str) -> LoadError:
    """Local file-system failures while writing into the cache."""
    if err.errno == errno.ENOSPC:
        return LoadError(DISK_FULL, f"no space left on device while writing {what}")
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return LoadError(DOWNLOAD_FAILED, f"cannot write {what}: {err.strerror}")
    return LoadError(DOWNLOAD_FAILED, f"{what}: {err}")


def causes(err: BaseException) -> list[BaseException]:
    """``err`` and everything it was raised from, outermost first (client libraries wrap a lot)."""
    chain: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain
