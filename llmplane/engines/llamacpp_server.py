"""Run llama.cpp with llama-server's command line, whichever llama.cpp is installed.

The llamacpp BackendRuntime speaks ``llama-server`` flags (as llmaz does). When the native
``llama-server`` binary is on PATH it is executed as is. Otherwise llama-cpp-python's server
runs with the same settings, plus what the native server offers and the Python one lacks:
``GET /health`` (503 until the model is loaded) and ``/metrics`` with llama.cpp's metric names
(``llamacpp:requests_processing``: requests in the server, queued or running; the Python
server runs one at a time) so the gateway can route on load.

Before it listens (so before a readiness probe can pass) the Python server is warmed up: one
chat completion of one token runs through the loaded model. A fresh llama-cpp-python process
pays for its first inference (the memory-mapped weights paged in, the chat template compiled,
the compute buffers set up) on whichever request comes first - after a scale from zero that is a
user's request, held by the gateway. ``--no-warmup`` skips it (the native server has its own
``--no-warmup`` and warms up by default).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    """The llama-server flags the shim understands (others are accepted and ignored)."""
    p = argparse.ArgumentParser(prog="llamacpp_server", description=__doc__)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-a", "--alias")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-c", "--ctx-size", type=int, default=2048)
    p.add_argument("-t", "--threads", type=int)
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=0)
    p.add_argument("-b", "--batch-size", type=int, default=512)
    p.add_argument("-md", "--model-draft")
    p.add_argument("--draft-max", "--draft", type=int, default=16)
    p.add_argument("--draft-min", type=int, default=5)
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--seed", type=int)
    p.add_argument("--no-warmup", action="store_true")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_known_args(argv)[0]


def build_app(args: argparse.Namespace) -> Any:
    """llama-cpp-python's FastAPI app with /health and llama.cpp-style /metrics added."""
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    model: dict[str, Any] = {
        "model": args.model,
        "model_alias": args.alias or args.model,
        "n_ctx": args.ctx_size,
        "n_gpu_layers": args.n_gpu_layers,
        "n_batch": args.batch_size,
        "verbose": False,
    }
    if args.threads:
        model["n_threads"] = args.threads
    if args.seed is not None:
        model["seed"] = args.seed
    if args.model_draft:
        # llama-cpp-python drafts with prompt lookup; a separate draft model is not supported.
        print(
            "llamacpp_server: -md is ignored by llama-cpp-python; using prompt-lookup drafting",
            file=sys.stderr,
        )
        model["draft_model"] = "prompt-lookup-decoding"
        model["draft_model_num_pred_tokens"] = args.draft_max
    # interrupt_requests off: llama-cpp-python's default ends the stream in progress (with
    # [DONE], as if it had finished) whenever another request takes the model lock -- a second
    # client, or the gateway reading /v1/models. A served engine queues requests instead.
    app = create_app(
        server_settings=ServerSettings(host=args.host, port=args.port, interrupt_requests=False),
        model_settings=[ModelSettings(**model)],
    )
    state = {"processing": 0, "requests": 0}
    served = {
        "object": "list",
        "data": [{"id": model["model_alias"], "object": "model", "owned_by": "llama.cpp"}],
    }

    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse

    @app.middleware("http")
    async def count(request: Request, call_next: Any) -> Any:
        if not request.url.path.startswith("/v1/"):
            return await call_next(request)
        if request.url.path == "/v1/models" and request.method == "GET":
            # Answered here: llama-cpp-python's own /v1/models waits for the model lock, so a
            # model list asked for during a long generation would wait for it to finish.
            return JSONResponse(served)
        state["processing"] += 1
        state["requests"] += 1
        try:
            return await call_next(request)
        finally:
            state["processing"] -= 1

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        lines = [
            "# HELP llamacpp:requests_processing Number of requests processing.",
            "# TYPE llamacpp:requests_processing gauge",
            f"llamacpp:requests_processing {state['processing']}",
            "# HELP llamacpp:requests_total Requests received.",
            "# TYPE llamacpp:requests_total counter",
            f"llamacpp:requests_total {state['requests']}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n")

    return app


def warm_up() -> float:
    """One token of chat completion through the loaded model (see the module docstring);
    returns the seconds it took (printed on stderr, in the replica's log)."""
    import time

    from llama_cpp.server import app as server_app

    llama = server_app._llama_proxy(None)  # type: ignore[misc]  # the model create_app loaded
    start = time.monotonic()
    llama.create_chat_completion(
        messages=[{"role": "user", "content": "Hello"}], max_tokens=1, temperature=0
    )
    llama.reset()  # the next request starts from an empty context, as without the warm-up
    seconds = time.monotonic() - start
    print(f"llamacpp_server: warmed up in {seconds:.2f} s", file=sys.stderr, flush=True)
    return seconds


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    native = shutil.which("llama-server")
    if native and not os.environ.get("LLMPLANE_LLAMACPP_PYTHON"):
        os.execv(native, [native, *argv])
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("llama_cpp", "uvicorn")):
        # 127, the shell's "command not found": the runtime reports EngineNotInstalled.
        print("llama.cpp is not installed: pip install 'llama-cpp-python[server]'", file=sys.stderr)
        return 127
    import uvicorn

    args = parse_args(argv)
    app = build_app(args)
    if not args.no_warmup:
        warm_up()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
