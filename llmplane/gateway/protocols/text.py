"""The text of a message's content in any of the APIs: a string, or a list of parts (strings,
or objects with a ``text``: chat's ``text`` parts, the Responses API's ``input_text``, the
Messages API's ``text`` blocks)."""

from __future__ import annotations

from typing import Any


def content_text(content: Any, parts: list[str]) -> None:
    """Append the texts of ``content`` to ``parts`` (anything else in it is left out)."""
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


def message_text(message: Any, parts: list[str]) -> None:
    """Append a message's role and text, then a newline, to ``parts`` (chat messages,
    Responses input items, Messages messages); a string item as it is."""
    if isinstance(message, str):
        parts.append(message)
    elif isinstance(message, dict):
        role = message.get("role")
        if isinstance(role, str):
            parts += (role, ":")
        content_text(message.get("content"), parts)
        parts.append("\n")


def messages_text(messages: Any, parts: list[str]) -> bool:
    """Append the role and text of each message of a list of ``messages`` (chat's, the
    Messages API's) to ``parts``; False when ``messages`` is not a list."""
    if not isinstance(messages, list):
        return False
    for message in messages:
        if isinstance(message, dict):
            message_text(message, parts)
    return True
