"""Engine logs rotated by size: ``replica-<i>.log`` is kept under ``max_bytes``, the part cut off
moves to ``replica-<i>.log.1`` (one generation: older text is dropped).

Engines write their log themselves (stdout and stderr go straight to the file, opened for
appending, so llmplane copies nothing while they run). Rotation is therefore "copy, then
truncate" as logrotate's ``copytruncate`` does: the engine's next append lands at the start of
the emptied file. Lines an engine writes between the copy and the truncation (microseconds) are
lost; that is the price of not sitting in the engine's output path. An idle vLLM writes one
access-log line per HTTP request, scrapes and probes included, which is why this exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 20 * 1024 * 1024
CHECK_INTERVAL = 10.0  # seconds between size checks


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + ".1")


def rotate_if_large(path: Path, max_bytes: int) -> bool:
    """Rotate ``path`` when it has grown past ``max_bytes``; True if it did."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
        backup = backup_path(path)
        tmp = backup.with_name(backup.name + ".tmp")
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1024 * 1024)
        os.replace(tmp, backup)
        with open(path, "r+b") as f:
            f.truncate(0)
        return True
    except FileNotFoundError:
        return False


def rotate_all(logs_dir: Path, max_bytes: int) -> list[Path]:
    """Rotate every engine log under ``logs_dir`` that is too large; returns those rotated."""
    rotated = []
    for path in logs_dir.glob("*/*/replica-*.log"):
        try:
            if rotate_if_large(path, max_bytes):
                rotated.append(path)
        except OSError as err:
            log.warning("cannot rotate %s: %s", path, err)
    return rotated


async def keep_rotated(
    logs_dir: Path, max_bytes: int = DEFAULT_MAX_BYTES, every: float = CHECK_INTERVAL
) -> None:
    """Check the engine logs every ``every`` seconds, forever (cancel to stop); the file work
    runs in a thread so a large copy never blocks the event loop."""
    while True:
        await asyncio.sleep(every)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(rotate_all, logs_dir, max_bytes)
