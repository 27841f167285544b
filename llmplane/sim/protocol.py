"""OpenAI/vLLM wire format: request parameters, response bodies, SSE chunks, errors.

Shapes follow vLLM's OpenAI-compatible server: chat chunks serialised without unset
fields (no ``usage`` key until the final usage chunk, ``stop_reason`` only on the chunk
carrying ``finish_reason``), completion chunks with every field (``"usage":null``), the
usage chunk with an empty ``choices`` list, then ``data: [DONE]``. Chunks are built from
pre-encoded byte pieces; only the token text goes through orjson.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from llmplane.sim.tokenizer import WORDS, eos_length, words

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    408: "RequestTimeoutError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


class ApiError(Exception):
    def __init__(self, message: str, code: int = 400, type_: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.type = type_ or ERROR_TYPES.get(
            code, "BadRequestError" if code < 500 else "InternalServerError"
        )

    def body(self) -> bytes:
        return error_body(self.message, self.code, self.type)


def error_body(message: str, code: int, type_: str | None = None) -> bytes:
    return orjson.dumps(
        {
            "object": "error",
            "message": message,
            "type": type_ or ERROR_TYPES.get(code, "InternalServerError"),
            "param": None,
            "code": code,
        }
    )


@dataclass
class Sampling:
    max_tokens: int | None
    n: int
    stop: list[str]
    ignore_eos: bool
    min_tokens: int
    stream: bool
    include_usage: bool
    params_key: str


def _int(body: dict, key: str, default: Any, minimum: int) -> Any:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool):
        raise ApiError(f"{key} must be an integer, got {v!r}.")
    if v < minimum:
        raise ApiError(f"{key} must be at least {minimum}, got {v}.")
    return v


def parse_sampling(body: dict, chat: bool) -> Sampling:
    if chat:
        max_tokens = _int(body, "max_completion_tokens", None, 1)
        if max_tokens is None:
            max_tokens = _int(body, "max_tokens", None, 1)
    else:
        max_tokens = _int(body, "max_tokens", 16, 1)
    n = _int(body, "n", 1, 1)
    stop = body.get("stop")
    if stop is None:
        stops = []
    elif isinstance(stop, str):
        stops = [stop] if stop else []
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = [s for s in stop if s]
    else:
        raise ApiError("stop must be a string or a list of strings.")
    stream = bool(body.get("stream", False))
    opts = body.get("stream_options")
    if opts is not None and not stream:
        raise ApiError("Stream options can only be defined when `stream=True`.")
    include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    return Sampling(
        max_tokens=max_tokens,
        n=n,
        stop=stops,
        ignore_eos=bool(body.get("ignore_eos", False)),
        min_tokens=_int(body, "min_tokens", 0, 0),
        stream=stream,
        include_usage=include_usage,
        params_key=f"{body.get('seed')}|{body.get('temperature')}|{body.get('top_p')}",
    )


@dataclass
class OutputPlan:
    length: int  # output tokens, EOS included
    finish_reason: str
    stop_reason: str | None
    text_cut: int | None  # characters of text shown (None: all 4 x length)


def plan_output(seed: int, max_tokens: int, sp: Sampling, mean_output_len: int) -> OutputPlan:
    """How many tokens a sequence generates and why it stops (known in advance)."""
    if sp.ignore_eos:
        length, reason, cut = max_tokens, "length", None
    else:
        eos = max(eos_length(seed, mean_output_len), sp.min_tokens + 1)
        if eos <= max_tokens:
            # The EOS token is counted in the usage but has no text.
            length, reason, cut = eos, "stop", (eos - 1) * 4
        else:
            length, reason, cut = max_tokens, "length", None
    stop_reason = None
    if sp.stop:
        text = "".join(words(seed, 0, length))
        if cut is not None:
            text = text[:cut]
        best = None
        for s in sp.stop:
            p = text.find(s, sp.min_tokens * 4)
            if p >= 0 and (best is None or p < best[0]):
                best = (p, s)
        if best is not None:
            p, s = best
            length = (p + len(s) - 1) // 4 + 1
            reason, stop_reason, cut = "stop", s, p
    return OutputPlan(length, reason, stop_reason, cut)


def seq_text(out_words: list[int], cut: int | None) -> str:
    text = "".join([WORDS[w] for w in out_words])
    return text if cut is None else text[:cut]


def token_text(word: int, k: int, cut: int | None) -> str:
    """Text of output token ``k`` (4 characters, clipped at the stop point)."""
    if cut is None or (k + 1) * 4 <= cut:
        return WORDS[word]
    start = k * 4
    if start >= cut:
        return ""
    return WORDS[word][: cut - start]


def usage(prompt: int, completion: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
    }


def chat_response(
    rid: str, created: int, model: str, choices: list[dict], prompt: int, completion: int,
    kv_params: dict | None,
) -> bytes:  # fmt: skip
    return orjson.dumps(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(prompt, completion),
            "prompt_logprobs": None,
            "kv_transfer_params": kv_params,
        }
    )


def chat_choice(index: int, text: str, finish: str, stop_reason: str | None) -> dict:
    return {
        "index": index,
        "message": {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [],
            "reasoning_content": None,
        },
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": stop_reason,
    }


def completion_response(
    rid: str, created: int, model: str, choices: list[dict], prompt: int, completion: int,
    kv_params: dict | None,
) -> bytes:  # fmt: skip
    return orjson.dumps(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(prompt, completion),
            "kv_transfer_params": kv_params,
        }
    )


def completion_choice(index: int, text: str, finish: str, stop_reason: str | None) -> dict:
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "prompt_logprobs": None,
    }


DONE = b"data: [DONE]\n\n"


class ChunkWriter:
    """Pre-encoded pieces of one streamed response's SSE events."""

    __slots__ = ("chat", "head")

    def __init__(self, chat: bool, rid: str, created: int, model: str) -> None:
        self.chat = chat
        obj = b"chat.completion.chunk" if chat else b"text_completion"
        self.head = (
            b'data: {"id":'
            + orjson.dumps(rid)
            + b',"object":"'
            + obj
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(model)
            + b',"choices":['
        )

    def role(self, index: int) -> bytes:
        return (
            self.head + b'{"index":%d,"delta":{"role":"assistant","content":""},"logprobs":null,'
            b'"finish_reason":null}]}\n\n' % index
        )

    def token(self, index: int, text: str) -> bytes:
        if self.chat:
            return (
                self.head
                + b'{"index":%d,"delta":{"content":%s},"logprobs":null,"finish_reason":null}]}\n\n'
                % (index, orjson.dumps(text))
            )
        return (
            self.head + b'{"index":%d,"text":%s,"logprobs":null,"finish_reason":null,'
            b'"stop_reason":null}],"usage":null}\n\n' % (index, orjson.dumps(text))
        )

    def last(self, index: int, text: str, finish: str, stop_reason: str | None) -> bytes:
        sr = orjson.dumps(stop_reason)
        if self.chat:
            return (
                self.head
                + b'{"index":%d,"delta":{"content":%s},"logprobs":null,"finish_reason":"%s",'
                b'"stop_reason":%s}]}\n\n' % (index, orjson.dumps(text), finish.encode(), sr)
            )
        return (
            self.head + b'{"index":%d,"text":%s,"logprobs":null,"finish_reason":"%s",'
            b'"stop_reason":%s}],"usage":null}\n\n'
            % (index, orjson.dumps(text), finish.encode(), sr)
        )

    def usage(self, prompt: int, completion: int) -> bytes:
        return (
            self.head
            + b'],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}\n\n'
            % (
                prompt,
                prompt + completion,
                completion,
            )
        )
