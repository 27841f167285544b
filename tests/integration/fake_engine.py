"""A minimal HTTP server used as a stand-in engine process by the local runtime's tests.

It is not an engine: it serves just enough for a supervisor to watch (``/health``, ``/metrics``)
and knobs to misbehave on purpose. The real engines are tested elsewhere.

    python fake_engine.py --port 8080 --host 0.0.0.0 [--unhealthy-for S] [--exit-after S]
        [--exit-code N] [--metrics] [--ignore-sigterm] [--spawn-child]

GET /health            200, or 503 during --unhealthy-for seconds or after /admin/health?ok=0
GET /admin/health?ok=0 make /health fail (ok=1: succeed again)
GET /hold?seconds=S    answer after S seconds (counted as a running request meanwhile)
GET /metrics           vllm:num_requests_running (only with --metrics; 404 otherwise)
GET /info              JSON: pid, argv, port, host, child pid, selected environment
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--unhealthy-for", type=float, default=0.0)
    parser.add_argument("--exit-after", type=float, default=None)
    parser.add_argument("--exit-code", type=int, default=1)
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--spawn-child", action="store_true")
    args = parser.parse_args()

    started = time.monotonic()
    state = {"healthy": True, "running": 0, "child": None}
    lock = threading.Lock()

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.spawn_child:  # like an engine's worker process: same process group, no PDEATHSIG
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        state["child"] = child.pid
    if args.exit_after is not None:
        print(f"fake engine: exiting with code {args.exit_code} (boom)", flush=True)

        def leave() -> None:
            print(f"fake engine: exit {args.exit_code} after {args.exit_after}s", flush=True)
            os._exit(args.exit_code)

        if args.exit_after <= 0:
            leave()
        threading.Timer(args.exit_after, leave).start()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *a: object) -> None:
            pass

        def reply(self, code: int, body: str, ctype: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            if url.path == "/health":
                warm = time.monotonic() - started >= args.unhealthy_for
                ok = warm and state["healthy"]
                self.reply(200 if ok else 503, "ok" if ok else "unhealthy")
            elif url.path == "/admin/health":
                state["healthy"] = query.get("ok", ["1"])[0] == "1"
                self.reply(200, "set")
            elif url.path == "/hold":
                with lock:
                    state["running"] += 1
                try:
                    time.sleep(float(query.get("seconds", ["1"])[0]))
                finally:
                    with lock:
                        state["running"] -= 1
                self.reply(200, "done")
            elif url.path == "/metrics" and args.metrics:
                self.reply(
                    200,
                    "# TYPE vllm:num_requests_running gauge\n"
                    f'vllm:num_requests_running{{model_name="fake"}} {float(state["running"])}\n',
                )
            elif url.path == "/info":
                info = {
                    "pid": os.getpid(),
                    "argv": sys.argv,
                    "port": args.port,
                    "host": args.host,
                    "child": state["child"],
                    "env": {k: v for k, v in os.environ.items() if k.startswith("FAKE_")},
                }
                self.reply(200, json.dumps(info), "application/json")
            else:
                self.reply(404, "not found")

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"fake engine: listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
