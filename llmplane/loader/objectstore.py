"""Downloading an object or a prefix from s3 / oss / gcs into the cache, resumably.

Each store module supplies an ``ObjectStore`` (stat, list, ranged read, error translation); the
rest is shared: a URI names one object if an object with that exact key exists, else every
object under ``path/``. Every file is written to ``<file>.part`` and renamed when complete; the
object's ETag is kept in ``<file>.part.etag`` so an interrupted download continues from its
byte offset (a Range request) only when the object has not changed since.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from llmplane.loader import cache
from llmplane.loader.errors import (
    DOWNLOAD_FAILED,
    NETWORK_ERROR,
    NOT_FOUND,
    LoadError,
    from_os_error,
)
from llmplane.loader.locate import StoredObject
from llmplane.loader.progress import Progress

log = logging.getLogger(__name__)

CHUNK = 1 << 20
RETRIES = 3  # reconnects within one load when a connection breaks mid-file


@dataclass(frozen=True)
class RemoteObject:
    key: str
    size: int
    etag: str | None = None


class ObjectStore(Protocol):
    def stat(self, key: str) -> RemoteObject | None:
        """The object with exactly this key, or None."""
        ...

    def list(self, prefix: str) -> list[RemoteObject]:
        """Every object whose key starts with ``prefix``."""
        ...

    def download(self, obj: RemoteObject, offset: int, sink: Callable[[bytes], None]) -> None:
        """Pass the object's bytes from ``offset`` to the end to ``sink``, in order, in chunks."""
        ...

    def translate(self, err: Exception, what: str) -> LoadError:
        """A client library's exception as a LoadError."""
        ...


def _guard(store: ObjectStore, what: str) -> contextlib.AbstractContextManager[None]:
    @contextlib.contextmanager
    def guarded() -> Iterator[None]:
        try:
            yield
        except LoadError:
            raise
        except Exception as err:
            raise store.translate(err, what) from err

    return guarded()


def plan_files(
    store: ObjectStore, stored: StoredObject, target: Path
) -> list[tuple[RemoteObject, Path]]:
    """Which objects go to which local files."""
    with _guard(store, stored.uri):
        single = store.stat(stored.path)
    if single is not None and not single.key.endswith("/"):
        return [(single, target)]
    prefix = stored.path.rstrip("/") + "/"
    with _guard(store, stored.uri):
        listed = store.list(prefix)
    files: list[tuple[RemoteObject, Path]] = []
    for obj in listed:
        relative = obj.key[len(prefix) :]
        if not relative or obj.key.endswith("/"):
            continue  # "directory" placeholder objects
        parts = PurePosixPath(relative).parts
        if any(p in (".", "..") for p in parts) or relative.startswith("/"):
            log.warning("skipping object with unsafe key %r", obj.key)
            continue
        files.append((obj, target.joinpath(*parts)))
    if not files:
        raise LoadError(NOT_FOUND, f"{stored.uri}: no such object, and no objects under {prefix!r}")
    return files


def fetch(
    store: ObjectStore, stored: StoredObject, target: Path, cache_dir: Path, progress: Progress
) -> None:
    """Make every object of ``stored`` present under ``target``."""
    files = plan_files(store, stored, target)
    progress.set_total(sum(obj.size for obj, _ in files))
    for obj, dest in files:
        name = f"file:{dest.relative_to(cache_dir)}"
        with cache.exclusive(cache_dir, name):
            _fetch_file(store, stored, obj, dest, progress)


def skip_prefix(chunks: Iterable[bytes], n: int) -> Iterator[bytes]:
    """Drop the first ``n`` bytes: for servers that answer a Range request with the whole object."""
    for chunk in chunks:
        if n >= len(chunk):
            n -= len(chunk)
            continue
        yield chunk[n:] if n else chunk
        n = 0


def part_files(dest: Path) -> tuple[Path, Path]:
    return dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.etag")


def _fetch_file(
    store: ObjectStore, stored: StoredObject, obj: RemoteObject, dest: Path, progress: Progress
) -> None:
    what = f"{stored.proto}://{stored.bucket}/{obj.key}"
    part, etag_file = part_files(dest)
    try:
        if dest.is_file() and dest.stat().st_size == obj.size:
            progress.advance(
                obj.size, now=True
            )  # finished by an earlier, interrupted load of this prefix
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        offset = _resumable_offset(part, etag_file, obj)
        if offset == 0:
            etag_file.write_text(obj.etag or "")
        progress.advance(offset, now=True)  # kept from an interrupted load
        with open(part, "ab") as out:

            def sink(chunk: bytes) -> None:
                nonlocal offset
                out.write(chunk)
                offset += len(chunk)
                progress.advance(len(chunk))

            retries = RETRIES
            while offset < obj.size:
                before = offset
                try:
                    with _guard(store, what):
                        store.download(obj, offset, sink)
                        if offset < obj.size:
                            raise LoadError(
                                NETWORK_ERROR,
                                f"{what}: connection ended after {offset} of {obj.size} bytes",
                            )
                except LoadError as err:
                    out.flush()
                    if err.reason != NETWORK_ERROR or retries == 0:
                        raise
                    retries = retries - 1 if offset == before else RETRIES
                    log.warning("%s; resuming at byte %d", err.message, offset)
                    time.sleep(0.2 * (RETRIES - retries))
        if offset != obj.size:
            part.unlink(missing_ok=True)  # start afresh next time
            raise LoadError(DOWNLOAD_FAILED, f"{what}: got {offset} bytes, expected {obj.size}")
        os.replace(part, dest)
        etag_file.unlink(missing_ok=True)
    except LoadError:
        raise
    except OSError as err:
        raise from_os_error(err, str(dest)) from err


def _resumable_offset(part: Path, etag_file: Path, obj: RemoteObject) -> int:
    """Bytes of ``part`` that can be kept: all of them if it is from the same object version."""
    if not part.exists():
        return 0
    size = part.stat().st_size
    try:
        same = etag_file.read_text() == (obj.etag or "") and obj.etag is not None
    except OSError:
        same = False
    if not same or size > obj.size:
        part.unlink()
        return 0
    return size
