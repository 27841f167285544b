"""Token ids of a rendered chat, from cached pieces: the cost of a long shared prefix is paid once.

A Hugging Face tokenizer splits its input at added tokens (``<|user|>``, ``</s>`` ...) before
anything else; each piece in between is normalised, pre-tokenised and encoded on its own. So
when the text is cut right after such a token, the ids of the whole are the ids of the pieces,
one after the other, and a piece seen before (a system prompt, the earlier turns of a
conversation) costs a dictionary lookup. That holds unless a token eats the whitespace after it
(``rstrip``), matches only as a whole word (``single_word``), or the pre-tokeniser treats the
first piece of a text differently from the others (Metaspace's ``prepend_scheme: first``): with
those, or when ``check`` finds a text whose pieces do not add up, every text is encoded whole.
The cut tokens are found with one regular expression that matches as the tokenizer does
(leftmost, then longest).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Sequence
from typing import Any

from llmplane.gateway.tokenization.lru import LRU

log = logging.getLogger("llmplane.gateway.tokenization")

CACHE_CHARS = 8 << 20  # characters of cached pieces per model (their ids take about as many bytes)


def _position_dependent(node: Any) -> bool:
    """Whether a pre-tokeniser (recursively) treats a text's first piece differently."""
    if isinstance(node, dict):
        if node.get("type") == "Metaspace" and node.get("prepend_scheme", "always") == "first":
            return True
        return any(_position_dependent(v) for v in node.values())
    if isinstance(node, list):
        return any(_position_dependent(v) for v in node)
    return False


def cut_tokens(config: dict[str, Any]) -> tuple[re.Pattern[str], frozenset[str]] | None:
    """From tokenizer.json: a pattern matching every added token the tokenizer extracts before
    normalising (longest first, as it does), and those after which a text may be cut; None
    when no cut is safe."""
    if _position_dependent(config.get("pre_tokenizer")) or _position_dependent(
        config.get("normalizer")
    ):
        return None
    added = [t for t in config.get("added_tokens") or [] if isinstance(t, dict)]
    raw = [t for t in added if not t.get("normalized", False) and t.get("content")]
    if not raw or any(t.get("single_word") for t in added):
        return None
    contents = sorted({t["content"] for t in raw}, key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, contents)))
    cuts = frozenset(t["content"] for t in raw if not t.get("rstrip"))
    return (pattern, cuts) if cuts else None


class PieceEncoder:
    """``encode(text)``: the tokenizer's ids for ``text`` (no special tokens added), from an LRU
    of pieces bounded by ``max_chars``."""

    def __init__(self, tokenizer: Any, config: dict[str, Any], max_chars: int = CACHE_CHARS):
        self.tokenizer = tokenizer
        # Without character offsets (about a quarter faster; the ids are the same).
        self._encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        self.cuts = cut_tokens(config)
        # Piece -> its ids, as a tuple of shared int objects (``_ints``): 8 bytes an id, like an
        # array of 64-bit integers, and copied into a request's ids without making an int each
        # (from an array, a 6,000-id prefix cost a quarter of a millisecond); a tuple of ints
        # leaves the garbage collector's lists at its first pass, so the cache adds nothing to
        # later collections. Bounded in characters of pieces.
        self.cache: LRU[str, Sequence[int]] = LRU(max_weight=max_chars, weight=lambda p, _: len(p))
        self._ints = list(range(tokenizer.get_vocab_size(with_added_tokens=True)))
        self.hits = 0
        self.misses = 0

    def pieces(self, text: str) -> list[str]:
        """``text`` cut right after each cut token."""
        if self.cuts is None:
            return [text]
        pattern, cuts = self.cuts
        out = []
        start = 0
        for match in pattern.finditer(text):
            if match.group() in cuts:
                out.append(text[start : match.end()])
                start = match.end()
        if start < len(text):
            out.append(text[start:])
        return out

    def encode(self, text: str) -> list[int]:
        if self.cuts is None:
            return self._encode_batch([text], add_special_tokens=False)[0].ids
        pieces = self.pieces(text)
        found = [self.cache.get(piece) for piece in pieces]
        missing = [piece for piece, ids in zip(pieces, found, strict=True) if ids is None]
        self.hits += len(pieces) - len(missing)
        self.misses += len(missing)
        encoded = self._encode_batch(missing, add_special_tokens=False) if missing else []
        new = dict(zip(missing, encoded, strict=True))
        out: list[int] = []
        for piece, ids in zip(pieces, found, strict=True):
            if ids is None:
                ids = new[piece].ids
                with contextlib.suppress(IndexError):  # an id past the vocabulary's size
                    ids = tuple(map(self._ints.__getitem__, ids))
                self.cache.put(piece, ids)
            out.extend(ids)
        return out

    def check(self, text: str) -> bool:
        """Whether the pieces of ``text`` add up to its whole encoding; if not, cutting is turned
        off (with a log line) and every text is encoded whole from then on."""
        if self.cuts is None:
            return True
        if self.encode(text) == self.tokenizer.encode(text, add_special_tokens=False).ids:
            return True
        log.warning(
            "tokenizer: the pieces of a text cut after its special tokens do not add up to its "
            "encoding; encoding every text whole"
        )
        self.cuts = None
        self.cache.clear()
        return False
