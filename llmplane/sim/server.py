"""HTTP surface of the simulated server (aiohttp): vLLM's OpenAI routes plus /admin/faults."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import time
import uuid
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from xxhash import xxh32_intdigest, xxh64_intdigest

from llmplane.sim.config import SimConfig
from llmplane.sim.engine import Engine, Group
from llmplane.sim.protocol import (
    DONE,
    ApiError,
    ChunkWriter,
    chat_choice,
    chat_response,
    completion_choice,
    completion_response,
    error_body,
    invalid,
    parse_sampling,
    plan_output,
    request_validation,
    seq_text,
    token_text,
    validation_errors,
)
from llmplane.sim.scheduler import Sequence
from llmplane.sim.tokenizer import render_chat, sequence_seed, tokenize

log = logging.getLogger("llmplane.sim")

JSON = "application/json"
# vLLM sends no Cache-Control on its streams.
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}
# The vLLM release whose wire format the sim follows (checked by bench/crosscheck_vllm.py).
VLLM_VERSION = "0.32.0"
VERSION = f"{VLLM_VERSION}+llmplane.sim"


def json_response(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type=JSON)


def error_response(err: ApiError) -> web.Response:
    return web.Response(body=err.body(), status=err.code, content_type=JSON)


class SimServer:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.engine = Engine(cfg)
        self.model = cfg.model_name
        self.base_names = set(cfg.served_model_names or [cfg.model])
        self.loras: dict[str, str] = dict(cfg.lora_modules)
        self.lora_seeds: dict[str, int] = {}
        self.faults = cfg.faults
        self.fault_rng = random.Random(cfg.seed)
        self.started = time.monotonic()
        self.unhealthy_until = self.started + self.faults.slow_start
        self.num_requests = 0
        self.created = int(time.time())
        self.engine_id = cfg.engine_id or str(
            uuid.UUID(int=random.Random(cfg.seed).getrandbits(128))
        )
        self._rid = 0
        self._rid_prefix = os.urandom(4).hex()
        self.port = cfg.port
        # vLLM's is "vllm-<version>-<8 hex digits of a config hash>".
        config_hash = xxh32_intdigest(f"{cfg.model}|{cfg.max_model_len}|{cfg.block_size}".encode())
        self.fingerprint = f"vllm-{VERSION}-{config_hash:08x}"
        self._hang: list[asyncio.Future] = []
        self.routes = self._route_table()

    # -- app -----------------------------------------------------------------------------
    def _route_table(self) -> dict[str, dict[str, Any]]:
        return {
            "/v1/chat/completions": {"POST": self.chat},
            "/v1/completions": {"POST": self.completions},
            "/v1/models": {"GET": self.models},
            "/health": {"GET": self.health},
            "/metrics": {"GET": self.metrics},
            "/version": {"GET": self.version},
            "/tokenize": {"POST": self.tokenize},
            "/v1/load_lora_adapter": {"POST": self.load_lora},
            "/v1/unload_lora_adapter": {"POST": self.unload_lora},
            "/admin/faults": {"GET": self.get_faults, "POST": self.set_faults},
        }

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """The one request handler (aiohttp's low-level server: a dict lookup routes)."""
        methods = self.routes.get(request.path)
        if methods is None:
            return web.Response(body=b'{"detail":"Not Found"}', status=404, content_type=JSON)
        handler = methods.get(request.method)
        if handler is None:
            return web.Response(
                body=b'{"detail":"Method Not Allowed"}', status=405, content_type=JSON
            )
        return await handler(request)

    def start(self) -> None:
        self.engine.start()

    def cancel_hanging(self) -> None:
        for f in self._hang:
            if not f.done():
                f.cancel()

    async def close(self) -> None:
        await self.engine.stop()

    # -- helpers -------------------------------------------------------------------------
    def _next_id(self, prefix: str) -> str:
        self._rid += 1
        return f"{prefix}{self._rid_prefix}{self._rid:012x}"

    def _resolve_model(self, name: Any) -> str | None:
        """Returns the LoRA adapter name, None for the base model; raises 404 if unknown."""
        if name is None or name in self.base_names:
            return None
        if isinstance(name, str) and name in self.loras:
            return name
        served = ", ".join(self.cfg.served_model_names or [self.cfg.model])
        raise ApiError(
            f"The model `{name}` does not exist. Valid aliases: {served}.", 404, "NotFoundError",
            "model",
        )  # fmt: skip

    async def _json(self, request: web.BaseRequest) -> dict:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            # Worded as vLLM's (pydantic's) json_invalid error, with the stdlib's reason
            # and position.
            msg, pos = "Invalid JSON", 0
            try:
                json.loads(raw)
            except ValueError as e:
                msg, pos = getattr(e, "msg", str(e)), getattr(e, "pos", 0)
            raise request_validation(
                "json_invalid", f"body.{pos}", "JSON decode error", "<dict of 0 items>",
                {"error": msg},
            ) from None  # fmt: skip
        if not isinstance(body, dict):
            raise request_validation(
                "model_attributes_type", "body", "Input should be a valid dictionary or object "
                "to extract fields from", body,
            )  # fmt: skip
        return body

    async def _faults_before(self) -> web.Response | None:
        f = self.faults
        if time.monotonic() < self.unhealthy_until:
            return web.Response(
                body=error_body("The model is still loading.", 503), status=503, content_type=JSON
            )
        self.num_requests += 1
        if f.crash_after is not None and self.num_requests > f.crash_after:
            sys.stderr.write(f"llmplane sim: injected crash after {f.crash_after} requests\n")
            sys.stderr.flush()
            os._exit(1)
        if f.hang_rate > 0 and self.fault_rng.random() < f.hang_rate:
            fut = asyncio.get_running_loop().create_future()
            self._hang.append(fut)
            try:
                await fut
            finally:
                self._hang.remove(fut)
        if f.error_rate > 0 and self.fault_rng.random() < f.error_rate:
            code = f.error_codes[self.fault_rng.randrange(len(f.error_codes))]
            return web.Response(
                body=error_body(f"Injected error {code}.", code), status=code, content_type=JSON
            )
        return None

    # -- inference -----------------------------------------------------------------------
    async def chat(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    def _prompts(self, body: dict, chat: bool) -> list[list[int]]:
        prompts = self._raw_prompts(body, chat)
        return prompts

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
            text = render_chat(messages, bool(body.get("add_generation_prompt", True)))
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
            body = await self._json(request)
            lora = self._resolve_model(body.get("model"))
            sp = parse_sampling(body, chat)
            prompts = self._prompts(body, chat)
            remote_decode, remote_prefill = self._pd_flags(body)
        except ApiError as e:
            return error_response(e)

        cfg = self.cfg
        max_len = cfg.max_model_len
        group = Group(sp.stream, sp.n, sp.max_tokens)
        hash_seed = self._lora_seed(lora) if lora else 0
        key = f"{lora}|{sp.params_key}"
        seqs = group.seqs
        if sp.max_tokens is not None and sp.max_tokens > max_len:
            p = sp.max_tokens_param
            return error_response(
                invalid(
                    f"{p}={sp.max_tokens} cannot be greater than max_model_len={max_len}. "
                    "Please request fewer output tokens.", p, sp.max_tokens,
                )
            )  # fmt: skip
        for pi, ids in enumerate(prompts):
            plen = len(ids)
            if plen == 0:
                return error_response(
                    invalid(
                        "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"
                    )
                )
            if plen > max_len:
                # vLLM tokenizes at most max_len + 1 tokens, hence "at least".
                count = min(plen, max_len + 1)
                least = "at least " if count == max_len + 1 else ""
                return error_response(
                    invalid(
                        f"This model's maximum context length is {max_len} tokens. However, "
                        f"your prompt contains {least}{count} input tokens, which exceeds this "
                        "limit even without any output tokens. Please reduce the length of "
                        "the input prompt.", "input_tokens", count,
                    )
                )  # fmt: skip
            # As vLLM: max_tokens is cut to what the context has room for, not refused.
            room = max_len - plen
            max_tokens = room if sp.max_tokens is None else min(sp.max_tokens, room)
            if max_tokens < 1:
                return error_response(
                    invalid(
                        f"max_tokens must be at least 1, got {max_tokens}.",
                        "max_tokens",
                        max_tokens,
                    )
                )
            if sp.min_tokens > max_tokens:  # checked by vLLM on the cut max_tokens
                return error_response(
                    ApiError(
                        f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                        f"got {sp.min_tokens}."
                    )
                )
            if (plen + max_tokens + cfg.block_size - 1) // cfg.block_size > cfg.num_blocks:
                # Could never fit in the KV cache, even alone.
                return error_response(
                    ApiError(
                        f"The request needs {plen + max_tokens} tokens of KV cache but the cache "
                        f"holds only {cfg.num_blocks * cfg.block_size}."
                    )
                )
            for j in range(sp.n):
                seed = sequence_seed(cfg.seed, ids, key, j)
                plan = plan_output(seed, max_tokens, sp, cfg.mean_output_len)
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
                    )
                )
        # vLLM counts the prompt once per prompt, not once per choice.
        prompt_tokens = sum(len(p) for p in prompts)
        model = lora or self.model
        rid = self._next_id("chatcmpl-" if chat else "cmpl-")
        created = int(time.time())
        engine = self.engine
        engine.submit(group)
        try:
            if sp.stream:
                return await self._stream(request, group, chat, rid, created, model, sp,
                                          prompt_tokens)  # fmt: skip
            while group.remaining > 0:
                await group.wait()
        finally:
            if group.remaining > 0:
                engine.abort(group)
        completion_tokens = 0
        choices = []
        make = chat_choice if chat else completion_choice
        for seq in seqs:
            completion_tokens += seq.num_output
            choices.append(
                make(
                    seq.index,
                    seq_text(seq.out_words, seq.text_cut),
                    seq.finish_reason,
                    seq.stop_reason,
                )
            )
        kv_params = None
        if remote_decode:
            kv_params = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": seqs[0].final_blocks,
                "remote_engine_id": self.engine_id,
                "remote_host": cfg.host,
                "remote_port": self.port,
                "tp_size": 1,
            }
        render = chat_response if chat else completion_response
        return json_response(
            render(
                rid,
                created,
                model,
                choices,
                prompt_tokens,
                completion_tokens,
                kv_params,
                self.fingerprint,
            )
        )

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
        if f.disconnect_after is not None and (
            f.disconnect_rate >= 1.0 or self.fault_rng.random() < f.disconnect_rate
        ):
            limit = f.disconnect_after
        events = 0
        out: list[bytes] = []
        # Like vLLM, the role chunk goes out with the first token, not before it.
        role_pending = chat
        while True:
            if role_pending and any(s.num_output for s in seqs):
                out.extend(w.role(s.index, s.prompt_len) for s in seqs)
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
                        k += 1
                        if k == last + 1:
                            out.append(w.last(idx, text, seq.finish_reason, seq.stop_reason,
                                              plen, k))  # fmt: skip
                        else:
                            out.append(w.token(idx, text, plen, k))
                    sent[i] = k
                if k < seq.target_len:
                    done = False
            if done:
                if sp.include_usage:
                    out.append(w.usage(prompt_tokens, sum(s.num_output for s in seqs)))
                out.append(DONE)
            if out:
                if limit is not None and events + len(out) >= limit:
                    await resp.write(b"".join(out[: max(0, limit - events)]))
                    if request.transport is not None:
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

    # -- other routes --------------------------------------------------------------------
    async def health(self, request: web.BaseRequest) -> web.Response:
        if time.monotonic() < self.unhealthy_until:
            return web.Response(status=503)
        return web.Response(status=200)

    async def version(self, request: web.BaseRequest) -> web.Response:
        return json_response(orjson.dumps({"version": VERSION}))

    async def metrics(self, request: web.BaseRequest) -> web.Response:
        return web.Response(
            body=self.engine.metrics.render(),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    def _card(self, name: str, root: str, parent: str | None, max_len: int | None) -> dict:
        return {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": max_len,
            "permission": [
                {
                    "id": f"modelperm-{xxh64_intdigest(name.encode()):016x}",
                    "object": "model_permission",
                    "created": self.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    async def models(self, request: web.BaseRequest) -> web.Response:
        cfg = self.cfg
        names = cfg.served_model_names or [cfg.model]
        data = [self._card(n, cfg.model, None, cfg.max_model_len) for n in names]
        data += [self._card(n, p, self.model, None) for n, p in self.loras.items()]
        return json_response(orjson.dumps({"object": "list", "data": data}))

    async def tokenize(self, request: web.BaseRequest) -> web.Response:
        try:
            body = await self._json(request)
            if body.get("model") is not None:
                self._resolve_model(body.get("model"))
            if "messages" in body:
                ids = self._prompts(body, chat=True)[0]
            elif isinstance(body.get("prompt"), str):
                ids = tokenize(body["prompt"], self.cfg.vocab_size)
            else:
                # The union of vLLM's two tokenize request schemas: neither matched.
                given = f"<dict of {len(body)} items>"
                raise validation_errors(
                    [
                        {"type": "missing", "loc": f"body.{f}", "msg": "Field required",
                         "input": given}
                        for f in ("prompt", "messages")
                    ]
                )  # fmt: skip
        except ApiError as e:
            return error_response(e)
        return json_response(
            orjson.dumps(
                {
                    "count": len(ids),
                    "max_model_len": self.cfg.max_model_len,
                    "tokens": ids,
                    "token_strs": None,
                }
            )
        )

    async def load_lora(self, request: web.BaseRequest) -> web.Response:
        try:
            body = await self._json(request)
        except ApiError as e:
            return error_response(e)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return error_response(
                ApiError(
                    "Both 'lora_name' and 'lora_path' must be provided.", 400, "InvalidUserInput"
                )
            )
        if name in self.base_names:
            return error_response(
                ApiError(
                    f"The lora adapter '{name}' conflicts with a served base model.",
                    400,
                    "InvalidUserInput",
                )
            )
        if name in self.loras and not body.get("load_inplace"):
            return error_response(
                ApiError(
                    f"The lora adapter '{name}' has already been loaded. If you want to load "
                    "the adapter in place, set 'load_inplace' to True.",
                    400,
                    "InvalidUserInput",
                )
            )
        self.loras[str(name)] = str(path)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(self, request: web.BaseRequest) -> web.Response:
        try:
            body = await self._json(request)
        except ApiError as e:
            return error_response(e)
        name = body.get("lora_name")
        if not name:
            return error_response(
                ApiError(
                    "'lora_name' needs to be provided to unload a LoRA adapter.",
                    400,
                    "InvalidUserInput",
                )
            )
        if name not in self.loras:
            return error_response(
                ApiError(f"The lora adapter '{name}' cannot be found.", 404, "NotFoundError")
            )
        del self.loras[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    def _faults_view(self) -> dict:
        d = self.faults.to_dict()
        d["slow_start_remaining"] = max(0.0, self.unhealthy_until - time.monotonic())
        d["requests_seen"] = self.num_requests
        return d

    async def get_faults(self, request: web.BaseRequest) -> web.Response:
        return json_response(orjson.dumps(self._faults_view()))

    async def set_faults(self, request: web.BaseRequest) -> web.Response:
        try:
            body = await self._json(request)
            self.faults.update(body)
        except ApiError as e:
            return error_response(e)
        except ValueError as e:
            return error_response(ApiError(str(e)))
        if "slow_start" in body:
            self.unhealthy_until = time.monotonic() + self.faults.slow_start
        if "crash_after" in body:
            self.num_requests = 0
        return json_response(orjson.dumps(self._faults_view()))
