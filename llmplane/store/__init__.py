"""Where resources live: ``Store`` (the interface), ``SQLiteStore`` (embedded), selectors."""

from llmplane.store.base import (
    Conflict,
    Expired,
    InvalidObject,
    NotFound,
    Store,
    StoreError,
    StoreUnavailable,
    WatchEvent,
    object_key,
    ref,
)
from llmplane.store.paths import db_path, open_store, state_dir
from llmplane.store.selectors import Requirement, Selector, as_selector, parse_selector
from llmplane.store.sqlite import SQLiteStore

__all__ = [
    "Conflict",
    "Expired",
    "InvalidObject",
    "NotFound",
    "Requirement",
    "SQLiteStore",
    "Selector",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "WatchEvent",
    "as_selector",
    "db_path",
    "object_key",
    "open_store",
    "parse_selector",
    "ref",
    "state_dir",
]
