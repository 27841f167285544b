"""Where the embedded store lives on disk."""

from __future__ import annotations

import os
from pathlib import Path

from llmplane.store.sqlite import SQLiteStore

ENV_HOME = "LLMPLANE_HOME"
DB_FILENAME = "llmplane.db"


def state_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The state directory: ``explicit``, else ``$LLMPLANE_HOME``, else ``~/.llmplane``.

    It is created if missing.
    """
    if explicit is not None and str(explicit) != "":
        path = Path(explicit)
    elif os.environ.get(ENV_HOME):
        path = Path(os.environ[ENV_HOME])
    else:
        path = Path("~/.llmplane")
    path = path.expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def db_path(directory: str | os.PathLike[str] | None = None) -> Path:
    return state_dir(directory) / DB_FILENAME


def open_store(directory: str | os.PathLike[str] | None = None) -> SQLiteStore:
    """The store at ``<state_dir>/llmplane.db`` (``directory`` resolved as in ``state_dir``)."""
    return SQLiteStore(db_path(directory))
