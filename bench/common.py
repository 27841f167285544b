"""Shared helpers for the benchmarks: machine description, percentiles, process CPU time,
starting and stopping the systems under test, wrk runs, and the report sections they write."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from llmplane import testing
from llmplane.runtime.launch import free_port as free_port  # re-exported for the benches
from llmplane.testing import Process

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "docs" / "benchmarks.md"
IMG = ROOT / "docs" / "img"
RESULTS = ROOT / "bench" / "results"


def machine() -> dict[str, object]:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def machine_line(info: dict[str, object], load_after: Sequence[float] | None = None) -> str:
    text = (
        f"{info['nproc']} CPUs ({info['cpu']}), Python {info['python']}; load average "
        f"{' / '.join(str(x) for x in info['loadavg'])} (1/5/15 min) at the start"  # type: ignore[union-attr]
    )
    if load_after is not None:
        text += f", {' / '.join(f'{x:.2f}' for x in load_after)} at the end"
    return text


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's
    default); NaN for no values."""
    if not values:
        return float("nan")
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants (from /proc/<pid>/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    kids = _children()
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
        todo.extend(kids.get(p, []))
    return total


def launch(
    name: str,
    argv: Sequence[str],
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
) -> Process:
    """A launched server process (``llmplane.testing.Process``: its own session, output in a
    file, ``stop()`` ends it); ``.ready()`` waits for its ``LISTENING host:port`` line."""
    return Process(argv, name=name, env=env, cwd=cwd).launch()


def _ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk_script(body: bytes, headers: dict[str, str] | None = None) -> str:
    """A wrk Lua script that POSTs ``body`` as JSON (with ``headers`` besides)."""
    text = body.decode()
    extra = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in (headers or {}).items())
    return (
        'wrk.method = "POST"\n'
        f"wrk.body = [==[{text}]==]\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    ) + extra


def parse_wrk(out: str) -> dict[str, float]:
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = int(non2xx.group(1)) if non2xx else 0
    if sock:
        errors += sum(int(x) for x in sock.groups())
    return {"rps": rps, "requests": total, "p50": p50, "p99": p99, "errors": errors}


def wrk(
    url: str,
    body: bytes,
    concurrency: int,
    duration: float,
    threads: int = 2,
    headers: dict[str, str] | None = None,
) -> dict[str, float]:
    """One wrk run (POST ``body``, with ``headers`` besides); latency in ms."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(wrk_script(body, headers))
    try:
        out = subprocess.run(
            [
                "wrk",
                f"-t{min(concurrency, threads)}",
                f"-c{concurrency}",
                f"-d{max(1, round(duration))}s",
                "--timeout",
                "10s",
                "--latency",
                "-s",
                script.name,
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=duration + 30,
        ).stdout
    finally:
        os.unlink(script.name)
    return parse_wrk(out)


def measured_wrk(
    url: str, body: bytes, concurrency: int, duration: float, pids: Sequence[int]
) -> dict[str, Any]:
    """One wrk cell (``wrk``'s figures) with the CPU the processes ``pids`` (and their children)
    spent in it: ``cpu_per_1k`` seconds per 1,000 requests (NaN if none completed), its split
    per pid (``cpu_split_per_1k``), ``cpu_util`` and the cell's ``wall`` seconds."""
    cpu0 = [cpu_seconds(p) for p in pids]
    t0 = time.monotonic()
    r: dict[str, Any] = dict(wrk(url, body, concurrency, duration))
    wall = time.monotonic() - t0
    cpu = [cpu_seconds(p) - c0 for p, c0 in zip(pids, cpu0, strict=True)]
    n = r["requests"]
    r["wall"] = wall
    r["cpu_per_1k"] = sum(cpu) * 1000 / n if n else float("nan")
    r["cpu_split_per_1k"] = [x * 1000 / n if n else float("nan") for x in cpu]
    r["cpu_util"] = sum(cpu) / wall
    return r


class SystemsUnderTest(Protocol):
    """Servers started side by side: ``urls`` (name -> URL) once ``start()`` returned."""

    urls: dict[str, str]

    def start(self) -> None: ...

    def stop(self) -> None: ...


def rotate_and_measure(
    fleet: SystemsUnderTest,
    systems: Sequence[str],
    payloads: dict[str, bytes],
    modes: Sequence[str],
    concurrency: Sequence[int],
    duration: float,
    pids: Callable[[str], Sequence[int]],
    rounds: int | None = None,
) -> list[dict[str, Any]]:
    """Side-by-side wrk cells for ``systems`` (those of them ``fleet`` has a URL for, in this
    order); starts ``fleet`` and always stops it.

    Each system is warmed up (one second of unary requests at c=8); then, for each round, mode
    (a key of ``payloads``) and concurrency, every system gets one ``measured_wrk`` cell with
    the CPU of ``pids(name)``. The systems' order rotates from cell to cell so that the load of
    other work on a shared machine hits all alike. A failed cell is reported and skipped. Each
    cell carries ``system``, ``mode`` and ``c``, and ``round`` when ``rounds`` is given (else
    one pass)."""
    cells: list[dict[str, Any]] = []
    try:
        fleet.start()
        names = [s for s in systems if s in fleet.urls]
        print(f"systems: {', '.join(names)}", flush=True)
        _rotate(fleet.urls, names, payloads, modes, concurrency, duration, pids, rounds, cells)
    finally:
        fleet.stop()
    return cells


def _rotate(
    urls: dict[str, str],
    names: list[str],
    payloads: dict[str, bytes],
    modes: Sequence[str],
    concurrency: Sequence[int],
    duration: float,
    pids: Callable[[str], Sequence[int]],
    rounds: int | None,
    cells: list[dict[str, Any]],
) -> None:
    for name in names:  # warm up: connections, caches, JITs
        wrk(urls[name], payloads["unary"], 8, 1)
    turn = 0
    for round_ in range(rounds if rounds is not None else 1):
        tag = f"r{round_} " if rounds is not None else ""
        for mode in modes:
            for c in concurrency:
                order = names[turn % len(names) :] + names[: turn % len(names)]
                turn += 1
                for name in order:
                    try:
                        r = measured_wrk(urls[name], payloads[mode], c, duration, pids(name))
                    except Exception as err:
                        print(f"{tag}{mode:6s} c={c:<4d} {name:18s} FAILED: {err}", flush=True)
                        continue
                    r.update(system=name, mode=mode, c=c)
                    if rounds is not None:
                        r["round"] = round_
                    cells.append(r)
                    print(
                        f"{tag}{mode:6s} c={c:<4d} {name:18s} {r['rps']:8.0f} req/s  "
                        f"p50 {r['p50']:7.2f} ms  p99 {r['p99']:7.2f} ms  "
                        f"cpu {r['cpu_per_1k']:.3f} s/1k  errors {r['errors']}",
                        flush=True,
                    )


def checkout(ref: str, into: Path) -> Path:
    """A detached git worktree of ``ref`` at ``into`` (the baseline of an A/B run); remove it
    with ``remove_checkout``."""
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(into), ref],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return into


def remove_checkout(tree: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def write_section(name: str, text: str, path: Path = REPORT) -> Path:
    """Replace the generated section ``name`` of the report (between its markers)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    doc = path.read_text() if path.exists() else ""
    block = f"{begin}\n{text.rstrip()}\n{end}"
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        tail = rest.split(end, 1)[1]
        doc = head + block + tail
    else:
        doc = doc.rstrip() + "\n\n" + block + "\n"
    path.write_text(doc)
    return path


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> str:
    align = align or "l" + "r" * (len(headers) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def gateway_proc(
    state_dir: str,
    *extra: str,
    name: str = "llmplane",
    tree: Path | None = None,
    access_log: bool = False,
    workers: int | str = 1,
) -> Process:
    """``llmplane gateway`` on a free port over ``state_dir`` (access log off unless
    ``access_log``: then into the process's output file; warnings only), launched; ``extra``
    are more flags (``--config FILE``); ``tree`` runs another checkout's code
    (bench/gateway_ab.py). One worker unless ``workers`` says otherwise (``auto`` is the
    command's default): these benchmarks measure a process's cost per request, and
    bench/workers.py compares worker counts."""
    flags = (
        *extra,
        *(() if access_log else ("--no-access-log",)),
        *("--workers", str(workers)),
        *("--log-level", "WARNING"),
    )
    return testing.gateway(*flags, state_dir=state_dir, tree=tree, name=name).launch()


def upstream_proc(*extra: str) -> Process:
    """The stand-in upstream, ``llmplane.testing.upstream`` (model ``bench``, no modelled delay) on a free port,
    launched."""
    return testing.upstream_process("bench", "--delay", "0", *extra).launch()


def store_objects(state_dir: str, *objects: dict[str, Any]) -> None:
    """Apply ``objects`` (Endpoints, routes) to the store in ``state_dir`` for a gateway."""
    from llmplane.store.paths import open_store

    store = open_store(state_dir)
    try:
        for obj in objects:
            store.apply(obj)
    finally:
        store.close()
