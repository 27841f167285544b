"""Before/after for the gateway's hot path: two builds, one upstream, alternating wrk cells.

    python -m bench.gateway_ab --baseline HEAD~1 [--rounds 8] [--duration 3] [--concurrency 8]
                               [--stream-tokens 64] [--no-stream] [--upstream-max-running 1024]
                               [--access-log] [--workers N|auto] [--nginx]
                               [--new-connections]

The baseline is a git ref checked out into a temporary worktree (or ``--baseline-tree``, a
checkout as it is); the candidate is this working tree. Both run as ``python -m llmplane.gateway.cli`` (uvloop, default profile, access log
off unless ``--access-log``) in front of the same ``llmplane/testing/upstream.py --delay 0``. Each round gives each build
one wrk cell per mode, in alternating order, so drifts in the machine's load hit both alike.
Reported: medians over rounds of req/s, gateway CPU per request (utime + stime from
/proc/<pid>/stat around the cell), wrk's p50/p99 and the share of requests held in flow control
(``llmplane_gateway_flow_wait_seconds_count`` around the cell). Nothing is written: paste the figures
into docs/benchmarks.md with the change they measure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import orjson

from bench.common import (
    checkout,
    cpu_seconds,
    gateway_proc,
    machine,
    machine_line,
    remove_checkout,
    store_objects,
    table,
    upstream_proc,
    wrk,
)
from bench.nginx_upstream import nginx_proc
from bench.workers import flow_waits
from llmplane.testing import Process

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", help="git ref of the build to compare against")
    p.add_argument(
        "--baseline-tree",
        type=Path,
        help="instead of --baseline: a checkout, run as it is",
    )
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--stream-tokens", type=int, default=64)
    p.add_argument("--no-stream", action="store_true")
    p.add_argument(
        "--upstream-max-running",
        type=int,
        default=1024,
        help="the upstream's running slots: KV use = running / this. At the default it is "
        "never saturated (the hot path as such); at --concurrency or below every request "
        "finds it saturated (flow control's queueing path)",
    )
    p.add_argument(
        "--access-log", action="store_true", help="both with the access log on (the default)"
    )
    p.add_argument(
        "--workers", default="1", help="each gateway's --workers (a number or auto; default 1)"
    )
    p.add_argument(
        "--nginx",
        action="store_true",
        help="also a non-streaming mode against nginx answering a fixed completion (an "
        "upstream that is never the bottleneck, bench/nginx_upstream.py)",
    )
    p.add_argument(
        "--new-connections",
        action="store_true",
        help="a new client connection per request (wrk sends Connection: close)",
    )
    args = p.parse_args(argv)
    if (args.baseline is None) == (args.baseline_tree is None):
        p.error("give one of --baseline REF or --baseline-tree PATH")

    from llmplane.gateway.discovery.store_endpoints import endpoint_object

    info = machine()
    work = Path(tempfile.mkdtemp(prefix="llmplane-ab-"))
    if args.baseline_tree is not None:
        base_tree = args.baseline_tree
    else:
        base_tree = checkout(args.baseline, work / "baseline")
    procs: list[Process] = []
    cleanup: list[Path] = []
    try:
        up = upstream_proc("--max-running", str(args.upstream_max_running))
        procs.append(up)
        address = up.ready()
        state = str(work / "state")
        objects = [endpoint_object("bench", address, "bench", engine="vllm")]
        if args.nginx:
            nginx, nginx_address, nginx_prefix = nginx_proc()
            procs.append(nginx)
            cleanup.append(nginx_prefix)
            objects.append(endpoint_object("nginx", nginx_address, "nginx"))
        store_objects(state, *objects)
        builds = {"baseline": base_tree, "candidate": ROOT}
        gws = {
            name: gateway_proc(
                state, name=name, tree=tree, access_log=args.access_log, workers=args.workers
            )
            for name, tree in builds.items()
        }
        procs += gws.values()
        urls = {name: f"http://{gw.ready()}/v1/completions" for name, gw in gws.items()}
        bodies = {
            "unary": orjson.dumps({"model": "bench", "prompt": "Say hello.", "max_tokens": 16})
        }
        if args.nginx:
            bodies["nginx"] = orjson.dumps(
                {"model": "nginx", "prompt": "Say hello.", "max_tokens": 16}
            )
        if not args.no_stream:
            bodies["stream"] = orjson.dumps(
                {
                    "model": "bench",
                    "prompt": "Say hello.",
                    "max_tokens": args.stream_tokens,
                    "stream": True,
                }
            )
        for name, url in urls.items():  # warm up: connections, caches, the prefix index
            gws[name].wait_http(url, bodies["unary"])
            wrk(url, bodies["unary"], args.concurrency, 1)
        headers = {"Connection": "close"} if args.new_connections else None
        cells: dict[tuple[str, str], list[dict[str, float]]] = {}
        for r in range(args.rounds):
            order = list(builds) if r % 2 == 0 else list(reversed(builds))
            for mode, body in bodies.items():
                for name in order:
                    before = cpu_seconds(gws[name].pid)
                    held = flow_waits(urls[name])
                    out = wrk(urls[name], body, args.concurrency, args.duration, headers=headers)
                    cpu = cpu_seconds(gws[name].pid) - before
                    out["cpu_us"] = cpu / max(1, out["requests"]) * 1e6
                    out["held"] = (flow_waits(urls[name]) - held) / max(1, out["requests"])
                    cells.setdefault((mode, name), []).append(out)
            print(f"round {r + 1}/{args.rounds} done", flush=True)
        rows = []
        for (mode, name), outs in cells.items():

            def med(key: str, outs: list[dict[str, float]] = outs) -> float:
                return statistics.median(o[key] for o in outs)

            rows.append(
                [
                    mode,
                    name,
                    f"{med('rps'):,.0f}",
                    f"{med('cpu_us'):.0f}",
                    f"{med('p50'):.2f}",
                    f"{med('p99'):.2f}",
                    f"{med('held') * 100:.1f}",
                    sum(o["errors"] for o in outs),
                ]
            )
        print()
        print(
            f"`python -m bench.gateway_ab --baseline {args.baseline or args.baseline_tree} "
            f"--rounds {args.rounds} "
            f"--duration {args.duration:g} --concurrency {args.concurrency} "
            f"--workers {args.workers}{' --nginx' if args.nginx else ''}"
            f"{' --new-connections' if args.new_connections else ''}` "
            f"({machine_line(info, list(os.getloadavg()))}); medians over rounds"
        )
        print()
        print(
            table(
                [
                    *("mode", "build", "req/s", "gateway CPU us / req", "p50 ms", "p99 ms"),
                    *("held in flow control %", "errors"),
                ],
                rows,
                "llrrrrrr",
            )
        )
    finally:
        for proc in reversed(procs):
            proc.stop()
        if args.baseline_tree is None:
            remove_checkout(base_tree)
        shutil.rmtree(work, ignore_errors=True)
        for path in cleanup:
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
