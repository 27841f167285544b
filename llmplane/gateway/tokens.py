"""Counting a request's input tokens before it is sent, for token rate limits.

With the model's own tokenizer when one is configured and the ``tokenizers`` package is
installed (``GatewayConfig.rate_limit_tokenizers``: model name -> a ``tokenizer.json`` or a
directory holding one); otherwise an estimate, ``ceil(characters / 4)``:

- chat: every message's ``role``, ``name``, text content (a string or the ``text`` of each
  part; images and audio count nothing) and ``tool_calls`` (as JSON), plus the request's
  ``tools`` / ``functions`` (as JSON): the whole messages array, roles included;
- completions / embeddings: the ``prompt`` / ``input`` strings; a prompt given as token ids
  counts one token per id (those are exact);
- the Messages API as chat plus its ``system``; the Responses API: its ``instructions`` and
  its ``input`` (a string, or the text content of each item).

The count only decides admission: after the response the engine's ``usage.prompt_tokens``
replaces it (see ``llmplane.gateway.ratelimit``), so an estimate that is off is corrected
in the bucket, never billed twice.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import orjson

from llmplane.gateway.protocols.text import content_text

log = logging.getLogger("llmplane.gateway")

CHARS_PER_TOKEN = 4


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    n = 0
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                n += len(part)
            elif isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    n += len(text)
    return n


def _json_chars(value: Any) -> int:
    if value is None:
        return 0
    try:
        return len(orjson.dumps(value))
    except TypeError:
        return 0


def _chat_chars(doc: dict[str, Any], messages: list[Any]) -> int:
    n = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        for key in ("role", "name"):
            value = message.get(key)
            if isinstance(value, str):
                n += len(value)
        n += _content_chars(message.get("content"))
        n += _json_chars(message.get("tool_calls"))
    n += _json_chars(doc.get("tools")) + _json_chars(doc.get("functions"))
    return n + _content_chars(doc.get("system"))  # the Messages API's system prompt


def _prompt_parts(value: Any) -> tuple[int, int]:
    """(characters of text, token ids given as numbers) of a prompt / input value."""
    if isinstance(value, str):
        return len(value), 0
    chars = ids = 0
    if isinstance(value, list):
        for item in value:
            if isinstance(item, str):
                chars += len(item)
            elif isinstance(item, int):
                ids += 1
            elif isinstance(item, list):
                ids += len(item)
            elif isinstance(item, dict):  # a Responses API input item
                chars += _content_chars(item.get("content"))
    return chars, ids


def estimate_tokens(doc: dict[str, Any]) -> int:
    """The documented estimate: ``ceil(characters / 4)`` plus token ids given as numbers."""
    messages = doc.get("messages")
    if isinstance(messages, list):
        return math.ceil(_chat_chars(doc, messages) / CHARS_PER_TOKEN)
    for key in ("prompt", "input"):
        value = doc.get(key)
        if value is not None:
            if isinstance(value, str) and "instructions" not in doc:  # without a call
                return -(-len(value) // CHARS_PER_TOKEN)
            chars, ids = _prompt_parts(value)
            chars += _content_chars(doc.get("instructions"))  # the Responses API's
            return math.ceil(chars / CHARS_PER_TOKEN) + ids
    return 0


def _texts(doc: dict[str, Any]) -> tuple[list[str], int]:
    """The texts a tokenizer should encode, and token ids given as numbers."""
    messages = doc.get("messages")
    if isinstance(messages, list):
        lines = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            parts = [str(message.get("role") or "")]
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, str):
                        parts.append(part)
                    elif isinstance(part, dict) and isinstance(part.get("text"), str):
                        parts.append(part["text"])
            if message.get("tool_calls") is not None:
                parts.append(orjson.dumps(message["tool_calls"]).decode())
            lines.append("\n".join(parts))
        for key in ("tools", "functions"):
            if doc.get(key) is not None:
                lines.append(orjson.dumps(doc[key]).decode())
        system: list[str] = []
        content_text(doc.get("system"), system)  # the Messages API's system prompt
        return system + lines, 0
    for key in ("prompt", "input"):
        value = doc.get(key)
        if value is None:
            continue
        texts: list[str] = []
        content_text(doc.get("instructions"), texts)  # the Responses API's
        if isinstance(value, str):
            return [*texts, value], 0
        ids = 0
        if isinstance(value, list):
            for item in value:
                if isinstance(item, str):
                    texts.append(item)
                elif isinstance(item, int):
                    ids += 1
                elif isinstance(item, list):
                    ids += len(item)
                elif isinstance(item, dict):  # a Responses API input item
                    content_text(item.get("content"), texts)
        return texts, ids
    return [], 0


class TokenCounter:
    """Input tokens of a request: the model's tokenizer when configured and loadable, else
    ``estimate_tokens``. Tokenizers are loaded on first use and cached (a failure is logged
    once and the model falls back to the estimate)."""

    def __init__(self, tokenizers: dict[str, str] | None = None) -> None:
        self.paths = dict(tokenizers or {})
        self._loaded: dict[str, Any] = {}

    def tokenizer(self, model: str) -> Any:
        if model in self._loaded:
            return self._loaded[model]
        tok = None
        path = self.paths.get(model)
        if path:
            tok = _load(Path(path).expanduser())
        self._loaded[model] = tok
        return tok

    def count(self, doc: dict[str, Any], *models: str) -> int:
        if self.paths:
            for model in models:
                tok = self.tokenizer(model)
                if tok is not None:
                    texts, ids = _texts(doc)
                    if not texts:
                        return ids
                    return ids + sum(
                        len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)
                    )
        return estimate_tokens(doc)


def _load(path: Path) -> Any:
    if path.is_dir():
        path = path / "tokenizer.json"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        log.warning("rate limits: %s is configured but tokenizers is not installed", path)
        return None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # a missing or unreadable file: estimate instead
        log.warning("rate limits: cannot load tokenizer %s (%s); estimating", path, err)
        return None
