"""Response helpers and version facts the simulated server's route modules share."""

from __future__ import annotations

from aiohttp import web

from llmplane.sim.protocol import ApiError

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
