"""OpenAI's Responses API (``POST /v1/responses``), as vLLM 0.32 serves it.

The gateway reads from its body: ``model``, ``stream``, ``max_output_tokens`` (the output
tokens a token limit reserves) and the text a prefix cache sees: ``instructions`` then the
``input`` (a string, or items: messages with a ``role`` and ``content`` as a string or parts
with ``text``). Usage is the response's ``usage`` (``input_tokens``, ``output_tokens``); a
stream carries it in its ``response.completed`` event's ``response.usage``. Errors are OpenAI's
shape, the gateway's own (``GatewayError``).

A stored response lives in one engine process (vLLM keeps them in memory, with
``VLLM_ENABLE_RESPONSES_API_STORE=1``), so a request naming it in ``previous_response_id`` must
reach that replica: any other answers 404. The gateway names each response after its replica
instead of remembering where responses went: it sets the request's ``request_id`` (a vLLM
field; vLLM makes it the response's ``id``) to ``resp_<24 random hex digits>-<tag>``, the tag
8 hex digits of a hash of the replica's address, and schedules a follow-up only onto the
candidate with that tag. Every gateway worker and replica, and the endpoint picker, read the
same tag from the id with no shared or growing state. A client's own ``request_id`` is kept
(its follow-ups are scheduled as any request); a request retried on another replica, or a
replica that went away, leaves an id whose tag matches no candidate: the follow-up is
scheduled as any request and the engine answers its 404.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from llmplane.gateway.clip import shown
from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.protocols.text import message_text

if TYPE_CHECKING:
    from llmplane.gateway.request import InferenceRequest

PATHS = ("/v1/responses",)
_T = TypeVar("_T")


def _invalid(param: str, message: str) -> GatewayError:
    return GatewayError(400, message, ErrorCode.INVALID_TYPE, param=param)


def check(doc: dict[str, Any]) -> None:
    """400 for a field the gateway acts on with the wrong type (``stream`` and the common
    fields are checked with chat's, ``request.check_fields``)."""
    tokens = doc.get("max_output_tokens")
    if tokens is not None:
        if type(tokens) is not int:
            raise _invalid(
                "max_output_tokens",
                f"{shown(tokens)} is not of type 'integer' - 'max_output_tokens'",
            )
        if tokens < 1:
            raise _invalid(
                "max_output_tokens", f"{tokens} is less than the minimum of 1 - 'max_output_tokens'"
            )
    instructions = doc.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _invalid(
            "instructions", f"{shown(instructions)} is not of type 'string' - 'instructions'"
        )
    value = doc.get("input")
    if value is not None and not isinstance(value, str | list):
        raise _invalid("input", f"{shown(value)} is not of type 'string' or 'array' - 'input'")


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
