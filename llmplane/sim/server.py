"""HTTP surface of the simulated server (aiohttp): vLLM's OpenAI and Anthropic routes plus
/admin/faults."""

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
from xxhash import xxh32_intdigest

from llmplane.sim.completions import CompletionRoutes
from llmplane.sim.config import SimConfig
from llmplane.sim.engine import Engine
from llmplane.sim.messages import MessagesRoutes
from llmplane.sim.protocol import (
    ApiError,
    error_body,
    request_validation,
)
from llmplane.sim.responses import ResponsesRoutes, StoredResponses
from llmplane.sim.service_routes import ServiceRoutes
from llmplane.sim.tokenizer import WordIds
from llmplane.sim.wire import JSON, VERSION, error_response, json_response

log = logging.getLogger("llmplane.sim")

__all__ = ["VERSION", "SimServer", "error_response", "json_response"]


class SimServer(CompletionRoutes, ResponsesRoutes, MessagesRoutes, ServiceRoutes):
    """One simulated vLLM server: state, routing and lifecycle; the routes live in
    ``completions.py`` (chat, completions), ``responses.py``, ``messages.py`` and
    ``service_routes.py`` (everything else)."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.engine = Engine(cfg)
        self.word_ids = WordIds(cfg.vocab_size).id_set  # to recognise a continuation
        self.model = cfg.model_name
        self.base_names = set(cfg.served_model_names or [cfg.model])
        self.loras: dict[str, str] = dict(cfg.lora_modules)
        # Responses kept for previous_response_id (vLLM's env variable turns it on).
        self.stored_responses = StoredResponses.from_env()
        self.lora_seeds: dict[str, int] = {}
        self.faults = cfg.faults
        self.fault_rng = random.Random(cfg.seed)
        self.started = time.monotonic()
        self.unhealthy_until = self.started + self.faults.slow_start
        self.num_requests = 0
        self.metrics_requests = 0
        self.models_requests = 0  # GET /v1/models answered (gateways reading model lists)
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
            "/v1/responses": {"POST": self.responses},
            "/v1/messages": {"POST": self.messages},
            "/v1/messages/count_tokens": {"POST": self.count_tokens},
            "/tokenize": {"POST": self.tokenize},
            "/detokenize": {"POST": self.detokenize},
            "/v1/load_lora_adapter": {"POST": self.load_lora},
            "/v1/unload_lora_adapter": {"POST": self.unload_lora},
            "/admin/faults": {"GET": self.get_faults, "POST": self.set_faults},
            "/admin/kv-cache": {"GET": self.kv_cache},
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
