"""The model cache on disk: who may write a model (locks) and which models are finished (markers).

A model is downloaded by one thread of one process at a time: a ``threading.Lock`` per model
inside the process, and ``fcntl.flock`` on ``<cache>/.locks/<model>.lock`` across processes
(Playgrounds of the embedded runtime, init containers sharing a volume, ``llmplane load-model``).

A finished model has a marker ``.llmplane-complete`` (JSON), so later loads return at once
without asking the network. The marker sits inside the model directory, or, for a model that is
one file, next to it as ``.<file name>.llmplane-complete``. It lists what was loaded into the
directory (one hub directory can serve several OpenModels with different files or patterns).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

MARKER = ".llmplane-complete"
LOCK_DIR = ".locks"

_registry_lock = threading.Lock()
_thread_locks: dict[str, threading.Lock] = {}


def marker_file(path: Path) -> Path | None:
    """Where the completion marker of the model at ``path`` is, or None if nothing is there."""
    if path.is_dir():
        return path / MARKER
    if path.is_file():
        return path.with_name(f".{path.name}{MARKER}")
    return None


def loaded_requests(path: Path) -> list[str]:
    marker = marker_file(path)
    if marker is None:
        return []
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return []
    requests = data.get("loaded") if isinstance(data, dict) else None
    return [r for r in requests if isinstance(r, str)] if isinstance(requests, list) else []


def is_complete(path: Path, request: str) -> bool:
    return request in loaded_requests(path)


def mark_complete(path: Path, request: str) -> None:
    marker = marker_file(path)
    if marker is None:
        raise FileNotFoundError(path)
    requests = loaded_requests(path)
    if request not in requests:
        requests.append(request)
    data = {"loaded": requests, "completedAt": datetime.now(UTC).isoformat(timespec="seconds")}
    tmp = marker.with_name(f"{marker.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, marker)


def lock_file(cache_dir: Path, name: str) -> Path:
    """``<cache>/.locks/<readable name>-<hash>.lock`` (short enough for any file system)."""
    readable = name.replace("/", "%")[-80:]
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return cache_dir / LOCK_DIR / f"{readable}-{digest}.lock"


@contextlib.contextmanager
def exclusive(cache_dir: Path, name: str) -> Iterator[None]:
    """Hold the lock of ``name`` (a path relative to the cache) in this process and across processes."""
    path = lock_file(cache_dir, name)
    with _registry_lock:
        thread_lock = _thread_locks.setdefault(str(path), threading.Lock())
    with thread_lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock
