"""One parsed inference request: the body is decoded once, the prompt extracted lazily."""

from __future__ import annotations

from typing import Any

import orjson

from llmplane.gateway import protocols
from llmplane.gateway.errors import ErrorCode, GatewayError, missing_model
from llmplane.gateway.protocols.fields import invalid, wrong_type
from llmplane.gateway.protocols.text import messages_text


def prompt_text(doc: dict[str, Any]) -> str:
    """The text a prefix cache would see: chat messages (role + content), a completion prompt
    or an embedding input, concatenated. Token-id prompts are rendered as numbers."""
    parts: list[str] = []
    if messages_text(doc.get("messages"), parts):
        return "".join(parts)
    for key in ("prompt", "input"):
        value = doc.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            for item in value:
                if isinstance(item, str):
                    parts.append(item)
                elif isinstance(item, int):
                    parts.append(f"{item},")
                elif isinstance(item, list):
                    parts.append(",".join(str(i) for i in item))
            return "".join(parts)
    return ""


# Fields whose type the gateway (or the engine behind it) acts on; checked before routing, so
# a value an engine would coerce (``"stream": "true"``) cannot slip past what the gateway
# decides from it (streaming, usage injection, token reservations).
_BOOLEANS = ("stream", "echo", "logprobs", "ignore_eos")
_INTEGERS = ("max_tokens", "max_completion_tokens", "n", "best_of", "top_logprobs", "seed")
_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_MINIMUM = {"n": 1, "best_of": 1, "max_tokens": 0, "max_completion_tokens": 0, "top_logprobs": 0}
# Choices generated per prompt: OpenAI's own ceiling for ``n`` (docs/security.md). An engine
# computes every one of them; ``n: 1000000`` is refused here instead of being forwarded.
MAX_CHOICES = 128
_MAXIMUM = {"n": MAX_CHOICES, "best_of": MAX_CHOICES}


# Each checked field's kind: the body's own keys are looked up here (a request has a handful)
# instead of every checked field looked up in the body.
_KINDS: dict[str, str] = {
    **dict.fromkeys(_BOOLEANS, "boolean"),
    **dict.fromkeys(_INTEGERS, "integer"),
    **dict.fromkeys(_NUMBERS, "number"),
    "stream_options": "object",
    "messages": "array",
    "prompt": "prompt",
}


def check_fields(doc: dict[str, Any]) -> None:
    """400 (OpenAI's shape, ``param`` naming the field) for a field of the wrong type."""
    kinds = _KINDS
    for key, value in doc.items():
        kind = kinds.get(key)
        if kind is None or value is None:
            continue
        if kind == "boolean":
            if value is not True and value is not False:
                raise wrong_type(key, value)
        elif kind == "integer":
            if type(value) is not int:
                raise wrong_type(key, value, "'integer'")
            low = _MINIMUM.get(key)
            if low is not None and value < low:
                raise invalid(key, f"{value} is less than the minimum of {low} - '{key}'")
            high = _MAXIMUM.get(key)
            if high is not None and value > high:
                raise invalid(key, f"{value} is greater than the maximum of {high} - '{key}'")
        elif kind == "number":
            if type(value) is not int and type(value) is not float:
                raise wrong_type(key, value, "'number'")
        elif kind == "object":
            if not isinstance(value, dict):
                raise wrong_type(key, value, "'object'")
            usage = value.get("include_usage")
            if usage is not None and usage is not True and usage is not False:
                raise wrong_type("stream_options.include_usage", usage)
        elif kind == "array":
            if not isinstance(value, list):
                raise wrong_type(key, value, "'array'")
        elif not isinstance(value, str | list):
            raise wrong_type(key, value, "'string' or 'array'")


class InferenceRequest:
    """What routing and scheduling read from a request (``model`` "" when it names none)."""

    __slots__ = ("_prompt", "body", "dirty", "doc", "headers", "model", "path", "stream")

    def __init__(self, path: str, headers: Any, body: bytes) -> None:
        self.path = path
        self.headers = headers
        self.body = body
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            raise GatewayError(
                400, f"the request body is not valid JSON: {err}", ErrorCode.INVALID_JSON
            ) from None
        if not isinstance(doc, dict):
            raise GatewayError(
                400, "the request body must be a JSON object", ErrorCode.INVALID_JSON
            )
        model = doc.get("model")
        if model is None:  # (a catch-all InferenceModelRewrite may route it: routing.py)
            model = ""
        elif not isinstance(model, str):
            raise missing_model()
        check_fields(doc)
        protocols.check(path, doc)  # Responses / Messages fields
        self.doc: dict[str, Any] = doc
        self.model: str = model
        self.stream = doc.get("stream") is True
        self._prompt: bytes | None = None
        self.dirty = False

    @property
    def prompt(self) -> bytes:
        """The prompt as UTF-8 bytes (computed on first use)."""
        if self._prompt is None:
            text = protocols.prompt_text(self.path, self.doc)  # Responses / Messages
            if text is None:
                text = prompt_text(self.doc)
            self._prompt = text.encode("utf-8", "surrogatepass")
        return self._prompt

    def prompt_bound(self) -> int:
        """An upper bound on ``len(self.prompt)`` without extracting it, or -1. A chat request's
        prompt is its messages' roles and texts, each from a JSON string no shorter in the body
        than in UTF-8, plus two bytes a message where the body has at least ``{}``: never
        longer than the body (while the body is the doc's: not ``dirty``). Other prompts
        (token-id lists rendered as numbers) have no such bound."""
        if self.dirty or not isinstance(self.doc.get("messages"), list):
            return -1
        return len(self.body)

    def prompt_size(self) -> int:
        """Bytes of the prompt if it was extracted already, else of the body (the prompt and a
        few fields): a size for load accounting that costs nothing per request."""
        return len(self._prompt) if self._prompt is not None else len(self.body)

    def rewrite_model(self, model: str) -> None:
        """Send ``model`` upstream instead of the requested name."""
        if model != self.doc.get("model"):
            self.doc["model"] = model
            self.dirty = True

    def mark_dirty(self) -> None:
        """``doc`` was changed (by a hook): encode it again before sending."""
        self.dirty = True

    def final_body(self) -> bytes:
        """The bytes to send upstream: the client's, or the changed doc encoded once."""
        if self.dirty:
            self.body = orjson.dumps(self.doc)
            self.dirty = False
        return self.body
