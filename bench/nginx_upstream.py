"""nginx as an upstream that is never the bottleneck: one worker process answering every
POST with a fixed chat completion (JSON with usage; ``/v1/completions``: a fixed 64-event SSE
stream, as one body), ``/v1/models`` and a vLLM-shaped ``/metrics`` from memory. About 100k req/s direct on one core of the benchmark machine, so a
proxy in front of it measures the proxy. Needs ``nginx`` (``apt-get install nginx-light``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import orjson

from bench.common import free_port, launch
from llmplane.testing import Process

COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).decode()
MODELS = orjson.dumps(
    {"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "bench"}]}
).decode()
# A 64-event completion stream with usage, sent as one body (``return`` gives it a
# Content-Length): a streaming upstream that is never the bottleneck (bench/workers.py).
SSE = "".join(
    "data: "
    + orjson.dumps(
        {
            "id": "cmpl-s",
            "object": "text_completion",
            "created": 0,
            "model": "bench",
            "choices": [{"index": 0, "text": "ok ", "finish_reason": None if i < 63 else "length"}],
        }
    ).decode()
    + "\n\n"
    for i in range(64)
) + (
    "data: "
    + orjson.dumps(
        {
            "id": "cmpl-s",
            "object": "text_completion",
            "created": 0,
            "model": "bench",
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 64, "total_tokens": 67},
        }
    ).decode()
    + "\n\ndata: [DONE]\n\n"
)
METRICS = (
    "# TYPE vllm:num_requests_running gauge\\n"
    'vllm:num_requests_running{model_name=\\"bench\\"} 0.0\\n'
    "# TYPE vllm:num_requests_waiting gauge\\n"
    'vllm:num_requests_waiting{model_name=\\"bench\\"} 0.0\\n'
    "# TYPE vllm:kv_cache_usage_perc gauge\\n"
    'vllm:kv_cache_usage_perc{model_name=\\"bench\\"} 0.0\\n'
)


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def config(port: int, prefix: Path) -> str:
    return f"""
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location = /metrics {{ default_type text/plain; return 200 "{METRICS}"; }}
        location = /v1/models {{ default_type application/json; return 200 {_quoted(MODELS)}; }}
        # The stream is too long for a ``return`` string: a file, which nginx serves only to
        # GET, so the POST is redirected to it (an error_page redirect turns it into a GET).
        location = /v1/completions {{ error_page 405 =200 /sse; return 405; }}
        location = /sse {{ internal; default_type text/event-stream; root {prefix}; }}
        location / {{ default_type application/json; return 200 {_quoted(COMPLETION)}; }}
    }}
}}
"""


def nginx_proc() -> tuple[Process, str, Path]:
    """A launched nginx (foreground, own session: ``stop()`` ends it), its address and its
    prefix directory (remove it after stopping)."""
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    prefix = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
    port = free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(config(port, prefix))
    (prefix / "sse").write_text(SSE)
    prefix.chmod(0o755)  # readable by nginx's worker (``nobody`` when started as root)
    proc = launch("nginx", [exe, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"])
    return proc, f"127.0.0.1:{port}", prefix
