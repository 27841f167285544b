"""``/v1/completions`` and ``/v1/chat/completions`` of the simulated server: prompts in,
generation through the engine, whole or streamed responses out (``SimServer`` mixes it in)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from xxhash import xxh64_intdigest

from llmplane.sim.engine import Group
from llmplane.sim.protocol import (
    DONE,
    ApiError,
    ChunkWriter,
    Sampling,
    chat_choice,
    chat_response,
    completion_choice,
    completion_response,
    invalid,
    parse_sampling,
    plan_output,
    request_validation,
    seq_text,
    token_text,
)
from llmplane.sim.scheduler import Sequence
from llmplane.sim.tokenizer import (
    continuation,
    final_words,
    message_text,
    render_chat,
    sequence_seed,
    tokenize,
)
from llmplane.sim.wire import SSE_HEADERS, error_response, json_response

log = logging.getLogger("llmplane.sim")
# vLLM's event when its engine fails in the middle of a stream (then [DONE]).
ENGINE_ERROR = (
    b'data: {"error": {"object": "error", "message": "EngineCore encountered an issue.", '
    b'"type": "InternalServerError", "param": null, "code": 500}}\n\n' + DONE
)


@dataclass
class Job:
    """A checked request's sequences, submitted to the engine."""

    group: Group
    sp: Sampling
    model: str  # the name the response carries (the adapter's, else the served model's)
    prompt_tokens: int
    remote_decode: bool

    async def finished(self) -> None:
        while self.group.remaining > 0:
            await self.group.wait()

    async def tokens(self) -> AsyncIterator[list[str]]:
        """The text of each token of the first sequence as it is generated, a list per
        engine step (the last token of a sequence stopped at EOS has none: ``""``)."""
        seq, sent = self.group.seqs[0], 0
        while True:
            n = seq.num_output
            if sent < n:
                yield [token_text(seq.out_words[k], k, seq.text_cut) for k in range(sent, n)]
                sent = n
            if sent >= seq.target_len:
                return
            await self.group.wait()


class CompletionRoutes:
    """The inference routes; state (engine, config, faults, ids) is ``SimServer``'s."""

    async def chat(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    def _prompts(self, body: dict, chat: bool) -> list[list[int]]:
        prompts = self._raw_prompts(body, chat)
        return prompts

    def _seeded_prompts(self, body: dict, chat: bool) -> list[tuple[list[int], list[int], int]]:
        """Each prompt as (its ids, the ids its seed hashes, pseudo-words it continues)."""
        prompts = self._raw_prompts(body, chat)
        if not chat:
            # Only a prompt of token ids may continue a generation (the gateway continues a
            # lost stream with prompt + generated ids): a text prompt made of pseudo-words, as
            # tests and benchmarks send, is a prompt like any other.
            prompt = body.get("prompt")
            given = (
                [True] if isinstance(prompt[0], int) else [isinstance(p, list) for p in prompt]
            ) if isinstance(prompt, list) else [False]  # fmt: skip
            return [
                (ids, *continuation(ids, self.word_ids)) if as_ids else (ids, ids, 0)
                for ids, as_ids in zip(prompts, given, strict=True)
            ]
        ids = prompts[0]
        if body.get("continue_final_message"):
            # As vLLM's continue_final_message: the last (assistant) message is left open and
            # generation continues it; its pseudo-words are a generation to go on with.
            messages = body["messages"]
            words = final_words(message_text(messages[-1].get("content")))
            if words and len(messages) > 1:
                return [(ids, tokenize(render_chat(messages[:-1], True), self.cfg.vocab_size),
                         words)]  # fmt: skip
        return [(ids, ids, 0)]

    def _check_ids(self, ids: list) -> list[int]:
        vocab = self.cfg.vocab_size
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
                raise ApiError(f"Token id {t!r} is out of vocabulary")
        return list(ids)

    def _raw_prompts(self, body: dict, chat: bool) -> list[list[int]]:
        vocab = self.cfg.vocab_size
        if chat:
            messages = body.get("messages")
            if messages is None:
                raise request_validation(
                    "missing", "body.messages", "Field required", f"<dict of {len(body)} items>"
                )
            if not isinstance(messages, list):
                raise request_validation(
                    "list_type", "body.messages", "Input should be a valid list", messages
                )
            if not messages:
                raise ApiError(
                    "Cannot apply chat template to an empty conversation. "
                    "Provide at least one message."
                )
            for i, m in enumerate(messages):
                if not isinstance(m, dict):
                    raise request_validation(
                        "model_type", f"body.messages.{i}", "Input should be a valid dictionary",
                        m,
                    )  # fmt: skip
            cont = bool(body.get("continue_final_message", False))
            agp = bool(body.get("add_generation_prompt", True))
            if cont and agp:
                raise ApiError(
                    "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
                )
            text = render_chat(messages, agp)
            if cont:
                text = text[:-1]  # the final message stays open: no newline after it
            return [tokenize(text, vocab)]
        prompt = body.get("prompt")
        if prompt is None or prompt == "" or prompt == []:
            raise invalid(
                "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"
            )
        if isinstance(prompt, str):
            return [tokenize(prompt, vocab)]
        if isinstance(prompt, list) and prompt:
            if isinstance(prompt[0], int):
                return [self._check_ids(prompt)]
            out = []
            for p in prompt:
                if isinstance(p, str):
                    out.append(tokenize(p, vocab))
                elif isinstance(p, list) and p:
                    out.append(self._check_ids(p))
                else:
                    raise invalid(
                        "prompt must be a string, a list of strings or token ids.", "prompt"
                    )
            return out
        raise invalid("prompt must be a string, a list of strings or token ids.", "prompt")

    async def _generate(self, request: web.BaseRequest, chat: bool) -> web.StreamResponse:
        faulted = await self._faults_before()
        if faulted is not None:
            return faulted
        try:
            job = self._start(await self._json(request), chat)
        except ApiError as e:
            return error_response(e)
        group, sp, seqs, cfg = job.group, job.sp, job.group.seqs, self.cfg
        rid = self._next_id("chatcmpl-" if chat else "cmpl-")
        created = int(time.time())
        try:
            if sp.stream:
                return await self._stream(request, group, chat, rid, created, job.model, sp,
                                          job.prompt_tokens)  # fmt: skip
            await job.finished()
        finally:
            if group.remaining > 0:
                self.engine.abort(group)
        completion_tokens = 0
        choices = []
        make = chat_choice if chat else completion_choice
        for seq in seqs:
            completion_tokens += seq.num_output
            choice = make(
                seq.index, seq_text(seq.out_words, seq.text_cut), seq.finish_reason,
                seq.stop_reason,
            )  # fmt: skip
            if sp.return_token_ids:  # as vLLM: the choice's ids (and a completion's prompt's)
                choice["token_ids"] = seq.token_ids[seq.prompt_len :]
                if not chat:
                    choice["prompt_token_ids"] = seq.token_ids[: seq.prompt_len]
            choices.append(choice)
        kv_params = None
        if job.remote_decode:
            kv_params = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": seqs[0].final_blocks,
                "remote_engine_id": self.engine_id,
                "remote_host": cfg.host,
                "remote_port": self.port,
                "tp_size": 1,
            }
        if chat:
            prompt_ids = seqs[0].token_ids[: seqs[0].prompt_len] if sp.return_token_ids else None
            body = chat_response(rid, created, job.model, choices, job.prompt_tokens,
                                 completion_tokens, kv_params, self.fingerprint,
                                 prompt_ids)  # fmt: skip
        else:
            body = completion_response(rid, created, job.model, choices, job.prompt_tokens,
                                       completion_tokens, kv_params, self.fingerprint)  # fmt: skip
        return json_response(body)

    def _start(self, body: dict, chat: bool) -> Job:
        """Check a chat or completions ``body`` as vLLM does (``ApiError``) and submit its
        sequences to the engine (the caller aborts the group if it stops early)."""
        lora = self._resolve_model(body.get("model"))
        sp = parse_sampling(body, chat)
        prompts = self._seeded_prompts(body, chat)
        remote_decode, remote_prefill = self._pd_flags(body)
        cfg = self.cfg
        max_len = cfg.max_model_len
        group = Group(sp.stream, sp.n, sp.max_tokens)
        hash_seed = self._lora_seed(lora) if lora else 0
        key = f"{lora}|{sp.params_key}"
        seqs = group.seqs
        if sp.max_tokens is not None and sp.max_tokens > max_len:
            p = sp.max_tokens_param
            raise invalid(
                f"{p}={sp.max_tokens} cannot be greater than max_model_len={max_len}. "
                "Please request fewer output tokens.", p, sp.max_tokens,
            )  # fmt: skip
        for pi, (ids, seed_ids, start) in enumerate(prompts):
            plen = len(ids)
            if plen == 0:
                raise invalid(
                    "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"
                )
            if plen > max_len:
                # vLLM tokenizes at most max_len + 1 tokens, hence "at least".
                count = min(plen, max_len + 1)
                least = "at least " if count == max_len + 1 else ""
                raise invalid(
                    f"This model's maximum context length is {max_len} tokens. However, "
                    f"your prompt contains {least}{count} input tokens, which exceeds this "
                    "limit even without any output tokens. Please reduce the length of "
                    "the input prompt.", "input_tokens", count,
                )  # fmt: skip
            # As vLLM: max_tokens is cut to what the context has room for, not refused.
            room = max_len - plen
            max_tokens = room if sp.max_tokens is None else min(sp.max_tokens, room)
            if max_tokens < 1:
                raise invalid(
                    f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens
                )
            if sp.min_tokens > max_tokens:  # checked by vLLM on the cut max_tokens
                raise ApiError(
                    f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                    f"got {sp.min_tokens}."
                )
            if (plen + max_tokens + cfg.block_size - 1) // cfg.block_size > cfg.num_blocks:
                # Could never fit in the KV cache, even alone.
                raise ApiError(
                    f"The request needs {plen + max_tokens} tokens of KV cache but the cache "
                    f"holds only {cfg.num_blocks * cfg.block_size}."
                )
            for j in range(sp.n):
                seed = sequence_seed(cfg.seed, seed_ids, key, j)
                plan = plan_output(seed, max_tokens, sp, cfg.mean_output_len, start)
                seqs.append(
                    Sequence(
                        ids,
                        plan.length,
                        seed,
                        lora=lora,
                        hash_seed=hash_seed,
                        finish_reason=plan.finish_reason,
                        stop_reason=plan.stop_reason,
                        text_cut=plan.text_cut,
                        remote_prefill=remote_prefill,
                        index=pi * sp.n + j,
                        priority=sp.priority,
                        word_start=start,
                    )
                )
        self.engine.submit(group)
        # vLLM counts the prompt once per prompt, not once per choice.
        return Job(group, sp, lora or self.model, sum(len(p[0]) for p in prompts), remote_decode)

    async def _stream(
        self, request: web.BaseRequest, group: Group, chat: bool, rid: str, created: int,
        model: str, sp: Any, prompt_tokens: int,
    ) -> web.StreamResponse:  # fmt: skip
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(request)
        w = ChunkWriter(chat, rid, created, model, self.fingerprint, sp.include_usage,
                        sp.continuous_usage)  # fmt: skip
        seqs = group.seqs
        sent = [0] * len(seqs)
        f = self.faults
        limit = None
        ending = b""  # what a cut stream ends with (nothing: the connection is closed)
        if (f.disconnect_after is not None or f.error_event_after is not None) and (
            f.disconnect_rate >= 1.0 or self.fault_rng.random() < f.disconnect_rate
        ):
            if f.disconnect_after is not None:
                limit = f.disconnect_after
            else:
                limit, ending = f.error_event_after, ENGINE_ERROR
        events = 0
        out: list[bytes] = []
        # Like vLLM, the role chunk goes out with the first token, not before it.
        role_pending = chat
        with_ids = sp.return_token_ids
        while True:
            if role_pending and any(s.num_output for s in seqs):
                out.extend(
                    w.role(s.index, s.prompt_len, s.token_ids[: s.prompt_len] if with_ids else None)
                    for s in seqs
                )
                role_pending = False
            done = True
            for i, seq in enumerate(seqs):
                k = sent[i]
                n = seq.num_output
                if k < n:
                    words_ = seq.out_words
                    cut = seq.text_cut
                    last = seq.target_len - 1
                    idx = seq.index
                    plen = seq.prompt_len
                    while k < n:
                        text = token_text(words_[k], k, cut)
                        ids = pids = None
                        if with_ids:
                            ids = [seq.token_ids[plen + k]]
                            if k == 0 and not chat:
                                pids = seq.token_ids[:plen]
                        k += 1
                        if k == last + 1:
                            out.append(w.last(idx, text, seq.finish_reason, seq.stop_reason,
                                              plen, k, ids, pids))  # fmt: skip
                        else:
                            out.append(w.token(idx, text, plen, k, ids, pids))
                    sent[i] = k
                if k < seq.target_len:
                    done = False
            if done:
                if sp.include_usage:
                    out.append(w.usage(prompt_tokens, sum(s.num_output for s in seqs)))
                if self.cfg.report_timing:
                    out.append(timing_comment(seqs))
                out.append(DONE)
            if out:
                if limit is not None and events + len(out) >= limit:
                    await resp.write(b"".join(out[: max(0, limit - events)]) + ending)
                    if ending:
                        await resp.write_eof()
                    elif request.transport is not None:
                        request.transport.close()
                    self.engine.abort(group)
                    group.remaining = 0
                    return resp
                events += len(out)
                await resp.write(b"".join(out) if len(out) > 1 else out[0])
                out = []
            if done:
                break
            await group.wait()
        await resp.write_eof()
        return resp

    def _pd_flags(self, body: dict) -> tuple[bool, bool]:
        """(do_remote_decode, do_remote_prefill) as this instance's role honours them."""
        role = self.cfg.role
        kv = body.get("kv_transfer_params")
        remote_decode = remote_prefill = False
        if isinstance(kv, dict):
            if kv.get("do_remote_decode") and role in ("prefill", "both"):
                remote_decode = True
            if kv.get("do_remote_prefill") and role in ("decode", "both"):
                remote_prefill = True
        if (
            role == "decode"
            and body.get("bootstrap_room") is not None
            and body.get("bootstrap_host") is not None
        ):
            remote_prefill = True
        return remote_decode, remote_prefill

    def _lora_seed(self, lora: str) -> int:
        s = self.lora_seeds.get(lora)
        if s is None:
            s = self.lora_seeds[lora] = xxh64_intdigest(lora.encode())
        return s


def timing_comment(seqs: list[Sequence]) -> bytes:
    """``--report-timing``: an SSE comment (clients skip it) with the engine's clock
    (``time.perf_counter``, the same clock across processes on Linux) at each sequence's
    arrival, the start of the first step after it (the step in progress then ended), its
    admission into the batch and its first token, and how many sequences shared its prefill
    step(s)."""
    return (
        b": llmplane-sim-timing "
        + orjson.dumps(
            [
                {
                    "arrival": s.arrival,
                    "first_step": s.first_step_at,
                    "scheduled": s.scheduled_at,
                    "first_token": s.first_token_at,
                    "batch_prefills": s.batch_prefills,
                }
                for s in seqs
            ]
        )
        + b"\n\n"
    )
