"""Counting a request's input tokens before it is sent, for token rate limits: the model's
tokenizer where ``GatewayConfig.rate_limit_tokenizers`` names one, else ``ceil(characters /
4)`` over the texts docs/gateway.md ("Reserve") lists. The count only decides admission: the
engine's ``usage.prompt_tokens`` replaces it after the response (``llmplane.gateway.ratelimit``),
so an estimate that is off is corrected in the bucket, never billed twice.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from llmplane.gateway.protocols.text import content_text
from llmplane.gateway.scheduler.precise_prefix import PROMPT_TOKENS

if TYPE_CHECKING:
    from llmplane.gateway.request import InferenceRequest
    from llmplane.gateway.scheduler.framework import SchedulingContext

log = logging.getLogger("llmplane.gateway")

CHARS_PER_TOKEN = 4


def _json(value: Any, texts: list[str]) -> None:
    if value is not None:
        with contextlib.suppress(TypeError):  # an integer beyond 64 bits: counted as nothing
            texts.append(orjson.dumps(value).decode())


def _texts(doc: dict[str, Any]) -> tuple[list[str], int]:
    """The texts a request's input tokens are counted from, and token ids given as numbers."""
    texts: list[str] = []
    messages = doc.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                texts += (v for k in ("role", "name") if isinstance(v := message.get(k), str))
                content_text(message.get("content"), texts)
                _json(message.get("tool_calls"), texts)
        _json(doc.get("tools"), texts)
        _json(doc.get("functions"), texts)
        content_text(doc.get("system"), texts)  # the Messages API's system prompt
        return texts, 0
    for key in ("prompt", "input"):
        value = doc.get(key)
        if value is None:
            continue
        content_text(doc.get("instructions"), texts)  # the Responses API's
        ids = 0
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, list):
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
    return texts, 0


def estimate_tokens(doc: dict[str, Any]) -> int:
    """The documented estimate: ``ceil(characters / 4)`` plus token ids given as numbers."""
    texts, ids = _texts(doc)
    return ids - (-sum(map(len, texts)) // CHARS_PER_TOKEN)


def sent_prompt_tokens(request: InferenceRequest, scheduling: SchedulingContext | None) -> int:
    """The prompt tokens a request sends upstream, for the prefill work the gateway counts per
    endpoint (``EndpointState.prefill_tokens``): the count of the precise prefix scorer when it
    tokenized the prompt, else ``ceil(bytes / 4)`` of the prompt if extracted, else of the body
    (nothing is parsed or tokenized for it)."""
    if scheduling is not None:
        counted = scheduling.cache.get(PROMPT_TOKENS)
        if isinstance(counted, int):
            return counted
    return -(-request.prompt_size() // CHARS_PER_TOKEN)


class TokenCounter:
    """Input tokens of a request: the model's tokenizer when configured and loadable, else
    ``estimate_tokens``. The tokenizers are read when the counter is made (the gateway's
    start), not on a request: reading a large tokenizer.json takes a noticeable time, and on a
    request it would hold every request of the worker behind it. One that cannot be read is
    logged and its model falls back to the estimate."""

    def __init__(self, tokenizers: dict[str, str] | None = None) -> None:
        self._loaded: dict[str, Any] = {}
        for model, where in (tokenizers or {}).items():
            path = Path(where).expanduser()
            self._loaded[model] = _load(path / "tokenizer.json" if path.is_dir() else path)

    def tokenizer(self, model: str) -> Any:
        return self._loaded.get(model)

    def count(self, doc: dict[str, Any], *models: str) -> int:
        for model in models:
            tok = self.tokenizer(model)
            if tok is not None:
                texts, ids = _texts(doc)
                encoded = tok.encode_batch(texts, add_special_tokens=False)
                return ids + sum(len(e.ids) for e in encoded)
        return estimate_tokens(doc)


def _load(path: Path) -> Any:
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path))
    except ImportError:
        log.warning("rate limits: %s is configured but tokenizers is not installed", path)
    except Exception as err:  # a missing or unreadable file: estimate instead
        log.warning("rate limits: cannot load tokenizer %s (%s); estimating", path, err)
    return None
