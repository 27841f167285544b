"""OpenAI's Responses API (``POST /v1/responses``), as vLLM serves it (docs/gateway.md's table
of APIs, and ``previous_response_id``).

A stored response lives in the memory of one engine process, so a follow-up naming it must
reach that replica. Rather than remember where responses went, the gateway names each response
after its replica (``request_id``, which vLLM makes the response's id, ends in a tag of the
replica's address): every worker, replica and the endpoint picker read the same tag from the id
with no shared or growing state.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from llmplane.gateway.protocols.fields import positive, typed
from llmplane.gateway.protocols.text import message_text

if TYPE_CHECKING:
    from llmplane.gateway.request import InferenceRequest

PATHS = ("/v1/responses",)
_T = TypeVar("_T")


def check(doc: dict[str, Any]) -> None:
    """400 for a field the gateway acts on with the wrong type (``stream`` and the common
    fields are checked with chat's, ``request.check_fields``)."""
    positive(doc, "max_output_tokens")
    typed(doc, "instructions", str)
    typed(doc, "input", str, list)


def prompt_text(doc: dict[str, Any]) -> str:
    """The instructions, then each input item's role and text, in order."""
    parts: list[str] = []
    instructions = doc.get("instructions")
    if isinstance(instructions, str):
        parts += ("system:", instructions, "\n")
    value = doc.get("input")
    if isinstance(value, str):
        parts += ("user:", value, "\n")
    elif isinstance(value, list):
        for item in value:
            message_text(item, parts)
    return "".join(parts)


def replica_tag(address: str) -> str:
    """The 8 hex digits a response id carries for the replica at ``address``."""
    return hashlib.blake2b(address.encode(), digest_size=4).hexdigest()


def holders(
    doc: dict[str, Any], candidates: Sequence[_T], address: Callable[[_T], str]
) -> Sequence[_T]:
    """The candidate holding the response ``previous_response_id`` names (its tag), alone;
    all of them when there is none or no candidate has the tag."""
    previous = doc.get("previous_response_id")
    if not isinstance(previous, str) or len(candidates) < 2:
        return candidates
    head, dash, tag = previous.rpartition("-")
    if not dash or len(tag) != 8 or not head.startswith("resp_"):
        return candidates
    held = [c for c in candidates if replica_tag(address(c)) == tag]
    return held or candidates


def name_response(inference: InferenceRequest, address: str) -> None:
    """Give a request that may be stored (``store`` not false) the id that names the replica
    at ``address``, unless the client set ``request_id`` itself."""
    doc = inference.doc
    if doc.get("store") is False or "request_id" in doc:
        return
    doc["request_id"] = f"resp_{secrets.token_hex(12)}-{replica_tag(address)}"
    inference.mark_dirty()
