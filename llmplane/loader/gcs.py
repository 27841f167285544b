"""``gcs://bucket/path`` with google-cloud-storage.

Credentials are Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, workload
identity, gcloud); without any, requests are anonymous (public buckets).
``STORAGE_EMULATOR_HOST`` points the client at an emulator, as the library itself does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmplane.loader import objectstore
from llmplane.loader.errors import (
    DOWNLOAD_FAILED,
    NETWORK_ERROR,
    NOT_FOUND,
    UNAUTHORIZED,
    LoadError,
    causes,
    require,
)
from llmplane.loader.locate import StoredObject
from llmplane.loader.objectstore import RemoteObject
from llmplane.loader.progress import Progress

_PURPOSE = "Loading from Google Cloud Storage"


class _Sink:
    """A write-only file object for ``Blob.download_to_file`` that hands chunks on."""

    def __init__(self, sink: Callable[[bytes], None]) -> None:
        self._sink = sink

    def write(self, data: bytes) -> int:
        self._sink(bytes(data))
        return len(data)

    def flush(self) -> None:
        return None


class GcsStore:
    def __init__(self, bucket: str) -> None:
        storage = require("google.cloud.storage", _PURPOSE)
        self._api = require("google.api_core.exceptions", _PURPOSE)
        self._auth = require("google.auth.exceptions", _PURPOSE)
        try:
            client = storage.Client()
        except self._auth.DefaultCredentialsError:
            client = storage.Client.create_anonymous_client()
        self.client: Any = client
        self.bucket: Any = client.bucket(bucket)

    def stat(self, key: str) -> RemoteObject | None:
        blob = self.bucket.get_blob(key, retry=None)
        if blob is None:
            return None
        return RemoteObject(key, int(blob.size or 0), _version(blob))

    def list(self, prefix: str) -> list[RemoteObject]:
        return [
            RemoteObject(blob.name, int(blob.size or 0), _version(blob))
            for blob in self.client.list_blobs(self.bucket, prefix=prefix, retry=None)
        ]

    def download(self, obj: RemoteObject, offset: int, sink: Callable[[bytes], None]) -> None:
        blob = self.bucket.blob(obj.key)
        # Our own loop resumes at the byte offset after a broken connection (retry=None), so the
        # library's checksum of the whole object only applies to downloads from byte 0.
        blob.download_to_file(
            _Sink(sink),
            start=offset or None,
            raw_download=True,
            checksum="auto" if offset == 0 else None,
            retry=None,
        )

    def translate(self, err: Exception, what: str) -> LoadError:
        api, auth = self._api, self._auth
        for cause in causes(err):
            if isinstance(cause, api.Unauthorized | api.Forbidden):
                return LoadError(UNAUTHORIZED, f"{what}: {cause.code}: {cause.message}")
            if isinstance(cause, auth.DefaultCredentialsError | auth.RefreshError):
                return LoadError(UNAUTHORIZED, f"{what}: {cause}")
            if isinstance(cause, api.NotFound):
                return LoadError(NOT_FOUND, f"{what}: {cause.message}")
            if isinstance(cause, api.GoogleAPICallError):
                return LoadError(DOWNLOAD_FAILED, f"{what}: {cause.code}: {cause.message}")
            module = type(cause).__module__
            if module.startswith(("requests", "urllib3")) or isinstance(cause, ConnectionError):
                return LoadError(NETWORK_ERROR, f"{what}: {cause}")
            if type(cause).__name__ == "DataCorruption":
                return LoadError(DOWNLOAD_FAILED, f"{what}: checksum mismatch: {cause}")
        return LoadError(DOWNLOAD_FAILED, f"{what}: {err}")


def _version(blob: Any) -> str | None:
    """Generation identifies an object version in GCS (etag changes with metadata too)."""
    return str(blob.generation) if blob.generation is not None else blob.etag


def fetch(stored: StoredObject, target: Path, cache_dir: Path, progress: Progress) -> None:
    objectstore.fetch(GcsStore(stored.bucket), stored, target, cache_dir, progress)
