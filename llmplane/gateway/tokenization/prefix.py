"""A request's leading parts, whose /tokenize answers serve the requests that share them.

A new request (a new user message under a shared system prompt, the next turn of a
conversation, another question after a shared completion prompt) is rarely a body the gateway
has asked /tokenize before, but its leading part often is. Next to a request's whole body the
gateway asks one leading part and caches its ids under a key of that part and of the other
fields that change tokens; a later request finds its longest cached part in a few dict reads
(``leading_runs``: chats by runs of whole messages, keys chained over the messages; completion
prompts by their first ``CHUNK``-character multiples, on a grid each at most 1.5 times the one
before, so the longest cached cut covers two thirds of a shared text it fits in).

A leading part's ids are the request's leading ids except near the end: the last tokens of a
conversation so far may merge with the next message's text (a plain-text template), a cut
through a word tokenizes that word otherwise, a template may close a conversation without a
generation prompt otherwise. So the last ``SAFETY`` tokens at least are dropped, down to a
multiple of ``ALIGN`` (the smallest block size engines use). A template that renders earlier
messages according to later ones (Qwen3's reasoning blocks) breaks the rule: ``Tokenization``
checks every whole answer. Leading ids that are a prefix of the request's make the precise
prefix scorer count fewer of its cached blocks, never other ones (block keys are chained).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from xxhash import xxh3_128, xxh3_128_digest

SAFETY = 8  # tokens dropped at least from the end of a leading answer
ALIGN = 16  # ... down to a multiple of this
CHUNK = 64  # characters: a completion prompt's leading texts are cut at multiples of this
# The fields of a /tokenize chat body that differ between a request and its leading messages.
_SO_FAR = {"add_generation_prompt": False, "continue_final_message": False}
_OWN = frozenset({"messages", *_SO_FAR})
# No leading part's key equals a whole body's, or one of the other kind.
_SEED = b"llmplane leading messages\0"
_TEXT_SEED = b"llmplane leading text\0"


class LeadingIds(list[int]):
    """The engine's ids of a request's leading part, for a prompt of about ``total`` tokens
    (the precise prefix scorer's fractions and the prefill cost count the whole prompt)."""

    __slots__ = ("total",)

    def __init__(self, ids: list[int], total: int) -> None:
        super().__init__(ids)
        self.total = max(total, len(ids))


@dataclass
class Runs:
    """A request's leading parts that may be cached: ``keys[i]`` of a part of ``sizes[i]``
    (characters, or JSON bytes of a chat's fields and messages) and ``parts[i]`` messages or
    characters, longest first, of a request of ``size``."""

    keys: list[bytes]
    sizes: list[int]
    parts: list[int]
    size: int
    whole: dict[str, Any]  # the request's /tokenize body

    def body(self, i: int) -> dict[str, Any]:
        """The /tokenize body of part ``i`` (a chat's: a conversation so far)."""
        n = self.parts[i]
        if "messages" in self.whole:
            return {**self.whole, "messages": self.whole["messages"][:n]} | _SO_FAR
        return {**self.whole, "prompt": self.whole["prompt"][:n]}

    def system(self) -> Runs | None:
        """Only a chat's run of leading system (or developer) messages, if it has one and
        more: templates render those first, whatever follows them."""
        messages = self.whole["messages"]
        n = next(
            (
                i
                for i, m in enumerate(messages)
                if not isinstance(m, dict) or m.get("role") not in ("system", "developer")
            ),
            len(messages),
        )
        if n not in self.parts:
            return None
        i = self.parts.index(n)
        return Runs([self.keys[i]], [self.sizes[i]], [n], self.size, self.whole)


def leading_runs(body: dict[str, Any], chat: bool) -> Runs | None:
    """The leading parts of a /tokenize body (``remote.tokenize_body``); None when it has
    none (one message, a prompt of at most ``CHUNK`` characters) or what JSON cannot hold."""
    try:
        if chat:
            if len(body["messages"]) < 2:
                return None
            keys, sizes = chain(body)
            count = len(keys)
            return Runs(keys[-2::-1], sizes[-2::-1], list(range(count - 1, 0, -1)), sizes[-1], body)
        prompt = body["prompt"]
        grid = cuts(len(prompt))
        if not grid:
            return None
        hasher = xxh3_128(_TEXT_SEED + _other_fields(body, ("prompt",)))
        keys = []
        done = 0
        for cut in reversed(grid):  # the prompt hashed once, a key at each cut
            hasher.update(prompt[done:cut].encode())
            keys.append(hasher.digest())
            done = cut
        return Runs(keys[::-1], grid, grid, len(prompt), body)
    except (TypeError, ValueError):  # what JSON cannot hold (an integer beyond 64 bits, a
        return None  # lone surrogate): no key


def cuts(length: int) -> list[int]:
    """The leading texts' lengths looked up for a prompt of ``length`` characters, longest
    first: ``CHUNK`` times 1, 2, 3, 4, 6, 8, 12..., shorter than the prompt."""
    out: list[int] = []
    power = 1
    while True:
        for chunks in (power, power + power // 2) if power > 1 else (1,):
            if chunks * CHUNK >= length:
                return out[::-1]
            out.append(chunks * CHUNK)
        power *= 2


def chain(body: dict[str, Any]) -> tuple[list[bytes], list[int]]:
    """For a /tokenize chat body: the key of each run of leading messages (``keys[j]`` for
    ``messages[: j + 1]``) and the JSON bytes of those messages and the other fields (an
    estimate of their size); raises ``TypeError`` for what JSON cannot hold."""
    base = _other_fields(body, _OWN)
    key = xxh3_128_digest(_SEED + base)
    keys: list[bytes] = []
    sizes: list[int] = []
    size = len(base)  # tools render in every part
    for message in body["messages"]:
        data = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
        key = xxh3_128_digest(key + data)
        size += len(data)
        keys.append(key)
        sizes.append(size)
    return keys, sizes


def _other_fields(body: dict[str, Any], own: Iterable[str]) -> bytes:
    """The JSON of a body's fields but its ``own``, keys sorted: what the key of each of its
    parts starts from."""
    return orjson.dumps(
        {k: v for k, v in body.items() if k not in own}, option=orjson.OPT_SORT_KEYS
    )


def kept(ids: list[int]) -> int:
    """How many of a leading answer's ids the requests continuing its part start with (the
    rule; ``Tokenization`` checks it on every whole answer)."""
    return max(0, (len(ids) - SAFETY) // ALIGN * ALIGN)
