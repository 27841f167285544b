"""``s3://bucket/path`` with boto3.

Credentials and endpoint come from boto3's usual places (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / profiles / instance roles; ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL`` for MinIO and other S3-compatible stores). Without any credentials the
requests are unsigned, which is how public buckets are read.
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

_UNAUTHORIZED_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
    "401",
    "403",
}
_NOT_FOUND_CODES = {"NoSuchBucket", "NoSuchKey", "NotFound", "404"}


class S3Store:
    def __init__(self, bucket: str) -> None:
        boto3 = require("boto3", "Loading from S3")
        botocore_config = require("botocore.config", "Loading from S3")
        self._exceptions = require("botocore.exceptions", "Loading from S3")
        self.bucket = bucket
        session = boto3.session.Session()
        config = botocore_config.Config(
            retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10, read_timeout=60
        )
        if session.get_credentials() is None:
            botocore = require("botocore", "Loading from S3")
            config = config.merge(botocore_config.Config(signature_version=botocore.UNSIGNED))
        self.client: Any = session.client("s3", config=config)

    def stat(self, key: str) -> RemoteObject | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
        except self._exceptions.ClientError as err:
            if _code(err) in _NOT_FOUND_CODES:
                return None
            raise
        return RemoteObject(key, int(head["ContentLength"]), head.get("ETag"))

    def list(self, prefix: str) -> list[RemoteObject]:
        found: list[RemoteObject] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                found.append(RemoteObject(item["Key"], int(item["Size"]), item.get("ETag")))
        return found

    def download(self, obj: RemoteObject, offset: int, sink: Callable[[bytes], None]) -> None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": obj.key}
        if offset:
            kwargs["Range"] = f"bytes={offset}-"
        response = self.client.get_object(**kwargs)
        body = response["Body"]
        try:
            chunks = body.iter_chunks(objectstore.CHUNK)
            if offset and not response.get("ContentRange"):
                chunks = objectstore.skip_prefix(chunks, offset)  # Range ignored: 200, whole object
            for chunk in chunks:
                sink(chunk)
        finally:
            body.close()

    def translate(self, err: Exception, what: str) -> LoadError:
        exc = self._exceptions
        for cause in causes(err):
            if isinstance(cause, exc.ClientError):
                code = _code(cause)
                message = cause.response.get("Error", {}).get("Message") or code
                if code in _UNAUTHORIZED_CODES:
                    return LoadError(UNAUTHORIZED, f"{what}: {code}: {message}")
                if code in _NOT_FOUND_CODES:
                    return LoadError(NOT_FOUND, f"{what}: {code}: {message}")
                return LoadError(DOWNLOAD_FAILED, f"{what}: {code}: {message}")
            if isinstance(cause, exc.NoCredentialsError | exc.PartialCredentialsError):
                return LoadError(UNAUTHORIZED, f"{what}: {cause}")
            if isinstance(cause, exc.HTTPClientError | exc.ConnectionError | ConnectionError):
                return LoadError(NETWORK_ERROR, f"{what}: {cause}")
            if type(cause).__module__.startswith("urllib3"):
                return LoadError(NETWORK_ERROR, f"{what}: {cause}")
        return LoadError(DOWNLOAD_FAILED, f"{what}: {err}")


def _code(err: Any) -> str:
    error = err.response.get("Error", {})
    code = str(error.get("Code") or "")
    status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code or str(status or "")


def fetch(stored: StoredObject, target: Path, cache_dir: Path, progress: Progress) -> None:
    objectstore.fetch(S3Store(stored.bucket), stored, target, cache_dir, progress)
