"""Read ``usage`` out of response bytes without decoding the whole response."""

from __future__ import annotations

from typing import Any

import orjson

_USAGE = b'"usage"'


def extract_usage(data: bytes) -> dict[str, Any] | None:
    """The last ``"usage": {...}`` object in ``data`` (None if absent or null)."""
    idx = data.rfind(_USAGE)
    while idx != -1:
        j = idx + len(_USAGE)
        n = len(data)
        while j < n and data[j] in b" \t\r\n:":
            j += 1
        if j < n and data[j : j + 1] == b"{":
            # The object ends at the first "}" after which the braces balance (found with
            # C-speed find/count rather than a Python loop over the bytes).
            k = data.find(b"}", j)
            while k != -1 and data.count(b"{", j, k + 1) != data.count(b"}", j, k + 1):
                k = data.find(b"}", k + 1)
            if k == -1:
                return None
            try:
                doc = orjson.loads(data[j : k + 1])
            except orjson.JSONDecodeError:
                return None
            return doc if isinstance(doc, dict) else None
        idx = data.rfind(_USAGE, 0, idx)
    return None


class StreamScanner:
    """Follows an SSE stream chunk by chunk: counts events and keeps the last usage seen."""

    __slots__ = ("events", "tail", "usage")

    def __init__(self) -> None:
        self.tail = b""
        self.usage: dict[str, Any] | None = None
        self.events = 0

    def feed(self, chunk: bytes) -> None:
        buf = self.tail + chunk if self.tail else chunk
        end = buf.rfind(b"\n\n")
        if end == -1:
            self.tail = buf
            return
        complete = buf[:end]
        self.tail = buf[end + 2 :]
        self.events += complete.count(b"data:")
        if complete.find(_USAGE) != -1:  # (not ``in``: on 3.11 that raises and drops a TypeError)
            usage = extract_usage(complete)
            if usage is not None:
                # Merged: a Messages stream has its input in one event, its output in another.
                self.usage = usage if self.usage is None else {**self.usage, **usage}
