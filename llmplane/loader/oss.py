"""``oss://bucket.endpoint/path`` (Alibaba Cloud OSS) with oss2.

Credentials: ``OSS_ACCESS_KEY_ID`` / ``OSS_ACCESS_KEY_SECRET`` (and ``OSS_SESSION_TOKEN`` for
STS), as llmaz reads them; anonymous requests without them (public buckets). The endpoint is
reached over https, except an IP address or localhost (an emulator or private gateway), which
is reached over http.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from llmplane.loader import objectstore
from llmplane.loader.errors import (
    DOWNLOAD_FAILED,
    INVALID_SOURCE,
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

_PURPOSE = "Loading from OSS"
_UNAUTHORIZED_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "SecurityTokenExpired",
    "InvalidSecurityToken",
}


class OssStore:
    def __init__(self, bucket: str, endpoint: str) -> None:
        oss2 = require("oss2", _PURPOSE)
        self.oss2 = oss2
        key_id = os.environ.get("OSS_ACCESS_KEY_ID")
        secret = os.environ.get("OSS_ACCESS_KEY_SECRET")
        token = os.environ.get("OSS_SESSION_TOKEN")
        if key_id and secret:
            auth = oss2.StsAuth(key_id, secret, token) if token else oss2.Auth(key_id, secret)
        else:
            auth = oss2.AnonymousAuth()
        host = endpoint.split("/")[0]
        if not host:
            raise LoadError(INVALID_SOURCE, f"oss endpoint missing in {bucket}.{endpoint}")
        scheme = "http" if oss2.utils.is_ip_or_localhost(host) else "https"
        self.bucket = oss2.Bucket(auth, f"{scheme}://{host}", bucket, connect_timeout=10)

    def stat(self, key: str) -> RemoteObject | None:
        try:
            head = self.bucket.head_object(key)
        except self.oss2.exceptions.NotFound as err:
            if err.code == "NoSuchBucket":
                raise
            return None
        return RemoteObject(key, int(head.content_length), head.etag)

    def list(self, prefix: str) -> list[RemoteObject]:
        return [
            RemoteObject(item.key, int(item.size), item.etag)
            for item in self.oss2.ObjectIterator(self.bucket, prefix=prefix)
        ]

    def download(self, obj: RemoteObject, offset: int, sink: Callable[[bytes], None]) -> None:
        result = self.bucket.get_object(obj.key, byte_range=(offset, None) if offset else None)
        try:
            chunks = iter(lambda: result.read(objectstore.CHUNK), b"")
            if offset and result.status != 206:
                chunks = objectstore.skip_prefix(chunks, offset)  # Range ignored: 200, whole object
            for chunk in chunks:
                sink(chunk)
        finally:
            result.close()

    def translate(self, err: Exception, what: str) -> LoadError:
        exceptions = self.oss2.exceptions
        for cause in causes(err):
            if isinstance(cause, exceptions.RequestError):
                return LoadError(NETWORK_ERROR, f"{what}: {cause.exception}")
            if isinstance(cause, exceptions.OssError) and cause.status > 0:
                code = cause.code or str(cause.status)
                detail = f"{what}: {code}: {cause.message or cause.status}"
                if cause.status in (401, 403) or cause.code in _UNAUTHORIZED_CODES:
                    return LoadError(UNAUTHORIZED, detail)
                if cause.status == 404:
                    return LoadError(NOT_FOUND, detail)
                return LoadError(DOWNLOAD_FAILED, detail)
            module = type(cause).__module__
            if module.startswith(("requests", "urllib3")) or isinstance(cause, ConnectionError):
                return LoadError(NETWORK_ERROR, f"{what}: {cause}")
        return LoadError(DOWNLOAD_FAILED, f"{what}: {err}")


def fetch(stored: StoredObject, target: Path, cache_dir: Path, progress: Progress) -> None:
    store = OssStore(stored.bucket, stored.endpoint or "")
    objectstore.fetch(store, stored, target, cache_dir, progress)
