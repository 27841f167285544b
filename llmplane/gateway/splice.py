"""One streamed generation across the replicas that serve it (docs/gateway.md, "Streams that
survive their replica"): what the client was sent, the request that generates the rest, and
each continuation event rewritten into the client's stream. Pure; ``migration.py`` does the I/O.

Until a stream is lost its events go out as they came and are only kept, to be read when
needed: a stream that never migrates is never parsed past its first event. The continuation is
token level where the engine sent the ids (the engine then sees exactly the tokens the client
received); the sampling parameters and seed stay, so at temperature 0 the rest is what the lost
replica would have generated.
"""

from __future__ import annotations

import contextlib
import re
from array import array
from typing import Any

import orjson

from llmplane.gateway.errors import ErrorCode
from llmplane.gateway.protocols.text import content_text

MAX_EVENT = 1 << 20  # bytes of one SSE event held while it arrives
KEEP_BYTES = 256 << 10  # events kept unread at most, per stream (then read: ``catch_up``)
# The token ids in an event of vLLM or the sim (compact JSON; never inside a string, where
# quotes are escaped).
_IDS = re.compile(rb'"(prompt_)?token_ids":\[[^\]]*\]')
_NULL_IDS = rb'"\1token_ids":null'
VLLM_DEFAULT_MAX_TOKENS = 16  # /v1/completions without max_tokens
# Request fields whose output is not plain text to splice (tool calls, structured output) or
# that change what a chunk holds.
_NOT_SPLICED = ("tools", "functions", "response_format", "guided_json", "guided_regex",
                "guided_choice", "guided_grammar", "structured_outputs", "echo", "best_of",
                "suffix", "logprobs", "top_logprobs", "prompt_logprobs")  # fmt: skip

# What a chat continued as a completion keeps of its request: the sampling parameters.
_SAMPLING = ("model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p",
             "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens", "presence_penalty",
             "frequency_penalty", "repetition_penalty", "length_penalty", "logit_bias",
             "bad_words", "allowed_token_ids", "skip_special_tokens",
             "spaces_between_special_tokens", "include_stop_str_in_output", "user",
             "priority", "cache_salt")  # fmt: skip


class LostStream(Exception):
    """An event says the stream is lost (an engine's error event, not an event at all)."""


def spliceable(body: dict[str, Any], chat: bool) -> bool:
    """Whether a streamed request's generation can be continued elsewhere."""
    if body.get("n") not in (None, 1) or any(body.get(k) for k in _NOT_SPLICED):
        return False
    if chat:
        return isinstance(body.get("messages"), list) and bool(body["messages"])
    prompt = body.get("prompt")
    if isinstance(prompt, str | list) and prompt:
        return isinstance(prompt, str) or all(type(t) is int for t in prompt)  # one prompt
    return False


class Splice:
    """One streamed generation across the replicas that serve it (see the module's doc)."""

    __slots__ = ("base", "chat", "client_ids", "done", "error_event", "failed", "finished",
                 "head", "ids", "kept", "kept_bytes", "lean", "lost", "migrations", "parts",
                 "prompt_ids", "request", "tail", "tokens", "usage_wanted")  # fmt: skip

    def __init__(self, request: dict[str, Any], chat: bool) -> None:
        self.request = request  # the body as sent the first time (parsed)
        self.chat = chat
        self.client_ids = bool(request.get("return_token_ids"))
        opts = request.get("stream_options")
        self.usage_wanted = isinstance(opts, dict) and bool(opts.get("include_usage"))
        self.head: tuple[Any, Any, Any] | None = None  # id, created, model the client saw
        self.prompt_ids: list[int] | None = None
        # Token ids generated and sent so far, and their text: 8 bytes a token and a string
        # (joined at each ``catch_up``), not a Python object each (a stream of 100,000 tokens
        # would keep about 10 MB).
        self.ids = array("q")
        self.parts: list[str] = []
        self.tokens = 0  # completion tokens sent so far
        self.base = 0  # of them, those before the current attempt
        self.migrations = 0
        self.failed: set[str] = set()  # replicas it ran or was tried on: not picked again
        self.finished = False  # the choice's finish_reason was sent
        self.done = False  # [DONE] was sent
        self.tail = b""
        self.kept: list[bytes] = []  # events sent as they came, not read yet (``catch_up``)
        self.kept_bytes = 0
        self.lean = True  # events pass as bytes until a loss (False: each one parsed)
        self.error_event: bytes | None = None  # an engine's error event, held back
        self.lost: str | None = None  # why the current replica's stream is lost (feed)

    @classmethod
    def of(cls, body: bytes, chat: bool) -> tuple[Splice, bytes] | None:
        """The splice of a request and the body to send (asking for token ids), or None
        when its generation cannot be continued."""
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(request, dict) or not spliceable(request, chat):
            return None
        splice = cls(request, chat)
        if splice.client_ids:
            return splice, body
        return splice, orjson.dumps({**request, "return_token_ids": True})

    @property
    def sequence(self) -> int:
        """Tokens of prompt and generation so far."""
        return len(self.prompt_ids or ()) + self.tokens

    def feed(self, chunk: bytes) -> bytes:
        """The whole events to send the client for ``chunk``. At an engine's error event (or
        an event that cannot be one) ``lost`` says why and nothing from it on is sent."""
        if self.lost is not None:
            return b""
        buf = self.tail + chunk if self.tail else chunk
        end = buf.rfind(b"\n\n")
        if end == -1:
            if len(buf) > MAX_EVENT:
                self.lost = f"an SSE event longer than {MAX_EVENT} bytes"
            self.tail = buf if self.lost is None else b""
            return b""
        end += 2
        whole, self.tail = (buf, b"") if end == len(buf) else (buf[:end], buf[end:])
        if (
            self.migrations
            or not self.lean
            or self.head is None
            or b'{"error"' in whole
            or (self.chat and not self.client_ids and b'"delta":{}' in whole)
        ):  # a continuation, the first events, an error event, a chunk only there for its ids
            self.catch_up()
            return self._events(whole)
        if not self.finished and b'"finish_reason":"' in whole:
            self.finished = True
        if whole.endswith(b"data: [DONE]\n\n"):
            if not self.finished:  # read as a lost stream: what came before [DONE] goes out
                self.catch_up()
                return self._events(whole)
            self.done = True
        self.kept.append(whole)
        self.kept_bytes += len(whole)
        if self.kept_bytes > KEEP_BYTES:
            self.catch_up()
        return whole if self.client_ids else _IDS.sub(_NULL_IDS, whole)

    def catch_up(self) -> None:
        """Read the events kept as they went out (what was sent, its token ids)."""
        kept, self.kept, self.kept_bytes = self.kept, [], 0
        for whole in kept:
            for event in whole.split(b"\n\n"):
                if event:
                    with contextlib.suppress(LostStream):
                        self._event(event)
        if len(self.parts) > 1:
            self.parts = ["".join(self.parts)]

    def _events(self, whole: bytes) -> bytes:
        """Whole events, parsed and rewritten one by one."""
        out = []
        for event in whole.split(b"\n\n"):
            if event:
                try:
                    piece = self._event(event)
                except LostStream as err:
                    self.lost, self.tail = str(err), b""
                    break
                if piece:
                    out.append(piece)
        return b"".join(out)

    def _event(self, event: bytes) -> bytes:
        if not event.startswith(b"data:"):
            return event + b"\n\n"  # a comment: as it came
        data = event[5:].strip()
        if data == b"[DONE]":
            if not self.finished:
                raise LostStream("the stream ended without a finish reason")
            self.done = True
            return event + b"\n\n"
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise LostStream("an SSE event that is not JSON") from None
        if not isinstance(obj, dict):
            raise LostStream("an SSE event that is not a JSON object")
        if "error" in obj and not obj.get("choices"):
            self.error_event = event + b"\n\n"
            raise LostStream(f"engine error: {str(obj['error'])[:200]}")
        again = self.migrations > 0  # a continuation's event
        if self.head is None:
            self.head = (obj.get("id"), obj.get("created"), obj.get("model"))
        changed = False
        if again:
            obj["id"], obj["created"], obj["model"] = self.head
            changed = True
        if "prompt_token_ids" in obj:  # the chat role chunk's
            changed |= self._prompt(obj, again)
        keep = False
        for choice in obj.get("choices") or ():
            changed |= self._choice(choice, again)
            keep = keep or not self._hollow(choice, again)
        usage = obj.get("usage")
        if again and isinstance(usage, dict):
            self._usage(usage)
            changed = True
        if again and self.chat and obj.get("object") == "text_completion":
            obj["object"] = "chat.completion.chunk"
        if obj.get("choices") and not keep:
            return b""  # nothing the client would have had from the engine
        if not again and changed:  # the first replica's: only its ids set back to null
            out = _IDS.sub(_NULL_IDS, event)
            if out != event:
                return out + b"\n\n"
            self.lean = False  # ids in a form the pattern misses: every event parsed
        return b"data: " + orjson.dumps(obj) + b"\n\n" if changed else event + b"\n\n"

    def _prompt(self, holder: dict[str, Any], again: bool) -> bool:
        ids = holder.get("prompt_token_ids")
        if ids is None:
            return False
        if self.prompt_ids is None and not again and isinstance(ids, list):
            self.prompt_ids = ids
        if again or not self.client_ids:
            holder["prompt_token_ids"] = None
            return True
        return False

    def _choice(self, choice: dict[str, Any], again: bool) -> bool:
        changed = False
        if self.chat and "text" in choice and "delta" not in choice:
            # a chat continued as a completion: its chunks in the chat's shape
            text = choice.pop("text")
            choice.pop("prompt_token_ids", None)
            choice["delta"] = {"content": text}
            changed = True
        if "prompt_token_ids" in choice:  # a completion's first chunk's
            changed = self._prompt(choice, again)
        if choice.get("index", 0) != 0:
            choice["index"] = 0
            changed = True
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self.tokens += len(ids)
            # (ids that are not 64-bit integers stop short: ``len(self.ids)`` then stays
            # below ``tokens`` and the stream is not continued by ids)
            with contextlib.suppress(TypeError, OverflowError):
                self.ids.extend(ids)
            if not self.client_ids:
                choice["token_ids"] = None
                changed = True
        if self.chat:
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else None
            if again and isinstance(delta, dict) and "role" in delta:
                del delta["role"]
                changed = True
        else:
            text = choice.get("text")
        if isinstance(text, str) and text:
            self.parts.append(text)
        if choice.get("finish_reason") is not None:
            self.finished = True
        return changed

    def _hollow(self, choice: dict[str, Any], again: bool) -> bool:
        """A chat chunk the engine sends only because the gateway asked for token ids
        (``"delta": {}``), or a continuation's chunk without content (its role chunk, the
        role already removed): the client, who had its role chunk, gets neither."""
        if not self.chat or choice.get("finish_reason") is not None or choice.get("token_ids"):
            return False
        delta = choice.get("delta")
        return isinstance(delta, dict) and (not any(delta.values()) if again else not delta)

    def _usage(self, usage: dict[str, Any]) -> None:
        """Prompt tokens once (the client's prompt), completion tokens in total."""
        prompt = len(self.prompt_ids) if self.prompt_ids is not None else usage.get("prompt_tokens")
        completion = self.base + int(usage.get("completion_tokens") or 0)
        usage["prompt_tokens"] = prompt
        usage["completion_tokens"] = completion
        usage["total_tokens"] = (prompt or 0) + completion

    def remaining(self) -> int | None:
        """Tokens left to generate (None: the request set no limit)."""
        limit = self.request.get("max_completion_tokens") or self.request.get("max_tokens")
        if limit is None and not self.chat:
            limit = VLLM_DEFAULT_MAX_TOKENS
        if not isinstance(limit, int) or isinstance(limit, bool):
            return None
        return limit - self.tokens

    def continuation(self, path: str) -> tuple[str, bytes]:
        """The request (path and body) that generates the rest; ``path`` is the client's (with
        its query). A chat continued by ids is a completion of the templated prompt's ids + the
        generated ones: re-tokenizing the text (``continue_final_message``) may merge them
        differently from what the client received."""
        self.catch_up()
        sent, request = self.tokens, self.request
        by_ids = self.prompt_ids is not None and len(self.ids) == sent
        if self.chat and by_ids:
            head, sep, query = path.partition("?")
            path = head.removesuffix("/chat/completions") + "/completions" + sep + query
            body = {k: request[k] for k in _SAMPLING if k in request}
            body["max_tokens"] = self.remaining()  # None: up to the context's end, as chat's
        else:
            body = dict(request)
            for key in ("max_tokens", "max_completion_tokens"):
                if isinstance(body.get(key), int):
                    body[key] -= sent
            if not self.chat and body.get("max_tokens") is None:
                body["max_tokens"] = VLLM_DEFAULT_MAX_TOKENS - sent
        if isinstance(body.get("min_tokens"), int):
            body["min_tokens"] = max(0, body["min_tokens"] - sent)
        body["return_token_ids"] = True
        if self.chat and not by_ids:
            text = "".join(self.parts)
            messages = list(body["messages"])
            last = messages[-1]
            if body.get("continue_final_message") and isinstance(last, dict):
                before: list[str] = []
                content_text(last.get("content"), before)
                messages[-1] = {**last, "content": "".join(before) + text}
            else:
                messages.append({"role": "assistant", "content": text})
            body["messages"] = messages
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        else:
            assert self.prompt_ids is not None
            body["prompt"] = self.prompt_ids + self.ids.tolist()
        return path, orjson.dumps(body)

    def can_continue(self) -> str | None:
        """Why this generation cannot be continued now (None: it can)."""
        self.catch_up()
        if self.head is None:
            return "nothing was streamed yet"
        if not self.chat and self.prompt_ids is None:
            return "the engine sent no prompt token ids"
        if len(self.ids) != self.tokens:
            return "the engine sent no token ids"
        left = self.remaining()
        if left is not None and left < 1:
            return "no tokens left to generate"
        return None

    def forget(self, n: int) -> None:
        """The last ``n`` tokens end in the middle of a character, so the engine never sent
        their text: the continuation generates them again."""
        if n > 0:
            del self.ids[-n:]
            self.tokens -= n

    def started(self) -> None:
        """A continuation was opened: what follows comes after what was sent."""
        self.migrations += 1
        self.base = self.tokens
        self.tail = b""
        self.lost = self.error_event = None

    def ending(self) -> bytes:
        """The end of a stream lost after its final chunk: the usage chunk the client asked
        for, then [DONE]."""
        self.catch_up()
        out = b""
        if self.usage_wanted and self.head is not None:
            rid, created, model = self.head
            prompt = len(self.prompt_ids or ())
            kind = "chat.completion.chunk" if self.chat else "text_completion"
            usage = {"prompt_tokens": prompt, "total_tokens": prompt + self.tokens,
                     "completion_tokens": self.tokens}  # fmt: skip
            obj = {"id": rid, "object": kind, "created": created, "model": model,
                   "choices": [], "usage": usage}  # fmt: skip
            out = b"data: " + orjson.dumps(obj) + b"\n\n"
        self.done = True
        return out + b"data: [DONE]\n\n"


def failed_event(detail: str, retry_after: float | None = None) -> bytes:
    """The SSE events that end a stream no replica could continue; ``retry_after``: seconds
    after which the client may try again (no replica was left: one may be back by then)."""
    error: dict[str, Any] = {"message": detail, "type": "server_error",
                             "code": ErrorCode.STREAM_LOST}  # fmt: skip
    if retry_after is not None:
        seconds = max(1, round(retry_after))
        error["message"] = f"{detail}; retry in {seconds} s"
        error["retry_after"] = seconds
    return b"data: " + orjson.dumps({"error": error}) + b"\n\ndata: [DONE]\n\n"
