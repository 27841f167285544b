"""What a careless operator or a hostile client costs llmplane: issue 27 items 1, 2, 5 and 6.

    python -m bench.hostile [--tree PATH] [--baseline-tree PATH] [--write] [--report PATH]

Each item starts the real processes of a checkout (``--tree``, default this one; the
processes run with ``PYTHONPATH`` and working directory at it) and measures from outside, on
loopback, bounded in time and count; with ``--baseline-tree`` the same items run first against
that checkout (the "before": a commit without the fixes) and the table has both columns.

1. Idle connections: ``llmplane up`` with 2 sim replicas (the built-in sim BackendRuntime
   with a liveness probe every second, failing after 2, so a probe that ``up``'s own EMFILE
   fails shows within the window) under ``prlimit --nofile=1024:1024``; 1,100 keep-alive
   connections each answered one ``/health`` and left idle. Over 15 s: ``up``'s descriptors
   (/proc/<pid>/fd), ``/health`` answer time on a new connection, engine restarts (new pids)
   and the Playground's Ready count. Why: client connections must not starve the control
   plane (llmplane/fdlimit.py).
2. A large scale-up: a running ``up`` with 1 sim replica gets ``replicas: 120`` from
   ``llmplane apply`` (``LLMPLANE_MAX_REPLICAS=200`` so a tree with a ceiling accepts it),
   SIGTERM 5 s later: ``/health``'s longest answer during the scale-up, SIGTERM to exit, and
   the processes left behind. Why: the controller must not stall the gateway or shutdown
   (llmplane/runtime/capacity.py).
3. Closed connections' bodies (item 5): a ``llmplane gateway`` (1 worker) in front of a sim;
   three rounds of 12 connections each sending 10 MiB of a 15 MiB body, then closing: the
   gateway's RSS before, while the bodies are held, and 5 s after they closed. Why: memory must
   return when a connection ends, and bodies held at once are bounded (gateway/http_server.py).
4. Unread streams (item 6): the same gateway, 4 raw sockets each asking for a stream of
   100,000 tokens and never reading: RSS growth over 8 s. Why: a slow client must hold back
   the engine, not fill the gateway (gateway/upstream_client.py).

Every process started is stopped, also on failure: those of ``up`` carry a marker in their
environment and are swept by it. ``--write`` puts the section ``hostile`` in ``--report``
(default docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from bench.common import (
    REPORT,
    ROOT,
    gateway_proc,
    machine,
    machine_line,
    store_objects,
    table,
    write_section,
)
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.store.paths import open_store
from llmplane.testing import Process, Processes, Up, sim_process, wait_for
from llmplane.testing.fleets import sim_fleet
from llmplane.testing.process import carrying

MODEL = "tiny"
MIB = 1024 * 1024
HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
HEALTH_TIMEOUT = 5.0  # seconds one /health probe may take before it counts as unanswered
MARKER = "LLMPLANE_BENCH_MARKER"

Figures = dict[str, str]  # metric -> cell text


# -- the processes of one tree ------------------------------------------------------------------


def tree_env(tree: Path, **extra: str) -> dict[str, str]:
    """The environment a process of ``tree`` runs with (all of ours, its code first)."""
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1", **extra}


def describe(tree: Path) -> str:
    """``<commit>`` of ``tree``, and whether it runs compiled modules (llmplane/_native)."""
    commit = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    native = tree / "llmplane" / "_native"
    compiled = native.is_dir() and any(native.glob("*.so"))
    return f"{commit or tree.name}{' (compiled)' if compiled else ''}"


def marked(marker: str) -> list[int]:
    """Live processes whose environment carries ``marker`` (``up`` and the engines it forked,
    which run in sessions of their own)."""
    return carrying(MARKER, marker)


def sweep(marker: str) -> None:
    """SIGKILL every process that carries ``marker``."""
    for pid in marked(marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def up_of(
    tree: Path, work: Path, fleet: str, prefix: tuple[str, ...] = (), **env: str
) -> Iterator[tuple[Up, str]]:
    """A started ``llmplane up`` of ``tree`` over ``fleet`` (YAML), its command after
    ``prefix`` (``prlimit ...``); ``(up, marker)``; on leaving, ``up`` and everything it
    started are gone."""
    marker = uuid.uuid4().hex
    path = work / "fleet.yaml"
    path.write_text(fleet)
    command = [*prefix, sys.executable, "-m", "llmplane.cli"]
    process = Up(
        work / "state",
        str(path),
        command=command,
        env=tree_env(tree, **{MARKER: marker}, **env),
        cwd=tree,
        grace=10.0,
    )
    try:
        with Processes() as group:
            group.start(process, timeout=120)
            yield process, marker
    finally:
        sweep(marker)


def ready_replicas(state: Path) -> int | None:
    try:
        with open_store(state) as store:
            obj = store.get("Playground", MODEL, "default") or {}
    except Exception:  # a store this code cannot read: no figure
        return None
    return (obj.get("status") or {}).get("readyReplicas", 0)


def health_seconds(url: str) -> float | None:
    """Seconds ``/health`` took on a new connection; None if not answered 200 in time."""
    began = time.monotonic()
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=HEALTH_TIMEOUT) as resp:
            resp.read()
            ok = resp.status == 200
    except Exception:
        return None
    return time.monotonic() - began if ok else None


def health_cell(times: list[float | None], p50: bool = True) -> str:
    answered = [t for t in times if t is not None]
    missed = len(times) - len(answered)
    if not answered:
        return f"none of {len(times)} answered within {HEALTH_TIMEOUT:g} s"
    text = f"max {max(answered):.3f} s"
    if p50:
        text = f"p50 {statistics.median(answered):.3f} s, " + text
    if missed:
        text += f"; {missed} of {len(times)} unanswered within {HEALTH_TIMEOUT:g} s"
    return text


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def peak_rss(pid: int, seconds: float) -> float:
    """The highest RSS of ``pid`` sampled every 0.1 s for ``seconds``."""
    peak = rss_mb(pid)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
        peak = max(peak, rss_mb(pid))
    return peak


# -- item 1: idle connections ----------------------------------------------------------------


def fast_probe_fleet(tree: Path, replicas: int) -> str:
    """``sim_fleet`` on a copy of ``tree``'s built-in sim BackendRuntime whose liveness probe
    runs every second and fails after 2 (a blamed probe stops an engine in about 2 s)."""
    builtin = (tree / "llmplane/engines/builtin/sim.yaml").read_text()
    backend = builtin.replace("name: sim\n", "name: simfast\n", 1).replace(
        'llmplane.io/builtin: "true"', "bench: hostile"
    )
    backend = backend.replace(
        "livenessProbe:\n    periodSeconds: 10\n    failureThreshold: 3",
        "livenessProbe:\n    periodSeconds: 1\n    failureThreshold: 2",
    )
    if "periodSeconds: 1\n    failureThreshold: 2" not in backend:
        raise RuntimeError(f"{tree}'s sim.yaml has no liveness probe to shorten")
    fleet = sim_fleet(MODEL, replicas).replace("backendName: sim", "backendName: simfast")
    return f"{backend}\n---\n{fleet}"


def open_idle(port: int, count: int, budget: float) -> tuple[list[socket.socket], int]:
    """``count`` connections that each send one ``/health`` (opened within ``budget``
    seconds: one the kernel does not complete in 1 s is given up), then the answers read for
    up to 5 s: (the sockets, how many were answered)."""
    socks: list[socket.socket] = []
    deadline = time.monotonic() + budget
    while len(socks) < count and time.monotonic() < deadline:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1.0)
            s.sendall(HEALTH)
        except OSError:
            continue
        s.setblocking(False)
        socks.append(s)
    answered: set[socket.socket] = set()
    deadline = time.monotonic() + 5.0
    while len(answered) < len(socks) and time.monotonic() < deadline:
        for s in socks:
            if s in answered:
                continue
            with contextlib.suppress(OSError):  # BlockingIOError: not yet
                if s.recv(65536).startswith(b"HTTP/1.1 200"):
                    answered.add(s)
        time.sleep(0.05)
    return socks, len(answered)


def idle_connections(tree: Path, work: Path, count: int, window: float) -> Figures:
    prlimit = ("prlimit", "--nofile=1024:1024")
    with up_of(tree, work, fast_probe_fleet(tree, 2), prlimit) as (up, _):
        wait_for(lambda: ready_replicas(up.state_dir) == 2, 90, what="both engines Ready")
        pids = wait_for(lambda: len(p := up.engine_pids()) == 2 and p, 30, what="two engines")
        fds_before = fd_count(up.pid)
        socks, answered = open_idle(up.port, count, budget=30.0)
        try:
            fds: list[int] = []
            health: list[float | None] = []
            ready: list[int | None] = []
            seen: set[int] = set(pids)
            deadline = time.monotonic() + window
            while time.monotonic() < deadline:
                fds.append(fd_count(up.pid))
                health.append(health_seconds(up.url))
                ready.append(ready_replicas(up.state_dir))
                seen |= up.engine_pids()
                time.sleep(0.25)
            open_now = sum(1 for s in socks if _still_open(s))
            lost = pids - up.engine_pids()
            emfile = up.output().count("Too many open files")
        finally:
            for s in socks:
                s.close()
    ready_known = [r for r in ready if r is not None]
    return {
        "1: connections opened / answered / still open at the end": (
            f"{len(socks)} / {answered} / {open_now}"
        ),
        "1: descriptors of `up` before / max during": f"{fds_before} / {max(fds)}",
        "1: `/health` answer time": health_cell(health),
        "1: engines stopped / started (pids gone / new)": f"{len(lost)} / {len(seen - pids)}",
        "1: lines of `up`'s output with `Too many open files`": str(emfile),
        "1: Ready replicas (min / at the end)": (
            f"{min(ready_known)} / {ready_known[-1]}" if ready_known else "unknown"
        ),
    }


def _still_open(s: socket.socket) -> bool:
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


# -- item 2: a large scale-up ----------------------------------------------------------------


class HealthWatch:
    """``/health`` polled from a thread until ``stop()``; a probe still in flight then is
    reported with the time it has waited so far."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.times: list[float | None] = []
        self.current: float | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            self.current = time.monotonic()
            took = health_seconds(self.url)
            self.current = None
            self.times.append(took)
            time.sleep(0.05)

    def stop(self) -> str:
        """Stop polling; the answer times seen, as a cell."""
        self.done.set()
        began = self.current
        text = health_cell(list(self.times), p50=False)
        if began is not None and time.monotonic() - began > 0.5:
            text += f"; one still waiting after {time.monotonic() - began:.1f} s"
        return text


def scale_up(
    tree: Path, work: Path, replicas: int, before_term: float, stop_wait: float
) -> Figures:
    ceiling = {"LLMPLANE_MAX_REPLICAS": str(max(200, replicas))}
    with up_of(tree, work, sim_fleet(MODEL, 1), **ceiling) as (up, marker):
        wait_for(lambda: ready_replicas(up.state_dir) == 1, 90, what="the first engine Ready")
        big = work / "big.yaml"
        big.write_text(sim_fleet(MODEL, replicas))
        state = str(up.state_dir)
        watch = HealthWatch(up.url)
        try:
            applied = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "llmplane.cli",
                    "apply",
                    "-f",
                    str(big),
                    "--state-dir",
                    state,
                ],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=tree,
                env=tree_env(tree, **ceiling),
            )
            if applied.returncode != 0:
                raise RuntimeError(f"apply refused {replicas} replicas: {applied.stderr[-500:]}")
            time.sleep(before_term)  # the scale-up runs for this long
        finally:
            health = watch.stop()
        running = len(marked(marker))
        assert up.proc is not None
        up.proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        try:
            up.exited(stop_wait)
            stop = f"{time.monotonic() - began:.1f} s"
            left = f"{len(marked(marker))}"
        except TimeoutError:
            stop = f"not within {stop_wait:g} s (then SIGKILL)"
            left = f"{len(marked(marker))} still running, `up` included"
            print(f"up did not stop; the end of its output:\n{up.output()[-4000:]}", flush=True)
    watch.thread.join(HEALTH_TIMEOUT + 1)
    return {
        f"2: processes of `up` (itself included) {before_term:g} s after `replicas: 1 -> "
        f"{replicas}`": str(running),
        "2: `/health` answer time during the scale-up": health,
        "2: SIGTERM -> `up` exited": stop,
        "2: processes left when `up` exited": left,
    }


# -- items 5 and 6: the gateway's memory -----------------------------------------------------


def head(length: int) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % length
    )


def request(body: dict[str, Any]) -> bytes:
    data = orjson.dumps(body)
    return head(len(data)) + data


def routable(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request({"model": MODEL, "prompt": "hi", "max_tokens": 1}))
        return s.recv(100).startswith(b"HTTP/1.1 200 ")


@contextlib.contextmanager
def gateway_of(tree: Path, work: Path) -> Iterator[Process]:
    """A ``llmplane gateway`` of ``tree`` (one worker, default settings) routing ``MODEL`` to a
    sim of ``tree`` that answers at once."""
    with Processes() as group:
        engine = sim_process(
            MODEL,
            *("--time-scale", "0", "--max-model-len", "300000", "--num-blocks", "40000"),
            env={"PYTHONPATH": str(tree)},
            cwd=tree,
        )
        group.start(engine, timeout=60)
        state = work / "gateway-state"
        gateway = group.add(gateway_proc(str(state), tree=tree))
        gateway.ready(60)
        store_objects(str(state), endpoint_object("sim", engine.address, MODEL, engine="sim"))
        wait_for(lambda: routable(gateway.port), 30, 0.05, what="the gateway routes to the sim")
        yield gateway


def send_part(port: int, declared: int, sent: int, out: list[str]) -> socket.socket | None:
    """A connection that declares a ``declared``-byte body and sends ``sent`` bytes of it
    (10 s at most); appends what happened to ``out``."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        out.append("refused")
        return None
    try:
        s.sendall(head(declared) + b"x" * sent)
        out.append("sent")
    except TimeoutError:
        out.append("stalled")
    except OSError:
        out.append("closed by the gateway")
    return s


def half_sent(port: int, conns: int, outcomes: list[str]) -> list[socket.socket | None]:
    """``conns`` connections at once, each sending 10 MiB of a 15 MiB body (``send_part``)."""
    socks: list[socket.socket | None] = [None] * conns

    def one(i: int) -> None:
        socks[i] = send_part(port, 15 * MIB, 10 * MIB, outcomes)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return socks


def closed_bodies(tree: Path, work: Path, rounds: int, conns: int) -> Figures:
    figures: Figures = {}
    with gateway_of(tree, work) as gateway:
        figures["5: RSS at the start"] = f"{rss_mb(gateway.pid):.0f} MB"
        for r in range(rounds):
            outcomes: list[str] = []
            socks = half_sent(gateway.port, conns, outcomes)
            held = peak_rss(gateway.pid, 1.0)
            for s in socks:
                if s is not None:
                    s.close()
            time.sleep(5.0)  # the figure is defined as 5 s after the connections closed
            after = rss_mb(gateway.pid)
            sent = outcomes.count("sent")
            note = "" if sent == conns else f" ({sent} of {conns} sent all 10 MiB)"
            figures[f"5: round {r + 1}: RSS held / 5 s after closing"] = (
                f"{held:.0f} / {after:.0f} MB{note}"
            )
    return figures


def unread_streams(tree: Path, work: Path, streams: int, tokens: int, seconds: float) -> Figures:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": tokens, "ignore_eos": True}
    body["stream"] = True
    with gateway_of(tree, work) as gateway:
        base = rss_mb(gateway.pid)
        socks = []
        try:
            for _ in range(streams):
                s = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
                socks.append(s)
                s.sendall(request(body))
            peak = peak_rss(gateway.pid, seconds)
            started = sum(1 for s in socks if s.recv(12, socket.MSG_PEEK) == b"HTTP/1.1 200")
        finally:
            for s in socks:
                s.close()
    return {
        f"6: RSS, {streams} unread streams of {tokens:,} tokens, over {seconds:g} s": (
            f"{base:.0f} -> {peak:.0f} MB (+{peak - base:.0f} MB); {started} answered 200"
        )
    }


# -- the run ---------------------------------------------------------------------------------


def measure(tree: Path, args: argparse.Namespace) -> Figures:
    """Every item against ``tree``; an item that fails gives one cell saying so."""
    items: list[tuple[str, Callable[[Path], Figures]]] = [
        ("1", lambda w: idle_connections(tree, w, args.connections, args.window)),
        ("2", lambda w: scale_up(tree, w, args.replicas, 5.0, args.stop_wait)),
        ("5", lambda w: closed_bodies(tree, w, 3, 12)),
        ("6", lambda w: unread_streams(tree, w, 4, 100_000, 8.0)),
    ]
    figures: Figures = {}
    for name, run in items:
        if name not in args.items:
            continue
        print(f"[{describe(tree)}] item {name} ...", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"llmplane-hostile-{name}-") as work:
            try:
                got = run(Path(work))
            except Exception as err:
                got = {f"{name}: failed": f"{type(err).__name__}: {str(err)[:300]}"}
        for key, value in got.items():
            print(f"  {key}: {value}", flush=True)
        figures.update(got)
    return figures


def section(
    columns: list[tuple[str, Figures]], info: dict[str, object], command: str, load_after: Any
) -> str:
    metrics: list[str] = []
    for _, figures in columns:
        metrics += [m for m in figures if m not in metrics]
    rows = [[m, *(figures.get(m, "") for _, figures in columns)] for m in metrics]
    return (
        "## Hostile input: before and after the hardening\n\n"
        f"`{command}` ({machine_line(info, load_after)}). Items of the hardening issue: "
        "(1) 1,100 idle keep-alive connections to `llmplane up` (2 sims whose liveness probe "
        "gives up after 2 s) under `prlimit --nofile=1024:1024`, over 15 s; (2) `replicas: 1 -> "
        "120` applied to a running `up` (`LLMPLANE_MAX_REPLICAS=200`), SIGTERM 5 s later; "
        "(5) three rounds of 12 connections sending 10 MiB of a 15 MiB body, then closing, to "
        "`llmplane gateway` (1 worker); (6) 4 raw sockets asking that gateway for streams of "
        "100,000 tokens and never reading. `/health` is asked on a new connection, "
        f"unanswered after {HEALTH_TIMEOUT:g} s counts as such. A commit marked compiled runs "
        "its Cython modules (llmplane/_native).\n\n"
        + table(["what", *(name for name, _ in columns)], rows, "l" + "l" * len(columns))
        + "\n"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", type=Path, default=ROOT, help="checkout to measure (the after)")
    p.add_argument("--baseline-tree", type=Path, help="checkout measured first (the before)")
    p.add_argument("--items", default="1256", help="which items to run (default: 1256)")
    p.add_argument("--connections", type=int, default=1100)
    p.add_argument("--window", type=float, default=15.0)
    p.add_argument("--replicas", type=int, default=120)
    p.add_argument("--stop-wait", type=float, default=90.0, help="seconds SIGTERM may take")
    p.add_argument("--write", action="store_true", help="write the section into --report")
    p.add_argument("--report", type=Path, default=REPORT)
    args = p.parse_args(argv)
    # The client side of item 1 needs more descriptors than the 1,100 connections.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    info = machine()
    trees = [t.resolve() for t in (args.baseline_tree, args.tree) if t is not None]
    columns = [(f"`{describe(t)}`", measure(t, args)) for t in trees]
    command = "python -m bench.hostile" + (
        f" --baseline-tree {args.baseline_tree}" if args.baseline_tree else ""
    )
    text = section(columns, info, command, os.getloadavg())
    print(text)
    if args.write:
        print(f"wrote {write_section('hostile', text, args.report)}")


if __name__ == "__main__":
    main()
