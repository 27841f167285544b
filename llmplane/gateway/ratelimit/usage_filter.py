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
        buf = self.tail + chunk if self.tail else chunk
        if buf.endswith(b"\n\n"):
            end = len(buf)
        else:
            end = -1
            for m in _BOUNDARY.finditer(buf):
                end = m.end()
            if end == -1:
                self.tail = buf
                return b""
        self.tail = buf[end:]
        complete = buf[:end] if end != len(buf) else buf
        if _USAGE not in complete:
            return complete
        out = []
        start = 0
        for m in _BOUNDARY.finditer(complete):
            event = complete[start : m.end()]
            start = m.end()
            if _USAGE in event and _usage_only(event):
                self.dropped += 1
                continue
            out.append(event)
        return b"".join(out)

    def flush(self) -> bytes:
        tail, self.tail = self.tail, b""
        return tail


def wants_usage(doc: dict[str, Any]) -> bool:
    opts = doc.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


def inject_include_usage(doc: dict[str, Any]) -> bool:
    """Turn on ``stream_options.include_usage``; True if the doc was changed (the client did
    not ask for usage, so the usage chunk must be removed from its stream)."""
    if wants_usage(doc):
        return False
    opts = doc.get("stream_options")
    doc["stream_options"] = (
        {**opts, "include_usage": True} if isinstance(opts, dict) else {"include_usage": True}
    )
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
