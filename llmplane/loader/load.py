"""OpenModel source -> a local path in the shared model cache.

``model_path`` says where a model will be (planning renders it as ``{{ .ModelPath }}``);
``load_model`` makes it present: once per model however many Playgrounds, threads or processes
ask at the same time, resuming what an interrupted load left behind, and skipping the network
entirely for a model that finished before.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from llmplane.api.llmaz import ModelSource
from llmplane.loader import cache, host
from llmplane.loader.errors import INVALID_SOURCE, NOT_FOUND, LoadError, from_os_error
from llmplane.loader.locate import HUGGINGFACE, MODELSCOPE, Location, locate
from llmplane.loader.progress import Progress, ProgressFn


def model_path(source: ModelSource | str, cache_dir: Path | str) -> Path:
    """Where the model of ``source`` is once loaded. No network, nothing written.

    A hub model is ``<cache>/models--org--name`` (the file inside it when ``filename`` is set),
    an object store model ``<cache>/<proto>/<bucket>/<path>``, ``host://p`` is ``p``,
    ``ollama://tag`` is the tag, ``package://pkg/file`` the installed file.
    """
    return locate(source, cache_dir).path


def is_loaded(source: ModelSource | str, cache_dir: Path | str) -> bool:
    """Whether ``load_model`` would return at once without the network."""
    location = locate(source, cache_dir)
    if not location.downloads:
        return location.kind == "ollama" or location.path.exists()
    return _complete(location)


def load_model(
    source: ModelSource | str,
    cache_dir: Path | str,
    progress: ProgressFn | None = None,
) -> Path:
    """Make the model of ``source`` present under ``cache_dir`` and return its path.

    ``progress(done, total)`` is called with bytes (total None while unknown), from the calling
    thread or the client library's download threads. Raises LoadError.
    """
    location = locate(source, cache_dir)
    if location.kind == "host":
        return host.check(location.path)
    if not location.downloads:  # ollama (the engine pulls), package (already installed)
        return location.path
    if _complete(location):
        return location.path
    cache_root = Path(cache_dir)
    assert location.unit is not None and location.request is not None
    try:
        with cache.exclusive(cache_root, str(location.unit.relative_to(cache_root))):
            if _complete(location):  # another thread or process finished it while we waited
                return location.path
            counter = Progress(progress)
            _fetch(location, cache_root, counter)
            if not location.path.exists():
                raise LoadError(
                    NOT_FOUND, f"the download finished but {location.path} is not there"
                )
            cache.mark_complete(location.unit, location.request)
            counter.finish()
    except OSError as err:  # the cache itself: permissions, read-only, full
        raise from_os_error(err, str(location.unit)) from err
    return location.path


def _complete(location: Location) -> bool:
    assert location.unit is not None and location.request is not None
    return location.path.exists() and cache.is_complete(location.unit, location.request)


def _fetch(location: Location, cache_root: Path, progress: Progress) -> None:
    assert location.unit is not None
    if location.kind == HUGGINGFACE:
        from llmplane.loader import huggingface

        assert location.hub is not None
        huggingface.fetch(location.hub, location.unit, progress)
    elif location.kind == MODELSCOPE:
        from llmplane.loader import modelscope

        assert location.hub is not None
        modelscope.fetch(location.hub, location.unit, progress)
    elif location.kind in ("s3", "oss", "gcs"):
        import importlib

        assert location.stored is not None
        module = importlib.import_module(f"llmplane.loader.{location.kind}")
        module.fetch(location.stored, location.unit, cache_root, progress)
    else:
        raise LoadError(INVALID_SOURCE, f"cannot download a {location.kind} source")


# asyncio: one download per model per event loop, however many coroutines await it ------------


class _Shared:
    def __init__(self) -> None:
        self.listeners: list[ProgressFn] = []
        self.task: asyncio.Future[Path] | None = None


_shared: dict[tuple[int, str, str], _Shared] = {}
_shared_lock = threading.Lock()


async def load_model_async(
    source: ModelSource | str,
    cache_dir: Path | str,
    progress: ProgressFn | None = None,
) -> Path:
    """``load_model`` for the controller: runs in a worker thread, never blocks the event loop.

    Concurrent callers for the same model share one download; each gets the progress reports
    (on the event loop thread) from the moment it joined.
    """
    location = locate(source, cache_dir)
    if not location.downloads or _complete(location):
        return await asyncio.to_thread(load_model, source, cache_dir, None)
    loop = asyncio.get_running_loop()
    key = (id(loop), str(location.unit), location.request or "")
    with _shared_lock:
        shared = _shared.get(key)
        if shared is None:
            shared = _Shared()
            _shared[key] = shared
            fan_out = _fan_out(loop, shared.listeners)
            shared.task = asyncio.ensure_future(
                asyncio.to_thread(load_model, source, cache_dir, fan_out)
            )
            shared.task.add_done_callback(lambda _: _shared.pop(key, None))
        if progress is not None:
            shared.listeners.append(progress)
    assert shared.task is not None
    try:
        # shield: one caller being cancelled must not cancel the others' download
        return await asyncio.shield(shared.task)
    finally:
        if progress is not None and progress in shared.listeners:
            shared.listeners.remove(progress)


def _fan_out(loop: asyncio.AbstractEventLoop, listeners: list[ProgressFn]) -> ProgressFn:
    def report(done: int, total: int | None) -> None:
        for listener in list(listeners):
            loop.call_soon_threadsafe(listener, done, total)

    return report


__all__ = ["LoadError", "is_loaded", "load_model", "load_model_async", "model_path"]
