"""A fleet of simulated replicas behind ``llmplane up``: time to Ready, idle CPU, latency.

    python -m bench.fleet [--playgrounds 4] [--replicas 50] [--idle 30] [--requests 100]
                          [--gap 0.3] [--workers 1[,2]] [--write]

Declares the fleet as a user would (``--playgrounds`` sim Playgrounds of ``--replicas``
replicas each, one OpenModel each), runs ``llmplane up`` on it and measures:

- **time to Ready**: from starting ``llmplane up`` to every Playground reporting all its
  replicas ready in the store, and to the gateway routing to all of them (its
  ``llmplane_gateway_model_endpoints`` gauge);
- **idle CPU**: after a settling pause, the CPU seconds of ``llmplane up`` (gateway and
  control plane) and of every replica, per second of wall time over ``--idle`` seconds
  (from /proc, including each process's descendants);
- **one request's latency**: ``--requests`` chat completions (keep-alive, one output token)
  through the gateway, one at a time and ``--gap`` seconds apart, so that each meets the idle
  fleet (back to back, they would keep every replica of the model busy); median and p90.
  With several gateway workers the client keeps one connection to each worker (it opens
  connections until every worker has accepted one) and the requests take them in turn, as
  many clients' requests would spread;
- **new upstream connections per request**, per worker: the TCP connections to the replicas
  each gateway worker holds (from /proc) before and after each request; a request that found
  no warm connection to the replica it was routed to opens one.

Then a 1-replica fleet (one Playground of one replica) is started beside the idle big one and
measured the same way, and the latency requests go to the two in turn, so that the shared
machine's load hits both alike (the 1-replica figures include the idle big fleet's CPU use on
the same cores). The load average is recorded for each idle window. ``--workers 1,2`` repeats
all of it with ``llmplane up --workers 1`` then ``--workers 2`` in the one run (a row each).
``--write`` puts the table in docs/benchmarks.md (section ``fleet``, or ``--section``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    _children,
    cpu_seconds,
    machine,
    machine_line,
    percentile,
    table,
    write_section,
)
from llmplane.store.paths import open_store
from llmplane.testing import process
from llmplane.testing.fleets import sim_fleet
from llmplane.testing.sockets import established, upstream


def fleet_yaml(playgrounds: int, replicas: int) -> str:
    """``playgrounds`` sim Playgrounds of ``replicas`` replicas, each with its OpenModel."""
    return "---".join(sim_fleet(f"sim-{i}", replicas) for i in range(playgrounds))


def ready_replicas(state: Path, playgrounds: int) -> int:
    with open_store(state) as store:
        objs = [store.get("Playground", f"sim-{i}", "default") or {} for i in range(playgrounds)]
    return sum(int((o.get("status") or {}).get("readyReplicas") or 0) for o in objs)


def engine_pids(state: Path) -> list[int]:
    try:
        data = json.loads((state / "runtime" / "processes.json").read_text())
    except (OSError, ValueError):
        return []
    return [r["pid"] for r in data.get("processes", [])]


def gateway_endpoints(conn: http.client.HTTPConnection) -> int:
    """Ready endpoints the gateway routes to (its own /metrics)."""
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    return int(
        sum(
            float(m.group(1))
            for m in re.finditer(r"^llmplane_gateway_model_endpoints\{[^}]*\} (\S+)$", text, re.M)
        )
    )


def gateway_workers(up_pid: int, engines: set[int]) -> list[int]:
    """``up`` (worker 0) and, with ``--workers N``, workers 1 .. N-1: the children of its one
    child that is not an engine (the workers' supervisor)."""
    kids = _children()
    workers = [up_pid]
    for child in kids.get(up_pid, []):
        if child not in engines:
            workers += sorted(kids.get(child, []))
    return workers


def one_request(conn: http.client.HTTPConnection, model: str) -> float:
    """Milliseconds for one chat completion of one token."""
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    )
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    elapsed = (time.perf_counter() - t0) * 1000
    assert resp.status == 200, (resp.status, data[:300])
    return elapsed


class Fleet:
    """``llmplane up`` over ``playgrounds`` x ``replicas`` sims, with its timings."""

    def __init__(self, work: Path, playgrounds: int, replicas: int, workers: int = 1) -> None:
        self.playgrounds, self.total = playgrounds, playgrounds * replicas
        self.state = work / f"fleet-{self.total}"
        files = work / f"fleet-{self.total}.yaml"
        files.write_text(fleet_yaml(playgrounds, replicas))
        self.up = process.Up(self.state, str(files), args=["--workers", str(workers)])
        self.conn: http.client.HTTPConnection | None = None
        self.workers = workers
        self.conns: dict[int, http.client.HTTPConnection] = {}  # worker pid -> client conn
        self.new_connections: dict[int, list[int]] = {}  # worker pid -> per request
        self.latencies: dict[int, list[float]] = {}  # worker pid -> ms per request
        self.result: dict[str, Any] = {
            "replicas": self.total,
            "playgrounds": playgrounds,
            "workers": workers,
        }

    def start(self) -> None:
        """Start, and wait until every replica is Ready in the store and routed."""
        t0 = time.monotonic()
        self.up.start(timeout=600)
        deadline = t0 + 600
        while ready_replicas(self.state, self.playgrounds) < self.total:
            assert time.monotonic() < deadline, "fleet never Ready"
            time.sleep(0.2)
        self.result["ready_store_s"] = time.monotonic() - t0
        self.conn = http.client.HTTPConnection(self.up.host, self.up.port, timeout=30)
        while gateway_endpoints(self.conn) < self.total:
            assert time.monotonic() < deadline, "gateway never saw every replica"
            time.sleep(0.2)
        self.result["ready_gateway_s"] = time.monotonic() - t0

    def connect_workers(self) -> None:
        """One keep-alive client connection accepted by each gateway worker."""
        pids = gateway_workers(self.up.pid, set(engine_pids(self.state)))
        assert len(pids) == self.workers, f"gateway workers {pids}, not {self.workers}"
        deadline = time.monotonic() + 60
        spare = []
        while len(self.conns) < self.workers:
            assert time.monotonic() < deadline, "a gateway worker never accepted a connection"
            conn = http.client.HTTPConnection(self.up.host, self.up.port, timeout=30)
            conn.request("GET", "/health")
            conn.getresponse().read()
            mine = conn.sock.getsockname()[1]
            owner = [
                pid
                for pid, socks in established(pids).items()
                if any(remote == mine for _, remote in socks.values())
            ]
            if owner and owner[0] not in self.conns:
                self.conns[owner[0]] = conn
                self.new_connections[owner[0]] = []
            else:
                spare.append(conn)
        for conn in spare:
            conn.close()
        self.conns = {pid: self.conns[pid] for pid in pids}  # worker 0 first
        self.new_connections = {pid: [] for pid in pids}
        self.latencies = {pid: [] for pid in pids}

    def request(self, i: int, model: str) -> float:
        """Request ``i`` on the next worker's connection; counts its new upstream connections."""
        pid = list(self.conns)[i % len(self.conns)]
        before = upstream(established([pid])[pid], self.up.port)
        ms = one_request(self.conns[pid], model)
        after = upstream(established([pid])[pid], self.up.port)
        self.new_connections[pid].append(len(after - before))
        self.latencies[pid].append(ms)
        return ms

    def measure_idle(self, seconds: float) -> None:
        """CPU of ``up`` (gateway + control plane) and of the replicas over ``seconds``."""
        engines = engine_pids(self.state)
        assert len(engines) == self.total, f"{len(engines)} engines recorded, not {self.total}"

        def cpu_now() -> tuple[float, float]:
            # The engines are children of ``up``: cpu_seconds(up) counts them too.
            return cpu_seconds(self.up.pid), sum(cpu_seconds(p) for p in engines)

        (all0, eng0), w0 = cpu_now(), time.monotonic()
        self.result["load_idle_start"] = list(os.getloadavg())
        time.sleep(seconds)
        (all1, eng1), wall = cpu_now(), time.monotonic() - w0
        self.result["idle_cpu_cores"] = (all1 - all0) / wall
        self.result["idle_cpu_replicas"] = (eng1 - eng0) / wall
        self.result["idle_cpu_up"] = (
            self.result["idle_cpu_cores"] - self.result["idle_cpu_replicas"]
        )

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
        for conn in self.conns.values():
            conn.close()
        self.up.kill_everything()


def run(
    work: Path,
    playgrounds: int,
    replicas: int,
    idle: float,
    requests: int,
    gap: float,
    workers: int = 1,
) -> list[dict[str, Any]]:
    """The big fleet alone for Ready and idle CPU; then a 1-replica fleet beside it for the
    same, and requests sent to the two in turn (the shared machine's load hits both alike)."""
    (work / "one").mkdir()
    big = Fleet(work, playgrounds, replicas, workers)
    small = Fleet(work / "one", 1, 1, workers)
    try:
        big.start()
        time.sleep(max(10.0, idle / 3))  # start-up work settles; scrapes back off
        big.measure_idle(idle)
        small.start()
        time.sleep(5.0)
        small.measure_idle(min(idle, 10.0))
        for f in (big, small):
            f.connect_workers()
        lat: dict[int, list[float]] = {big.total: [], small.total: []}
        for i in range(requests):
            for f in (big, small) if i % 2 == 0 else (small, big):
                time.sleep(gap)
                lat[f.total].append(f.request(i, "sim-0"))
        for f in (big, small):
            f.result["latency_p50_ms"] = statistics.median(lat[f.total])
            f.result["latency_p90_ms"] = percentile(lat[f.total], 90)
            # Worker index (0 = up itself) -> new upstream connections per request.
            f.result["latency_p50_ms_by_worker"] = [
                statistics.median(ms) if ms else None for ms in f.latencies.values()
            ]
            f.result["new_connections"] = [
                sum(n) / len(n) if n else None for n in f.new_connections.values()
            ]
        return [big.result, small.result]
    finally:
        small.stop()
        big.stop()


def report(res: dict[str, Any]) -> str:
    a = res["args"]
    rows = [
        [
            f"{r['replicas']} ({r['playgrounds']} Playground{'s' if r['playgrounds'] > 1 else ''})",
            str(r.get("workers", 1)),
            f"{r['ready_store_s']:.1f} s",
            f"{r['ready_gateway_s']:.1f} s",
            f"{r['idle_cpu_cores']:.3f}",
            f"{r['idle_cpu_up']:.3f}",
            f"{r['idle_cpu_replicas']:.3f}",
            f"{r['latency_p50_ms']:.2f}",
            f"{r['latency_p90_ms']:.2f}",
            " / ".join(f"{x:.2f}" for x in r.get("latency_p50_ms_by_worker") or []) or "-",
            " / ".join(f"{x:.2f}" for x in r.get("new_connections") or []) or "-",
            " / ".join(f"{x:.2f}" for x in r["load_idle_start"]),
        ]
        for r in res["rows"]
    ]
    return "\n".join(
        [
            f"Command: `python -m bench.fleet --playgrounds {a['playgrounds']} --replicas "
            f"{a['replicas']} --idle {a['idle']:g} --requests {a['requests']} --gap {a['gap']:g}"
            f" --workers {a.get('workers', '1')}` "
            f"({machine_line(res['machine'], res['load_after'])}).",
            "",
            table(
                [
                    "sim replicas",
                    "`--workers`",
                    "all Ready (store)",
                    "all routed (gateway)",
                    "idle CPU, all (cores)",
                    "gateway + control plane",
                    "replicas",
                    "1 request p50 ms",
                    "p90 ms",
                    "p50 ms by worker (0 / 1 ...)",
                    "new upstream connections a request (worker 0 / 1 ...)",
                    "load avg at idle start",
                ],
                rows,
            ),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--playgrounds", type=int, default=4)
    p.add_argument("--replicas", type=int, default=50)
    p.add_argument("--idle", type=float, default=30.0)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--gap", type=float, default=0.3, help="seconds between the requests")
    p.add_argument(
        "--workers", default="1", help="llmplane up --workers; several (1,2): a run each"
    )
    p.add_argument("--write", action="store_true")
    p.add_argument("--section", default="fleet", help="the docs/benchmarks.md section --write sets")
    args = p.parse_args(argv)
    info = machine()
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            rows += run(
                Path(tmp),
                args.playgrounds,
                args.replicas,
                args.idle,
                args.requests,
                args.gap,
                workers,
            )
    for r in rows:
        print(json.dumps(r), flush=True)
    res = {"args": vars(args), "machine": info, "load_after": list(os.getloadavg()), "rows": rows}
    text = report(res)
    print(text)
    if args.write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{args.section}.json").write_text(json.dumps(res, indent=1))
        print(f"wrote {write_section(args.section, text)}")


if __name__ == "__main__":
    main()
