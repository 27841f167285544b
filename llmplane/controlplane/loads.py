"""Model downloads for the embedded substrate: one background load per model source.

Every Playground and Service claiming the same OpenModel shares one load; its progress and
outcome become the OpenModel's Ready condition (``state``) and gate the claimants' Services.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import orjson

from llmplane.api.llmaz import OpenModel


class ModelLoads:
    """Model downloads in the background, one per model source, shared by every claimant."""

    def __init__(self, cache_dir: Path, on_change: Callable[[], None]):
        self.cache_dir = cache_dir
        self.on_change = on_change
        self._tasks: dict[str, asyncio.Task[Path]] = {}
        self._progress: dict[str, tuple[int, int | None]] = {}

    @staticmethod
    def key(model: OpenModel) -> str:
        return f"{model.name}:{orjson.dumps(model.spec.source.to_dict(), option=orjson.OPT_SORT_KEYS).decode()}"

    def path(self, model: OpenModel) -> str:
        from llmplane.loader import model_path

        return str(model_path(model.spec.source, self.cache_dir))

    def ensure(self, model: OpenModel) -> None:
        key = self.key(model)
        task = self._tasks.get(key)
        if task is not None:
            return  # a failed load is retried when the OpenModel changes (new key) or on restart
        self._tasks[key] = asyncio.create_task(self._load(model, key))

    async def _load(self, model: OpenModel, key: str) -> Path:
        from llmplane.loader import load_model_async

        loop = asyncio.get_running_loop()
        last = [0.0]

        def progress(done: int, total: int | None) -> None:  # on the event loop
            self._progress[key] = (done, total)
            if loop.time() - last[0] > 0.5:
                last[0] = loop.time()
                self.on_change()

        try:
            return await load_model_async(model.spec.source, self.cache_dir, progress)
        finally:
            self.on_change()

    def state(self, model: OpenModel) -> tuple[str, str, str]:
        """(status True/False/Unknown, reason, message) for the OpenModel's Ready condition."""
        task = self._tasks.get(self.key(model))
        if task is None:
            return "Unknown", "NotClaimed", "Loaded when a Playground or Service claims it"
        if not task.done():
            done, total = self._progress.get(self.key(model), (0, None))
            if total:
                return (
                    "False",
                    "Loading",
                    f"Loading model files: {100 * done // total}% ({done >> 20} of {total >> 20} MiB)",
                )
            return "False", "Loading", f"Loading model files ({done >> 20} MiB so far)"
        error = task.exception()
        if error is not None:
            reason = getattr(error, "reason", None) or "LoadFailed"
            return "False", reason, str(error)
        return "True", "Loaded", f"Model files at {task.result()}"

    def cancel(self) -> None:
        for task in self._tasks.values():
            task.cancel()
