"""The simulated server's other routes: health, version, metrics, models, (de)tokenize, LoRA
adapters, ``/admin/faults`` and ``/admin/kv-cache`` (``SimServer`` mixes them in)."""

from __future__ import annotations

import time

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from xxhash import xxh64_intdigest

from llmplane.sim.protocol import (
    ApiError,
    request_validation,
    validation_errors,
)
from llmplane.sim.tokenizer import NUM_WORDS, WORDS, tokenize
from llmplane.sim.wire import VERSION, error_response, json_response


class ServiceRoutes:
    """Everything but inference; state is ``SimServer``'s."""

    async def health(self, request: web.BaseRequest) -> web.Response:
        if time.monotonic() < self.unhealthy_until:
            return web.Response(status=503)
        return web.Response(status=200)

    async def version(self, request: web.BaseRequest) -> web.Response:
        return json_response(orjson.dumps({"version": VERSION}))

    async def metrics(self, request: web.BaseRequest) -> web.Response:
        self.metrics_requests += 1
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
        self.models_requests += 1
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

    async def detokenize(self, request: web.BaseRequest) -> web.Response:
        """The sim's token ids are hashes of text: each id reads back as one pseudo-word."""
        try:
            body = await self._json(request)
            if body.get("model") is not None:
                self._resolve_model(body.get("model"))
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens
            ):
                raise request_validation(
                    "list_type", "body.tokens", "Input should be a valid list of integers", tokens
                )
            for t in tokens:
                if not 0 <= t < self.cfg.vocab_size:
                    raise ApiError(f"Token id {t} is out of vocabulary")
        except ApiError as e:
            return error_response(e)
        text = "".join(WORDS[t % NUM_WORDS] for t in tokens)
        return json_response(orjson.dumps({"prompt": text}))

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
        d["metrics_requests"] = self.metrics_requests  # scrapes so far (one gateway's, once)
        d["models_requests"] = self.models_requests  # /v1/models reads so far
        return d

    async def kv_cache(self, request: web.BaseRequest) -> web.Response:
        """The hashes of the blocks in the prefix cache now (what its KV events describe):
        tests compare the gateway's index with it."""
        pool = self.engine.sched.pool
        body = {"block_size": pool.block_size, "hashes": [str(h) for h in pool.cached]}
        return json_response(orjson.dumps(body))

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
