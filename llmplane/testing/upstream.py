"""The stand-in upstream: a small vLLM-shaped server with exact control of delays, failures and
process behaviour, for tests and benchmarks (``llmplane.sim`` is the realistic engine).

``python -m llmplane.testing.upstream --model NAME --port 0`` prints ``LISTENING host:port``
(``upstream_process`` in ``llmplane.testing.process`` starts it). It answers chat, completions
and embeddings (echoing the requested ``model``, as vLLM does, and 404 for a model it does not
serve), streams SSE with usage, lists its base model and LoRA adapters on ``/v1/models`` and
reports vLLM's load metrics on ``/metrics`` (running = requests in progress up to
``--max-running``, the rest waiting; KV use = running / max-running).

Control while it runs:

- ``POST /admin`` ``{"delay": S, "fail_status": N, "healthy": false}`` sets the delay of each
  request, a status every inference request fails with (0: none) and what ``/health`` says;
  ``GET /admin``: requests served, in progress, the headers and body of the last one;
- ``GET /hold?seconds=S`` answers ``done`` after S seconds, counted as running meanwhile;
- ``GET /info``: pid, argv, host, port, the child's pid and the ``UPSTREAM_*`` environment.

Options: ``--delay``/``--tokens`` per request; ``--keepalive-timeout S`` closes a keep-alive
connection idle for S seconds (vLLM's uvicorn: 5 s); ``--zero-metrics`` makes the gauges say
nothing runs or waits whatever it serves, as some OpenAI-compatible servers' do (the gateway's
``registry.unseen_load``); ``--fixed`` answers every POST with one fixed completion, nothing
computed or counted, so its gauges always say 0 (the overhead benchmark's minimal upstream). As an engine process under the local
runtime's supervision: ``--unhealthy-for S`` (``/health`` 503 for S seconds), ``--exit-after S``
with ``--exit-code N``, ``--ignore-sigterm``, ``--spawn-child`` (a child in its process group,
as an engine's worker).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time

import orjson
from aiohttp import web

FIXED = orjson.dumps(
    {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 0,
        "model": "bench",
        "choices": [{"index": 0, "text": "hello", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
)


class Upstream:
    def __init__(self, args: argparse.Namespace) -> None:
        self.model = args.model
        self.loras = list(args.lora_modules or [])
        self.delay = args.delay
        self.tokens = args.tokens
        self.max_running = args.max_running
        self.zero_metrics = args.zero_metrics
        self.fail_status = 0
        self.healthy = True
        self.healthy_after = time.monotonic() + args.unhealthy_for
        self.host = args.host
        self.port = 0  # once listening
        self.child: int | None = None
        self.inflight = 0
        self.served = 0
        self.running_loras: dict[str, int] = {}
        self.last_headers: dict[str, str] = {}  # of the last inference request (GET /admin)
        self.last_body = ""  # and its body

    def names(self) -> set[str]:
        return {self.model, *self.loras}

    async def infer(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        doc = orjson.loads(body)
        model = doc.get("model")
        if self.fail_status:
            return web.json_response(
                {"error": {"message": "injected failure"}}, status=self.fail_status
            )
        if model not in self.names():
            return web.json_response(
                {
                    "error": {
                        "message": f"The model `{model}` does not exist.",
                        "type": "NotFoundError",
                        "code": 404,
                    }
                },
                status=404,
            )
        self.inflight += 1
        self.served += 1
        self.last_headers = dict(request.headers)
        self.last_body = body.decode(errors="replace")
        if model in self.loras:
            self.running_loras[model] = self.running_loras.get(model, 0) + 1
        try:
            prompt_tokens = max(1, len(body) // 4)
            n = int(doc.get("max_tokens") or self.tokens)
            if request.path.endswith("/embeddings"):
                await asyncio.sleep(self.delay)
                return web.json_response(
                    {
                        "object": "list",
                        "model": model,
                        "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}],
                        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
                    }
                )
            chat = request.path.endswith("/chat/completions")
            if doc.get("stream"):
                return await self._stream(request, doc, model, chat, n, prompt_tokens)
            await asyncio.sleep(self.delay)
            choice = (
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok " * n},
                    "finish_reason": "length",
                }
                if chat
                else {"index": 0, "text": "ok " * n, "finish_reason": "length"}
            )
            return web.Response(
                body=orjson.dumps(
                    {
                        "id": f"cmpl-{self.served}",
                        "object": "chat.completion" if chat else "text_completion",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [choice],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": n,
                            "total_tokens": prompt_tokens + n,
                        },
                    }
                ),
                content_type="application/json",
            )
        finally:
            self.inflight -= 1
            if model in self.running_loras:
                self.running_loras[model] -= 1
                if not self.running_loras[model]:
                    del self.running_loras[model]

    async def _stream(
        self, request: web.Request, doc: dict, model: str, chat: bool, n: int, prompt_tokens: int
    ) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        include_usage = bool((doc.get("stream_options") or {}).get("include_usage"))
        step = self.delay / max(1, n)
        for i in range(n):
            await asyncio.sleep(step)
            delta = {"index": 0, "delta": {"content": "ok "}, "finish_reason": None}
            if not chat:
                delta = {"index": 0, "text": "ok ", "finish_reason": None}
            chunk = {
                "id": "cmpl-s",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": 0,
                "model": model,
                "choices": [delta],
            }
            if include_usage:
                chunk["usage"] = None
            if i == n - 1:
                delta["finish_reason"] = "length"
            await out.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if include_usage:
            final = {
                "id": "cmpl-s",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": 0,
                "model": model,
                "choices": [],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": n,
                    "total_tokens": prompt_tokens + n,
                },
            }
            await out.write(b"data: " + orjson.dumps(final) + b"\n\n")
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    async def models(self, request: web.Request) -> web.Response:
        data = [
            {
                "id": self.model,
                "object": "model",
                "owned_by": "upstream",
                "root": self.model,
                "parent": None,
            }
        ]
        data += [
            {"id": a, "object": "model", "owned_by": "upstream", "root": a, "parent": self.model}
            for a in self.loras
        ]
        return web.json_response({"object": "list", "data": data})

    async def metrics(self, request: web.Request) -> web.Response:
        running = min(self.inflight, self.max_running)
        waiting = self.inflight - running
        if self.zero_metrics:
            running = waiting = 0
        labels = f'model_name="{self.model}"'
        active = ",".join(sorted(self.running_loras))
        text = (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} {float(running)}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{labels}}} {float(waiting)}\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{labels}}} {running / self.max_running}\n"
            "# TYPE vllm:lora_requests_info gauge\n"
            f'vllm:lora_requests_info{{max_lora="{max(1, len(self.loras))}",running_lora_adapters="{active}",'
            f'waiting_lora_adapters=""}} {time.time()}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def admin(self, request: web.Request) -> web.Response:
        doc = await request.json()
        if "delay" in doc:
            self.delay = float(doc["delay"])
        if "fail_status" in doc:
            self.fail_status = int(doc["fail_status"])
        if "healthy" in doc:
            self.healthy = bool(doc["healthy"])
        return web.json_response(
            {
                "delay": self.delay,
                "fail_status": self.fail_status,
                "healthy": self.healthy,
                "served": self.served,
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        ok = self.healthy and time.monotonic() >= self.healthy_after
        return web.Response(text="ok" if ok else "unhealthy", status=200 if ok else 503)

    async def hold(self, request: web.Request) -> web.Response:
        self.inflight += 1
        try:
            await asyncio.sleep(float(request.query.get("seconds", "1")))
        finally:
            self.inflight -= 1
        return web.Response(text="done")

    async def info(self, request: web.Request) -> web.Response:
        env = {k: v for k, v in os.environ.items() if k.startswith("UPSTREAM_")}
        return web.json_response(
            {
                "pid": os.getpid(),
                "argv": sys.argv,
                "host": self.host,
                "port": self.port,
                "child": self.child,
                "env": env,
            }
        )

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "served": self.served,
                "inflight": self.inflight,
                "last_headers": self.last_headers,
                "last_body": self.last_body,
            }
        )


async def fixed(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=FIXED, content_type="application/json")


async def main_async(args: argparse.Namespace) -> None:
    app = web.Application()
    upstream = Upstream(args)
    app.router.add_get("/v1/models", upstream.models)
    app.router.add_get("/metrics", upstream.metrics)
    if args.fixed:
        app.router.add_post("/{tail:.*}", fixed)
    else:
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            app.router.add_post(path, upstream.infer)
        app.router.add_post("/admin", upstream.admin)
        app.router.add_get("/admin", upstream.stats)
        app.router.add_get("/hold", upstream.hold)
        app.router.add_get("/info", upstream.info)
    app.router.add_get("/health", upstream.health)
    if args.spawn_child:  # like an engine's worker process: same process group, no PDEATHSIG
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        upstream.child = child.pid
    if args.exit_after is not None:
        print(f"upstream: exiting with code {args.exit_code} (boom)", flush=True)
        if args.exit_after <= 0:
            os._exit(args.exit_code)
        asyncio.get_running_loop().call_later(args.exit_after, os._exit, args.exit_code)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=args.keepalive_timeout)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=2048)
    await site.start()
    upstream.port = site._server.sockets[0].getsockname()[1]
    print(f"LISTENING {args.host}:{upstream.port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bench")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--lora-modules", nargs="*", default=[])
    parser.add_argument("--delay", type=float, default=0.0, help="seconds per request")
    parser.add_argument("--tokens", type=int, default=4, help="output tokens per request")
    parser.add_argument("--max-running", type=int, default=8)
    parser.add_argument(
        "--keepalive-timeout",
        type=float,
        default=75.0,
        help="seconds an idle keep-alive connection stays open (aiohttp's default: 75)",
    )
    parser.add_argument(
        "--fixed", action="store_true", help="fixed JSON for every POST, gauges at 0 (benchmark)"
    )
    parser.add_argument(
        "--zero-metrics",
        action="store_true",
        help="/metrics says 0 running and 0 waiting whatever is in progress (as "
        "bench/nginx_upstream.py's fixed page): gauges that do not show the load",
    )
    parser.add_argument(
        "--unhealthy-for", type=float, default=0.0, help="seconds /health answers 503 at first"
    )
    parser.add_argument("--exit-after", type=float, default=None, help="exit after S seconds")
    parser.add_argument("--exit-code", type=int, default=1, help="the code --exit-after exits with")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument(
        "--spawn-child", action="store_true", help="start a child process in its process group"
    )
    args = parser.parse_args()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        import uvloop

        uvloop.run(main_async(args))
    except ImportError:
        asyncio.run(main_async(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
