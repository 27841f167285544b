"""One parsed inference request: the body is decoded once, the prompt extracted lazily."""

from __future__ import annotations

from typing import Any

import orjson

from llmplane.gateway.errors import GatewayError


def _text_of(content: Any, parts: list[str]) -> None:
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
            elif isinstance(part, str):
                parts.append(part)


def prompt_text(doc: dict[str, Any]) -> str:
    """The text a prefix cache would see: chat messages (role + content), a completion prompt
    or an embedding input, concatenated. Token-id prompts are rendered as numbers."""
    parts: list[str] = []
    messages = doc.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            if isinstance(role, str):
                parts += (role, ":")
            _text_of(message.get("content"), parts)
            parts.append("\n")
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


class InferenceRequest:
    """What routing and scheduling read from a request."""

    __slots__ = ("_prompt", "body", "dirty", "doc", "headers", "model", "path", "stream")

    def __init__(self, path: str, headers: Any, body: bytes) -> None:
        self.path = path
        self.headers = headers
        self.body = body
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            raise GatewayError(
                400, f"the request body is not valid JSON: {err}", "invalid_json"
            ) from None
        if not isinstance(doc, dict):
            raise GatewayError(400, "the request body must be a JSON object", "invalid_json")
        model = doc.get("model")
        if not isinstance(model, str) or not model:
            raise GatewayError(
                400, 'the request has no model: set "model" to a model name', "missing_model"
            )
        self.doc: dict[str, Any] = doc
        self.model: str = model
        self.stream = doc.get("stream") is True
        self._prompt: bytes | None = None
        self.dirty = False

    @property
    def prompt(self) -> bytes:
        """The prompt as UTF-8 bytes (computed on first use)."""
        if self._prompt is None:
            self._prompt = prompt_text(self.doc).encode("utf-8", "surrogatepass")
        return self._prompt

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
