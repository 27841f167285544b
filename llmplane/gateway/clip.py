"""Client strings as they may appear in a log line or an error message: clipped.

A client chooses the model name, the path and every field it sends; echoed whole, an 8 MB
``model`` is written to the logs on every request and sent back in the error. Wherever a
client's string reaches a log or an error body it goes through ``clip`` (text) or ``shown``
(a value quoted as ``repr`` does): at most ``MAX_SHOWN`` characters, then an ellipsis and the
original length.
"""

from __future__ import annotations

import reprlib
from typing import Any

MAX_SHOWN = 256  # characters of a client's string kept in a log line or an error message

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = MAX_SHOWN
_repr.maxlist = _repr.maxdict = _repr.maxtuple = _repr.maxset = 16


def clip(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` if it is at most ``limit`` characters, else its start, an ellipsis and its
    length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def shown(value: Any) -> str:
    """``repr(value)`` for a message, clipped (a string's ``repr`` of its clipped text, other
    values through ``reprlib``, which stops at the limit instead of rendering everything)."""
    if isinstance(value, str):
        return repr(clip(value))
    return clip(_repr.repr(value))
