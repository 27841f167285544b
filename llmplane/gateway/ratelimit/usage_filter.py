"""Streams: ask the engine for usage, and drop the usage chunk the client did not ask for."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson

from llmplane.gateway.protocols import USAGE_ASKED

if TYPE_CHECKING:
    from llmplane.gateway.request import InferenceRequest

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_USAGE = b'"usage"'


def _usage_only(event: bytes) -> bool:
    """An SSE event whose data is ``{..., "choices": [], "usage": {...}}``."""
    data = b"".join(
        line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")
    )
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(doc, dict) and doc.get("choices") == [] and isinstance(doc.get("usage"), dict)


class UsageChunkFilter:
    """Relays an SSE stream byte for byte except the usage-only event (injected
    ``include_usage``). Complete events go out at once; only an incomplete trailing event is
    held until its end arrives (``flush`` at the end of the stream releases it)."""

    __slots__ = ("dropped", "tail")

    def __init__(self) -> None:
        self.tail = b""
        self.dropped = 0

    def feed(self, chunk: bytes) -> bytes:
        buf = self.tail + chunk
        out, start = [], 0
        for m in _BOUNDARY.finditer(buf):
            event = buf[start : m.end()]
            start = m.end()
            if _USAGE in event and _usage_only(event):
                self.dropped += 1
            else:
                out.append(event)
        self.tail = buf[start:]
        return b"".join(out)

    def flush(self) -> bytes:
        tail, self.tail = self.tail, b""
        return tail


def inject_include_usage(doc: dict[str, Any]) -> bool:
    """Turn on ``stream_options.include_usage``; True if the doc was changed (the client did
    not ask for usage, so the usage chunk must be removed from its stream)."""
    opts = doc.get("stream_options")
    if not isinstance(opts, dict):
        opts = {}
    elif opts.get("include_usage") is True:
        return False
    doc["stream_options"] = {**opts, "include_usage": True}
    return True


def ask_stream_usage(inference: InferenceRequest) -> UsageChunkFilter | None:
    """For a stream whose tokens must be counted: ask the engine for its usage; the filter that
    keeps the usage-only chunk from a client that did not ask for it, or None if it did (or the
    request is not chat or completions: embeddings have no stream usage to ask for, Responses
    and Messages streams always carry theirs and go upstream as sent)."""
    if inference.path in USAGE_ASKED and inject_include_usage(inference.doc):
        inference.mark_dirty()
        return UsageChunkFilter()
    return None
