"""Helpers for API validation tests: parse a document and get its error lines."""

from __future__ import annotations

import textwrap
from typing import Any

import yaml

from llmplane.api.documents import InvalidResources, parse_document


def errors_of(doc: dict[str, Any] | str) -> list[str]:
    """Messages for an invalid document (without the location prefix); [] when valid."""
    if isinstance(doc, str):
        doc = yaml.safe_load(textwrap.dedent(doc))
    try:
        parse_document(doc)
    except InvalidResources as err:
        return err.messages
    return []


def assert_error(doc: dict[str, Any] | str, path: str, fragment: str) -> None:
    """The document is rejected with a message at ``path`` containing ``fragment``."""
    messages = errors_of(doc)
    hits = [m for m in messages if f": {path}: " in m and fragment in m]
    assert hits, f"expected an error at {path!r} containing {fragment!r}, got {messages}"
