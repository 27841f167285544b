"""Streams that survive their replica: a generation whose replica is lost mid-stream goes on
on another replica, spliced into the client's stream as if nothing happened.

``Splice`` follows one streamed generation event by event (pure, no I/O): what the client
was sent (text, token ids, how many tokens), whether the stream ended properly, and the
continuation request that generates the rest. It rewrites each continuation event so the
client sees one stream: the first attempt's ``id``, ``created`` and ``model``, no second role
chunk, usage counting the prompt once and the completion tokens in total. The gateway asks the
engine for token ids (``return_token_ids``, vLLM's and the sim's) and removes them again
unless the client asked for them too.

The continuation is token level on ``/v1/completions`` (the prompt's ids + the ids generated
so far: the engine sees exactly the tokens the client received) and text level for chat
(the text so far as the final assistant message, ``continue_final_message: true``,
``add_generation_prompt: false``). ``max_tokens`` (and ``min_tokens``) shrink by what was
sent; the sampling parameters and seed stay, so at temperature 0 the rest is what the lost
replica would have generated.

``Migrator`` does the I/O of a migration for the proxy: it asks the scheduler for another
replica (never one that failed this request), opens the continuation there within the route's
timeout, and counts it (metrics by reason, time to resume).
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson

from llmplane.gateway.context import RequestContext
from llmplane.gateway.errors import ErrorCode
from llmplane.gateway.observability import Counter, Histogram
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.framework import Scheduler
from llmplane.gateway.upstream_client import UpstreamPool, UpstreamResponse, encode_request

# Engines that can continue a generation (a prompt as token ids, continue_final_message).
CONTINUABLE = frozenset({"vllm", "sim"})
REASONS = ("broken", "stalled", "engine_error")
MAX_EVENT = 1 << 20  # bytes of one SSE event held while it arrives
VLLM_DEFAULT_MAX_TOKENS = 16  # /v1/completions without max_tokens
# Request fields whose output is not plain text to splice (tool calls, structured output) or
# that change what a chunk holds.
_NOT_SPLICED = ("tools", "functions", "response_format", "guided_json", "guided_regex",
                "guided_choice", "guided_grammar", "structured_outputs", "echo", "best_of",
                "suffix", "logprobs", "top_logprobs", "prompt_logprobs")  # fmt: skip


class LostStream(Exception):
    """An event says the stream is lost (an engine's error event, not an event at all)."""


def spliceable(body: dict[str, Any], chat: bool) -> bool:
    """Whether a streamed request's generation can be continued elsewhere."""
    if body.get("n") not in (None, 1) or any(body.get(k) for k in _NOT_SPLICED):
        return False
    if chat:
        messages = body.get("messages")
        return isinstance(messages, list) and bool(messages)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return bool(prompt)
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    )


class Splice:
    """One streamed generation across the replicas that serve it (see the module's doc)."""

    __slots__ = (
        "base",
        "chat",
        "client_ids",
        "done",
        "error_event",
        "failed",
        "finished",
        "head",
        "ids",
        "lost",
        "migrations",
        "parts",
        "prompt_ids",
        "request",
        "tail",
        "tokens",
        "usage_wanted",
    )  # fmt: skip

    def __init__(self, request: dict[str, Any], chat: bool) -> None:
        self.request = request  # the body as sent the first time (parsed)
        self.chat = chat
        self.client_ids = bool(request.get("return_token_ids"))
        opts = request.get("stream_options")
        self.usage_wanted = isinstance(opts, dict) and bool(opts.get("include_usage"))
        self.head: tuple[Any, Any, Any] | None = None  # id, created, model the client saw
        self.prompt_ids: list[int] | None = None
        self.ids: list[int] = []  # token ids generated and sent so far
        self.parts: list[str] = []  # their text
        self.tokens = 0  # completion tokens sent so far
        self.base = 0  # of them, those before the current attempt
        self.migrations = 0
        self.failed: set[str] = set()  # replicas it ran or was tried on: not picked again
        self.finished = False  # the choice's finish_reason was sent
        self.done = False  # [DONE] was sent
        self.tail = b""
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
        """The bytes to send the client for ``chunk`` from the upstream: whole events only,
        rewritten. At an engine's error event (or an event that cannot be one) ``lost`` says
        why, and nothing of it or after it is sent; what came before it is."""
        if self.lost is not None:
            return b""
        buf = self.tail + chunk if self.tail else chunk
        end = buf.rfind(b"\n\n")
        if end == -1:
            if len(buf) > MAX_EVENT:
                self.lost = f"an SSE event longer than {MAX_EVENT} bytes"
            self.tail = buf if self.lost is None else b""
            return b""
        self.tail = buf[end + 2 :]
        out = []
        for event in buf[:end].split(b"\n\n"):
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
            keep = keep or not again or not self._role_only(choice)
        usage = obj.get("usage")
        if again and isinstance(usage, dict):
            self._usage(usage)
            changed = True
        if again and self.chat and obj.get("object") == "text_completion":
            obj["object"] = "chat.completion.chunk"
        if obj.get("choices") and not keep:
            return b""  # a continuation's role chunk: the client had one
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
            self.ids.extend(ids)
            self.tokens += len(ids)
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

    @staticmethod
    def _role_only(choice: dict[str, Any]) -> bool:
        delta = choice.get("delta")
        return (
            isinstance(delta, dict)
            and not delta.get("content")
            and not choice.get("token_ids")
            and choice.get("finish_reason") is None
        )

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

    @property
    def by_ids(self) -> bool:
        """Whether the continuation is token level (on /v1/completions, chat included)."""
        return self.prompt_ids is not None and len(self.ids) == self.tokens

    def continuation(self, path: str) -> tuple[str, bytes]:
        """The request (path and body) that generates the rest of this generation; ``path``
        is the client's (with its query)."""
        if self.chat and self.by_ids:
            return _completions_path(path), self._chat_by_ids()
        body = dict(self.request)
        sent = self.tokens
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int):
                body[key] -= sent
        if not self.chat and body.get("max_tokens") is None:
            body["max_tokens"] = VLLM_DEFAULT_MAX_TOKENS - sent
        if isinstance(body.get("min_tokens"), int):
            body["min_tokens"] = max(0, body["min_tokens"] - sent)
        body["return_token_ids"] = True
        if self.chat:
            text = "".join(self.parts)
            messages = list(body["messages"])
            last = messages[-1]
            if body.get("continue_final_message") and isinstance(last, dict):
                messages[-1] = {**last, "content": _text(last.get("content")) + text}
            else:
                messages.append({"role": "assistant", "content": text})
            body["messages"] = messages
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        else:
            assert self.prompt_ids is not None
            body["prompt"] = self.prompt_ids + self.ids
        return path, orjson.dumps(body)

    def _chat_by_ids(self) -> bytes:
        """A chat's continuation as a completion of the templated prompt's ids + the ids
        generated so far: exactly the tokens the client received, where re-tokenizing the
        text (``continue_final_message``) may merge them differently."""
        request = self.request
        body = {k: request[k] for k in _SAMPLING if k in request}
        assert self.prompt_ids is not None
        body["prompt"] = self.prompt_ids + self.ids
        left = self.remaining()
        body["max_tokens"] = left  # None: up to the context's end, as the chat's default
        if isinstance(body.get("min_tokens"), int):
            body["min_tokens"] = max(0, body["min_tokens"] - self.tokens)
        body["return_token_ids"] = True
        return orjson.dumps(body)

    def can_continue(self) -> str | None:
        """Why this generation cannot be continued now (None: it can)."""
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

    def started(self) -> None:
        """A continuation was opened: what follows comes after what was sent."""
        self.migrations += 1
        self.base = self.tokens
        self.tail = b""
        self.lost = self.error_event = None

    def ending(self) -> bytes:
        """The end of a stream lost after its final chunk: the usage chunk the client asked
        for, then [DONE]."""
        out = b""
        if self.usage_wanted and self.head is not None:
            rid, created, model = self.head
            prompt = len(self.prompt_ids or ())
            obj = {
                "id": rid,
                "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": created,
                "model": model,
                "choices": [],
                "usage": {
                    "prompt_tokens": prompt,
                    "total_tokens": prompt + self.tokens,
                    "completion_tokens": self.tokens,
                },
            }
            out = b"data: " + orjson.dumps(obj) + b"\n\n"
        self.done = True
        return out + b"data: [DONE]\n\n"


# What a chat continued as a completion keeps of its request: the sampling parameters.
_SAMPLING = ("model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p",
             "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens", "presence_penalty",
             "frequency_penalty", "repetition_penalty", "length_penalty", "logit_bias",
             "bad_words", "allowed_token_ids", "skip_special_tokens",
             "spaces_between_special_tokens", "include_stop_str_in_output", "user",
             "priority", "cache_salt")  # fmt: skip


def _completions_path(path: str) -> str:
    """``/v1/chat/completions?q`` -> ``/v1/completions?q``."""
    head, sep, query = path.partition("?")
    return head.removesuffix("/chat/completions") + "/completions" + sep + query


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def failed_event(detail: str) -> bytes:
    """The SSE events that end a stream no replica could continue."""
    error = {"message": detail, "type": "server_error", "code": ErrorCode.STREAM_LOST}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\ndata: [DONE]\n\n"


class Migrator:
    """Moves lost streams to another replica (the proxy calls ``resume``)."""

    def __init__(self, scheduler: Scheduler, outliers: Outliers, max_sequence: int) -> None:
        self.scheduler = scheduler
        self.outliers = outliers
        self.max_sequence = max_sequence  # prompt + generated tokens beyond which no migration
        self.migrations = Counter(
            "llmplane_gateway_stream_migrations_total",
            "Streams continued on another replica after theirs was lost, by reason",
            ("route", "reason"),
        )
        self.failures = Counter(
            "llmplane_gateway_stream_migration_failures_total",
            "Lost streams that could not be continued (limit, no replica left, not continuable)",
            ("route",),
        )
        self.resume = Histogram(
            "llmplane_gateway_stream_resume_seconds",
            "From a lost stream to the first chunk of its continuation",
            ("route",),
            (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )

    def metrics(self) -> list[Counter | Histogram]:
        return [self.migrations, self.failures, self.resume]

    def repick(self, ctx: RequestContext, exclude: set[str]) -> EndpointState | None:
        """The scheduler's pick for a continuation among the route's replicas outlier
        ejection allows, but ``exclude`` (addresses the stream ran or was tried on)."""
        decision, sched = ctx.decision, ctx.scheduling
        if decision is None or sched is None:
            return None
        backend = decision.backend
        available = self.outliers.available(backend.candidates, time.monotonic())
        rest = [s for s in available if s.endpoint.address not in exclude]
        if not rest:
            return None
        pick = self.scheduler.pick(sched, rest, 1, backend.profile)
        if not pick.endpoints:
            return None
        state = pick.endpoints[0]
        self.scheduler.profile(backend.profile).on_pick(sched, state)  # the prefix index learns
        return state

    @staticmethod
    def splice(
        ctx: RequestContext, state: EndpointState, body: bytes
    ) -> tuple[Splice, bytes] | None:
        """A streamed request's splice (and its body) when its route and engine allow a
        migration; else None."""
        decision, inference = ctx.decision, ctx.inference
        if (
            decision is None
            or inference is None
            or decision.backend.migration_limit < 1
            or state.endpoint.engine not in CONTINUABLE
            or decision.backend.pd is not None
        ):
            return None
        path = inference.path
        if not path.endswith("/completions"):  # (Responses, Messages: their own events)
            return None
        return Splice.of(body, path.endswith("/chat/completions"))

    async def continue_on(
        self,
        pool: UpstreamPool,
        ctx: RequestContext,
        splice: Splice,
        reason: str,
        failed: EndpointState,
        headers: dict[str, str],
    ) -> tuple[EndpointState, UpstreamResponse, bytes] | str:
        """(replica, response, its first chunk) of the continuation, or why there is none."""
        decision = ctx.decision
        assert decision is not None
        backend = decision.backend
        route = decision.route
        t0 = time.perf_counter()
        why = splice.can_continue()
        if why is None and splice.sequence > self.max_sequence:
            why = f"{splice.sequence} tokens exceed the migration limit of {self.max_sequence}"
        exclude = splice.failed
        exclude.add(failed.endpoint.address)
        while why is None:
            if splice.migrations >= backend.migration_limit:
                why = f"the route's migration limit ({backend.migration_limit}) was reached"
                break
            state = self.repick(ctx, exclude)
            if state is None:
                why = "no other replica is available"
                break
            address = backend.address(state)
            exclude.add(state.endpoint.address)
            path, body = splice.continuation(ctx.request.path_qs)
            wire = encode_request("POST", path, address, headers, body)
            state.add_inflight(1)
            resp: UpstreamResponse | None = None
            try:
                with pool.deadlines.after(backend.timeout):
                    resp = await pool.open(address, wire)
                    if resp.status != 200:
                        await resp.read()
                        raise aiohttp.ClientError(f"HTTP {resp.status}")
                    first = await resp.readany()
                if not first:
                    raise aiohttp.ClientError("an empty response")
            except BaseException as err:
                state.add_inflight(-1)
                if resp is not None:
                    resp.release()
                if not isinstance(err, TimeoutError | aiohttp.ClientError | OSError):
                    raise  # cancelled (the client went away, the gateway stops)
                ctx.failed(address, f"continuation: {type(err).__name__}: {err}")
                splice.migrations += 1  # a failed try counts against the limit
                continue
            splice.started()
            self.migrations.labels(route, reason).inc()
            resumed = time.perf_counter() - t0
            self.resume.labels(route).observe(resumed)
            note = {"reason": reason, "from": failed.endpoint.address, "to": address,
                    "resume_ms": round(resumed * 1000, 3)}  # fmt: skip
            ctx.migrations = [*ctx.migrations, note] if ctx.migrations else [note]
            ctx.endpoint = address
            return state, resp, first
        self.failures.labels(route).inc()
        return why
