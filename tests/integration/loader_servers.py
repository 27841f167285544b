"""Local servers that speak the protocols the model loader's real clients use.

Used by the ``test_loader_*`` modules (``test_loader_servers.py`` checks the fakes themselves):

- ``FakeHub``: the parts of the Hugging Face Hub file API huggingface_hub calls
  (``/api/models/{repo}/revision/{rev}``, ``/api/models/{repo}/tree/{rev}``, HEAD/GET
  ``/{repo}/resolve/{rev}/{file}`` with ETag, X-Repo-Commit, Content-Length, Range).
- ``FakeOSS``: Aliyun OSS path-style HEAD/GET object (with Range) and ListObjects, as oss2 calls it.
- ``FakeGCS``: the GCS JSON API objects get/list and media download (with Range), as
  google-cloud-storage calls it under ``STORAGE_EMULATOR_HOST``.
- ``FakeModelScope``: ModelScope's file listing and file download API, as modelscope calls it
  under ``MODELSCOPE_ENDPOINT``.
- ``MotoS3``: moto's S3 server with a WSGI middleware that records every request.

All bind 127.0.0.1 on a free port and run in a background thread (the loader is synchronous).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any
from urllib.parse import quote, unquote

import pytest
from aiohttp import web


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    query: dict[str, str] = field(default_factory=dict)


class ThreadedApp:
    """An aiohttp application served from its own event loop thread."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner = web.AppRunner(app, handle_signals=False, access_log=None)
        self.port = 0

    def start(self) -> ThreadedApp:
        self.thread.start()

        async def setup() -> int:
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            server = site._server
            assert server is not None
            return int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

        self.port = asyncio.run_coroutine_threadsafe(setup(), self.loop).result(10)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``bytes=a-`` / ``bytes=a-b`` -> (start, end inclusive)."""
    if not header or not header.startswith("bytes="):
        return None
    start_text, _, end_text = header[len("bytes=") :].partition("-")
    start = int(start_text)
    end = int(end_text) if end_text else size - 1
    return start, min(end, size - 1)


async def send_bytes(
    request: web.Request,
    data: bytes,
    headers: dict[str, str],
    drop_after: int | None = None,
    honour_range: bool = True,
) -> web.StreamResponse:
    """Serve ``data`` honouring Range; with ``drop_after`` close the connection mid-body."""
    size = len(data)
    span = parse_range(request.headers.get("Range"), size) if honour_range else None
    status = 200
    start, end = 0, size - 1
    if span is not None:
        start, end = span
        if start >= size:
            return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"})
        status = 206
        headers = {**headers, "Content-Range": f"bytes {start}-{end}/{size}"}
    body = data[start : end + 1]
    response = web.StreamResponse(status=status, headers=headers)
    response.content_length = len(body)
    if request.method == "HEAD":
        await response.prepare(request)
        return response
    await response.prepare(request)
    if drop_after is not None and drop_after < len(body):
        await response.write(body[:drop_after])
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()  # the client sees a body shorter than Content-Length
        return response
    await response.write(body)
    await response.write_eof()
    return response


# Hugging Face Hub ---------------------------------------------------------------------------


@dataclass
class HubRepo:
    files: dict[str, bytes]
    commit: str
    revisions: dict[str, str] = field(default_factory=dict)  # name -> commit
    private: bool = False


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.requests: list[Seen] = []
        self.token: str | None = None  # when set, every request must carry it
        self.drop_once: dict[str, int] = {}  # filename -> bytes sent before the first GET breaks
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.server = ThreadedApp(app)

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes],
        revisions: dict[str, dict[str, bytes]] | None = None,
    ) -> HubRepo:
        commit = hashlib.sha1(repo_id.encode()).hexdigest()
        repo = HubRepo(dict(files), commit, {"main": commit})
        for name, other_files in (revisions or {}).items():
            other = hashlib.sha1(f"{repo_id}@{name}".encode()).hexdigest()
            repo.revisions[name] = other
            self.repos[f"{repo_id}@{other}"] = HubRepo(dict(other_files), other)
        self.repos[repo_id] = repo
        return repo

    def gets(self, suffix: str = "") -> list[Seen]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith(suffix)]

    def _files(self, repo_id: str, rev: str) -> tuple[str, dict[str, bytes]] | None:
        repo = self.repos[repo_id]
        commit = repo.revisions.get(rev, rev)
        if commit == repo.commit:
            return commit, repo.files
        other = self.repos.get(f"{repo_id}@{commit}")
        return (commit, other.files) if other else None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.requests.append(Seen(request.method, path, dict(request.headers), dict(request.query)))
        if self.token is not None:
            auth = request.headers.get("Authorization")
            if auth is None:
                return web.Response(status=401, headers={"X-Error-Code": "RepoNotFound"})
            if auth != f"Bearer {self.token}":
                return web.Response(
                    status=401,
                    headers={"X-Error-Message": "Invalid credentials in Authorization header"},
                )
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            repo_id, action, rev = "/".join(parts[2:4]), parts[4], unquote(parts[5])
            if repo_id not in self.repos:
                return web.Response(status=404, headers={"X-Error-Code": "RepoNotFound"})
            found = self._files(repo_id, rev)
            if found is None:
                return web.Response(status=404, headers={"X-Error-Code": "RevisionNotFound"})
            commit, files = found
            if action == "revision":
                return web.json_response(
                    {"id": repo_id, "sha": commit, "siblings": [{"rfilename": f} for f in files]}
                )
            if action == "tree":
                return web.json_response(
                    [
                        {
                            "type": "file",
                            "path": name,
                            "size": len(data),
                            "oid": hashlib.sha1(data).hexdigest(),
                        }
                        for name, data in sorted(files.items())
                    ]
                )
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id, rev, filename = "/".join(parts[:2]), unquote(parts[3]), "/".join(parts[4:])
            if repo_id not in self.repos:
                return web.Response(status=404, headers={"X-Error-Code": "RepoNotFound"})
            found = self._files(repo_id, rev)
            if found is None:
                return web.Response(status=404, headers={"X-Error-Code": "RevisionNotFound"})
            commit, files = found
            if filename not in files:
                return web.Response(
                    status=404, headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit}
                )
            data = files[filename]
            headers = {
                "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                "X-Repo-Commit": commit,
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            drop = None
            if request.method == "GET" and filename in self.drop_once:
                drop = self.drop_once.pop(filename)
            return await send_bytes(request, data, headers, drop)
        return web.Response(status=404)


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    hub = FakeHub()
    hub.server.start()
    monkeypatch.setenv("HF_ENDPOINT", hub.server.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield hub
    hub.server.stop()


# Aliyun OSS ---------------------------------------------------------------------------------


class FakeOSS:
    """Path-style OSS: ``/{bucket}/{key}`` objects and ``/{bucket}/?prefix=`` listings (XML)."""

    def __init__(self) -> None:
        self.buckets: dict[str, dict[str, bytes]] = {}
        self.requests: list[Seen] = []
        self.access_key_id: str | None = None  # when set, requests must be signed with it
        self.drop_once: dict[str, int] = {}
        self.ignore_range = False  # answer Range requests with 200 and the whole object
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.server = ThreadedApp(app)

    def gets(self, key: str) -> list[Seen]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + key)]

    def _error(self, status: int, code: str, message: str) -> web.Response:
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            "<RequestId>0001</RequestId><HostId>localhost</HostId></Error>"
        )
        return web.Response(
            status=status,
            body=body.encode(),
            headers={"Content-Type": "application/xml", "x-oss-request-id": "0001"},
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(
            Seen(request.method, request.path, dict(request.headers), dict(request.query))
        )
        if self.access_key_id is not None:
            auth = request.headers.get("Authorization", "")
            if not auth.startswith(f"OSS {self.access_key_id}:") and (
                f"Credential={self.access_key_id}/" not in auth
            ):
                return self._error(
                    403, "InvalidAccessKeyId", "The OSS Access Key Id you provided does not exist."
                )
        bucket, _, key = request.path.lstrip("/").partition("/")
        key = unquote(key)
        if bucket not in self.buckets:
            return self._error(404, "NoSuchBucket", "The specified bucket does not exist.")
        objects = self.buckets[bucket]
        if not key:
            prefix = request.query.get("prefix", "")
            contents = "".join(
                f"<Contents><Key>{quote(k)}</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified>"
                f'<ETag>"{hashlib.md5(v).hexdigest().upper()}"</ETag><Type>Normal</Type>'
                f"<Size>{len(v)}</Size><StorageClass>Standard</StorageClass></Contents>"
                for k, v in sorted(objects.items())
                if k.startswith(prefix)
            )
            body = (
                '<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult>'
                f"<Name>{bucket}</Name><Prefix>{quote(prefix)}</Prefix><Marker></Marker>"
                "<MaxKeys>100</MaxKeys><Delimiter></Delimiter><EncodingType>url</EncodingType>"
                f"<IsTruncated>false</IsTruncated>{contents}</ListBucketResult>"
            )
            return web.Response(body=body.encode(), headers={"Content-Type": "application/xml"})
        if key not in objects:
            return self._error(404, "NoSuchKey", "The specified key does not exist.")
        data = objects[key]
        headers = {
            "ETag": f'"{hashlib.md5(data).hexdigest().upper()}"',
            "Last-Modified": formatdate(usegmt=True),
            "Content-Type": "application/octet-stream",
            "x-oss-object-type": "Normal",
            "x-oss-request-id": "0001",
            "Accept-Ranges": "bytes",
        }
        drop = self.drop_once.pop(key, None) if request.method == "GET" else None
        return await send_bytes(request, data, headers, drop, honour_range=not self.ignore_range)


@pytest.fixture
def fake_oss(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOSS]:
    oss = FakeOSS()
    oss.server.start()
    monkeypatch.delenv("OSS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("OSS_ACCESS_KEY_SECRET", raising=False)
    yield oss
    oss.server.stop()


# Google Cloud Storage -----------------------------------------------------------------------


class FakeGCS:
    """JSON API: ``/storage/v1/b/{b}/o[/{o}]`` and media ``/download/storage/v1/b/{b}/o/{o}?alt=media``."""

    def __init__(self) -> None:
        self.buckets: dict[str, dict[str, bytes]] = {}
        self.requests: list[Seen] = []
        self.drop_once: dict[str, int] = {}
        self.deny = False  # answer 401 like GCS does for bad credentials
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.server = ThreadedApp(app)

    def media_gets(self, name: str) -> list[Seen]:
        return [
            r
            for r in self.requests
            if r.method == "GET"
            and r.query.get("alt") == "media"
            and r.path.endswith("/o/" + quote(name, safe=""))
        ]

    def _resource(self, bucket: str, name: str, data: bytes) -> dict[str, Any]:
        return {
            "kind": "storage#object",
            "bucket": bucket,
            "name": name,
            "size": str(len(data)),
            "generation": "1",
            "etag": hashlib.md5(data).hexdigest(),
            "md5Hash": "",
            "contentType": "application/octet-stream",
        }

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response(
            {"error": {"code": status, "message": message, "errors": [{"message": message}]}},
            status=status,
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = request.raw_path.split("?", 1)[0]
        self.requests.append(Seen(request.method, raw, dict(request.headers), dict(request.query)))
        if self.deny:
            return self._error(401, "Invalid Credentials")
        parts = raw.strip("/").split("/")
        media = parts[:1] == ["download"]
        if media:
            parts = parts[1:]
        if parts[:3] != ["storage", "v1", "b"] or len(parts) < 5 or parts[4] != "o":
            return self._error(404, "Not Found")
        bucket = unquote(parts[3])
        if bucket not in self.buckets:
            return self._error(404, "The specified bucket does not exist.")
        objects = self.buckets[bucket]
        if len(parts) == 5:
            prefix = request.query.get("prefix", "")
            items = [
                self._resource(bucket, k, v)
                for k, v in sorted(objects.items())
                if k.startswith(prefix)
            ]
            return web.json_response({"kind": "storage#objects", "items": items})
        name = unquote("/".join(parts[5:]))
        if name not in objects:
            return self._error(404, "No such object: " + f"{bucket}/{name}")
        data = objects[name]
        if not media and request.query.get("alt") != "media":
            return web.json_response(self._resource(bucket, name, data))
        headers = {
            "Content-Type": "application/octet-stream",
            "x-goog-generation": "1",
            "ETag": hashlib.md5(data).hexdigest(),
        }
        drop = self.drop_once.pop(name, None)
        return await send_bytes(request, data, headers, drop)


@pytest.fixture
def fake_gcs(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGCS]:
    gcs = FakeGCS()
    gcs.server.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.server.url)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    yield gcs
    gcs.server.stop()


# ModelScope ---------------------------------------------------------------------------------


class FakeModelScope:
    """``/api/v1/models/{id}/repo/files`` listings and ``/api/v1/models/{id}/repo?FilePath=`` files."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.requests: list[Seen] = []
        self.token: str | None = None
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.server = ThreadedApp(app)

    def file_gets(self, name: str) -> list[Seen]:
        return [r for r in self.requests if r.query.get("FilePath") == name]

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response(
            {"Code": status, "Message": message, "Success": False}, status=status
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(
            Seen(request.method, request.path, dict(request.headers), dict(request.query))
        )
        parts = request.path.strip("/").split("/")
        if parts[:3] != ["api", "v1", "models"] or len(parts) < 6:
            return self._error(404, "not found")
        if (
            self.token is not None
            and request.headers.get("Authorization") != f"Bearer {self.token}"
        ):
            return self._error(401, "authentication failed")
        repo_id = "/".join(parts[3:5])
        files = self.repos.get(repo_id)
        if files is None:
            return self._error(404, f"model {repo_id} not found")
        if parts[5:] == ["repo", "files"]:
            listing = [
                {
                    "Name": name.rsplit("/", 1)[-1],
                    "Path": name,
                    "Size": len(data),
                    "Sha256": hashlib.sha256(data).hexdigest(),
                    "Type": "blob",
                }
                for name, data in sorted(files.items())
            ]
            return web.json_response({"Code": 200, "Success": True, "Data": {"Files": listing}})
        if parts[5:] == ["repo"]:
            name = request.query.get("FilePath", "")
            if name not in files:
                return self._error(404, f"file {name} not found")
            return await send_bytes(
                request, files[name], {"Content-Type": "application/octet-stream"}
            )
        return self._error(404, "not found")


@pytest.fixture
def fake_modelscope(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelScope]:
    ms = FakeModelScope()
    ms.server.start()
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", ms.server.url)
    monkeypatch.delenv("MODELSCOPE_DOMAIN", raising=False)
    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    yield ms
    ms.server.stop()


# S3 (moto) ----------------------------------------------------------------------------------


class MotoS3:
    """moto's server app behind a recording WSGI middleware, on 127.0.0.1."""

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

        self.requests: list[Seen] = []
        app = DomainDispatcherApplication(create_backend_app)
        self.server = make_server(
            "127.0.0.1", 0, self._recording(app), threaded=True, request_handler=Quiet
        )
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _recording(self, app: Callable[..., Any]) -> Callable[..., Any]:
        def middleware(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            headers = {
                k[5:].replace("_", "-").title(): v
                for k, v in environ.items()
                if k.startswith("HTTP_")
            }
            self.requests.append(
                Seen(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), headers)
            )
            return app(environ, start_response)

        return middleware

    def gets(self, key: str) -> list[Seen]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + key)]

    def start(self) -> MotoS3:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(10)


@pytest.fixture
def moto_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoS3]:
    server = MotoS3().start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    yield server
    server.stop()
