"""Deterministic, cheap tokenization and generated text.

Tokenizer rule: the text is cut into consecutive 4-character chunks (the last may be
shorter) and each chunk becomes ``xxhash32(chunk utf-8) % vocab_size``. The same ids feed
``/tokenize``, the prefix cache and the usage counts.

Chat template: each message renders as ``<|{role}|>\\n{content}\\n``; the generation prompt
``<|assistant|>\\n`` is appended (unless ``add_generation_prompt`` is false). Content given
as a list of parts keeps the ``text`` of each text part, joined with newlines.

Generated text: every output token is a pseudo-word of exactly 4 characters (a space and
three letters), so re-tokenizing generated text gives the same count. Word ``k`` of a
sequence is picked by a counter-based hash (splitmix64) of the sequence seed and ``k``;
the sequence seed is a hash of the server seed, the prompt ids, the sampling parameters
that matter and the choice index. Hence same seed + same request => same text.
"""

from __future__ import annotations

import math
from array import array

from xxhash import xxh32_intdigest, xxh64_intdigest

CHARS_PER_TOKEN = 4
MASK64 = (1 << 64) - 1

_CONSONANTS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"
# 17 * 5 * 17 = 1445 words of the form " cvc".
WORDS: tuple[str, ...] = tuple(
    " " + a + b + c for a in _CONSONANTS for b in _VOWELS for c in _CONSONANTS
)
NUM_WORDS = len(WORDS)


def tokenize(text: str, vocab_size: int) -> list[int]:
    if text.isascii():
        # One byte per character: slicing the bytes is the same as slicing the text.
        data = text.encode()
        return [
            xxh32_intdigest(data[i : i + 4]) % vocab_size
            for i in range(0, len(data), CHARS_PER_TOKEN)
        ]
    return [
        xxh32_intdigest(text[i : i + 4].encode()) % vocab_size
        for i in range(0, len(text), CHARS_PER_TOKEN)
    ]


def message_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return str(content)


def block_text(content: object) -> str:
    """The text of a Responses input item's or a Messages message's content: a string, or the
    ``text`` of each part, joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def render_chat(messages: list[dict], add_generation_prompt: bool = True) -> str:
    out = [f"<|{m.get('role', 'user')}|>\n{message_text(m.get('content'))}\n" for m in messages]
    if add_generation_prompt:
        out.append("<|assistant|>\n")
    return "".join(out)


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def sequence_seed(server_seed: int, prompt_ids: list[int], params_key: str, index: int) -> int:
    """Seed of one generated sequence; depends only on the request's content."""
    h = xxh64_intdigest(array("q", prompt_ids).tobytes(), seed=server_seed & MASK64)
    return xxh64_intdigest(f"{params_key}|{index}".encode(), seed=h)


def word_index(seed: int, k: int) -> int:
    return splitmix64(seed ^ ((k * 0xD1B54A32D192ED03) & MASK64)) % NUM_WORDS


def words(seed: int, start: int, end: int) -> list[str]:
    return [WORDS[word_index(seed, k)] for k in range(start, end)]


def eos_length(seed: int, mean: int) -> int:
    """Number of tokens before the EOS, geometric with the given mean (>= 1)."""
    if mean <= 1:
        return 1
    u = (splitmix64(seed ^ 0x5EED) >> 11) / float(1 << 53)
    u = max(u, 1e-12)
    return 1 + int(math.log(u) / math.log(1.0 - 1.0 / mean))


class WordIds:
    """Token id of every pseudo-word for one vocab size (what the cache hashes)."""

    def __init__(self, vocab_size: int) -> None:
        self.ids = [xxh32_intdigest(w.encode()) % vocab_size for w in WORDS]
        self.id_set = frozenset(self.ids)


def continuation(prompt_ids: list[int], word_ids: frozenset[int]) -> tuple[list[int], int]:
    """(the ids the sequence seed hashes, the words already generated) of a prompt.

    A prompt that ends with pseudo-word ids is read as a generation to continue: the seed
    hashes the prompt before them and generation resumes at word ``len(run)``, so prompt +
    the first ``k`` generated ids yields exactly the words after ``k`` (as an autoregressive
    model at temperature 0 would). A prompt that ends so by chance stays deterministic."""
    end = len(prompt_ids)
    start = end
    while start > 1 and prompt_ids[start - 1] in word_ids:
        start -= 1
    return prompt_ids[:start], end - start


def final_words(text: str) -> int | None:
    """How many pseudo-words ``text`` is made of (None: it is not only pseudo-words)."""
    if len(text) % CHARS_PER_TOKEN:
        return None
    for i in range(0, len(text), CHARS_PER_TOKEN):
        if text[i : i + CHARS_PER_TOKEN] not in _WORD_SET:
            return None
    return len(text) // CHARS_PER_TOKEN


_WORD_SET = frozenset(WORDS)
