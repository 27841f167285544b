"""Client connections cannot starve ``llmplane up``'s control plane of file descriptors.

A real ``up`` (started under ``prlimit`` with a small open-files limit) runs two sim engines
whose liveness probe gives up after about 2 s; the test floods its gateway with idle
connections (new ones that send nothing, keep-alive ones after a request) and with
connections in the middle of a request head, and checks that the engines keep their pids and
stay Ready, that ``/health`` and a chat answer while idle connections fill the cap, that the
connections past the cap are refused with 503 + ``Retry-After`` when none is idle, and that
the soft limit is raised to the hard one (``up``, ``llmplane gateway`` and their workers).
With the cap turned off (``maxClientConnections: 0``) the descriptors do run out: the probes
that cannot be made must not stop an engine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmplane.fdlimit import client_connection_cap
from llmplane.testing import Process, Processes, Up, always, wait_for
from tests.integration.upcli import http, sim_fleet, status

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny"
# The built-in sim BackendRuntime with probes that give up fast: a liveness probe every
# second, failing after 2, so a probe blamed for our own EMFILE stops an engine in ~2 s.
BACKEND = "simfast"
LIVENESS_WINDOW = 4.0  # seconds: twice what it takes the liveness probe to give up


def fleet_file(tmp_path: Path) -> Path:
    builtin = (ROOT / "llmplane/engines/builtin/sim.yaml").read_text()
    backend = builtin.replace("name: sim\n", f"name: {BACKEND}\n", 1).replace(
        'llmplane.io/builtin: "true"', "test: descriptors"
    )
    backend = backend.replace(
        "livenessProbe:\n    periodSeconds: 10\n    failureThreshold: 3",
        "livenessProbe:\n    periodSeconds: 1\n    failureThreshold: 2",
    )
    assert "periodSeconds: 1\n    failureThreshold: 2" in backend
    fleet = sim_fleet(MODEL, 2).replace("backendName: sim", f"backendName: {BACKEND}")
    path = tmp_path / "fleet.yaml"
    path.write_text(f"{backend}\n---\n{fleet}")
    return path


def start_up(
    processes: Processes, tmp_path: Path, nofile: str, *args: str, gateway: str = ""
) -> Up:
    """``llmplane up`` under ``prlimit --nofile=SOFT:HARD``, its engines Ready."""
    config = tmp_path / "gateway.yaml"
    # New connections that send nothing stay until the test lets them go (not 408 at 10 s).
    config.write_text(f"gateway: {{clientHeaderTimeout: 120{gateway}}}\n")
    command = ["prlimit", f"--nofile={nofile}", sys.executable, "-m", "llmplane.cli"]
    up = processes.up(
        tmp_path / "state",
        str(fleet_file(tmp_path)),
        command=command,
        args=["--gateway-config", str(config), *args],
    )
    wait_for(
        lambda: status(up.state_dir, "Playground", MODEL).get("readyReplicas") == 2,
        60,
        what="both engines Ready",
    )
    return up


def limits(pid: int) -> tuple[int, int]:
    """The (soft, hard) open-files limit of process ``pid``."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-files line in /proc/{pid}/limits")


def gateway_pids(up: Up, workers: int) -> set[int]:
    """``up`` and, with workers, the worker its supervisor runs."""
    if workers == 1:
        return {up.pid}

    def found() -> set[int] | None:
        kids = _children(up.pid) - up.engine_pids()
        grandkids = {g for k in kids for g in _children(k)}
        return {up.pid, *grandkids} if len(grandkids) == workers - 1 else None

    return wait_for(found, 10, what="the gateway workers")


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


@contextlib.contextmanager
def held() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        yield socks
    finally:
        for s in socks:
            s.close()


def connect(up: Up, socks: list[socket.socket], first: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", up.port), timeout=10)
    socks.append(s)
    if first:
        s.sendall(first)
    return s


def still_open(socks: list[socket.socket]) -> list[socket.socket]:
    """The connections the gateway has neither answered nor closed."""
    out = []
    for s in socks:
        s.setblocking(False)
        try:
            data = s.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            out.append(s)
            continue
        except OSError:
            continue
        finally:
            s.setblocking(True)
        if data == b"":
            continue
    return out


def read_answer(s: socket.socket, timeout: float = 10) -> bytes:
    s.settimeout(timeout)
    chunks = []
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def chat(up: Up) -> int:
    code, _, body = http(
        f"{up.url}/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    assert code != 200 or body["choices"], body
    return code


def engines_unharmed(up: Up, pids: set[int]) -> bool:
    st = status(up.state_dir, "Playground", MODEL)
    return up.engine_pids() == pids and st.get("readyReplicas") == 2


HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
PARTIAL_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # never ends: not idle


@pytest.mark.parametrize("workers", [1, 2])
def test_idle_connections_cannot_starve_the_engines(
    tmp_path: Path, processes: Processes, workers: int
) -> None:
    # soft == hard: nothing to raise, so the cap alone must keep the control plane's share.
    up = start_up(processes, tmp_path, "256:256", "--workers", str(workers))
    cap = client_connection_cap(256)
    gateways = gateway_pids(up, workers)
    pids = up.engine_pids()
    assert len(pids) == 2
    most = cap * workers

    with held() as idle:
        # More idle connections than the process has descriptors: half new ones that say
        # nothing, half keep-alive ones after a request.
        for i in range(300):
            s = connect(up, idle)
            if i % 2:
                s.sendall(HEALTH)
                with contextlib.suppress(OSError):  # answered, then idle: kept alive
                    s.recv(65536)
        wait_for(
            lambda: len(still_open(idle)) <= most,
            10,
            what=f"at most {most} idle connections kept",
        )
        assert len(still_open(idle)) >= cap, "the gateway kept no idle connection at all"
        for pid in gateways:
            assert len(list(Path(f"/proc/{pid}/fd").iterdir())) < 256

        # At the cap with idle connections, a new client is served (an idle one makes room).
        code, _, body = http(f"{up.url}/health")
        assert code == 200, body
        assert chat(up) == 200
        always(
            lambda: engines_unharmed(up, pids),
            LIVENESS_WINDOW,
            every=0.2,
            what="engines keep their pids and stay Ready under idle connections",
        )
        assert chat(up) == 200

        # A cap full of requests under way (heads still arriving): new connections get 503.
        with held() as busy:
            for _ in range(cap * workers + 200):
                connect(up, busy, PARTIAL_HEAD)
            wait_for(lambda: not still_open(idle), 10, what="the idle connections evicted")
            refused = [s for s in busy if s not in still_open(busy)]
            assert len(refused) >= 100, f"only {len(refused)} of the extra connections refused"
            for s in refused[:20]:
                answer = read_answer(s)
                assert answer.startswith(b"HTTP/1.1 503 "), answer
                assert b"\r\nRetry-After: 1\r\n" in answer, answer
            extra = connect(up, busy, HEALTH)
            answer = read_answer(extra)
            assert answer.startswith(b"HTTP/1.1 503 ") and b"server_busy" in answer, answer
            assert engines_unharmed(up, pids)

    # Everything let go: served again, the same engines, nothing blamed on them.
    wait_for(lambda: http(f"{up.url}/health")[0] == 200, 10, what="/health once the flood ends")
    assert chat(up) == 200
    assert engines_unharmed(up, pids)
    st = status(up.state_dir, "Playground", MODEL)
    output = up.output()
    for sign in ("Too many open files", "short of its own", "liveness probe failed", "restarting"):
        assert sign not in output, f"{sign!r} in up's output:\n{output[-3000:]}"
    assert st.get("readyReplicas") == 2
    up.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert up.exited(30) == 0


def test_up_raises_the_soft_limit_for_itself_and_its_workers(
    tmp_path: Path, processes: Processes
) -> None:
    up = start_up(processes, tmp_path, "256:4096", "--workers", "2")
    for pid in gateway_pids(up, 2):
        assert limits(pid) == (4096, 4096), pid
    with held() as idle:
        for _ in range(400):  # more than the soft limit it was started with
            connect(up, idle)
        always(lambda: len(still_open(idle)) == 400, 1.0, what="every idle connection kept")
        assert http(f"{up.url}/health")[0] == 200
        assert chat(up) == 200


def test_own_shortage_is_not_blamed_on_the_engines(tmp_path: Path, processes: Processes) -> None:
    # The user turned the cap off: the idle connections do take every descriptor; the probes
    # that fail with EMFILE count as unknown, not as failures.
    up = start_up(processes, tmp_path, "256:256", gateway=", maxClientConnections: 0")
    pids = up.engine_pids()
    with held() as idle:
        for _ in range(400):
            with contextlib.suppress(OSError):
                connect(up, idle)
        wait_for(
            lambda: "short of its own resources" in up.output(),
            10,
            what="up to run out of descriptors probing its engines",
        )
        always(
            lambda: engines_unharmed(up, pids),
            LIVENESS_WINDOW,
            every=0.2,
            what="engines keep their pids and stay Ready while up is out of descriptors",
        )
    # Until up has read the closed connections' EOFs it is still out of descriptors, and
    # uvloop closes the connections it cannot take unanswered (docs/security.md): not yet.
    wait_for(
        lambda: http(f"{up.url}/health")[0] == 200,
        10,
        what="/health once the flood ends",
        ignore=(ConnectionError,),
    )
    wait_for(lambda: chat(up) == 200, 10, what="a chat answer", ignore=(ConnectionError,))
    assert engines_unharmed(up, pids)
    output = up.output()
    assert output.count("short of its own resources") == 1, output[-3000:]
    assert "liveness probe failed" not in output and "restarting" not in output, output[-3000:]


def test_llmplane_gateway_raises_the_soft_limit_for_its_workers(
    tmp_path: Path, processes: Processes
) -> None:
    argv = ["prlimit", "--nofile=256:4096", sys.executable, "-m", "llmplane.cli", "gateway"]
    argv += ["--port", "0", "--state-dir", str(tmp_path / "state"), "--workers", "2"]
    gateway = processes.start(Process(argv, name="llmplane gateway --workers 2"))[0]
    workers = wait_for(
        lambda: len(kids := _children(gateway.pid)) == 2 and kids, 10, what="two workers"
    )
    for pid in {gateway.pid, *workers}:
        assert limits(pid) == (4096, 4096), pid
    code, _, body = http(f"{gateway.url}/health")
    assert code == 200, body


def test_an_engine_restart_that_finds_up_out_of_descriptors_waits_without_blame(
    tmp_path: Path, processes: Processes
) -> None:
    up = start_up(processes, tmp_path, "256:256", gateway=", maxClientConnections: 0")
    pids = up.engine_pids()
    victim = max(pids)
    with held() as idle:
        for _ in range(400):
            with contextlib.suppress(OSError):
                connect(up, idle)
        wait_for(lambda: "short of its own resources" in up.output(), 10, what="no descriptors")
        os.kill(victim, signal.SIGKILL)  # a real crash: restarted after its back-off (10 s)
        # The restart cannot get a descriptor: ShortOfResources, not a crash loop.
        why = wait_for(
            lambda: (
                "ShortOfResources" in str(status(up.state_dir, "Service", MODEL))
                and str(status(up.state_dir, "Service", MODEL))
            ),
            30,
            what="the restart to wait for descriptors",
        )
        assert "could not start the engine" in why and "Too many open files" in why, why
        assert "CrashLoopBackOff" not in str(status(up.state_dir, "Service", MODEL))
    # Descriptors back: started at the next try (2 s), not after a doubled back-off (20 s).
    wait_for(
        lambda: status(up.state_dir, "Playground", MODEL).get("readyReplicas") == 2,
        8,
        what="the engine started again once descriptors are back",
    )
    assert len(up.engine_pids() & pids) == 1 and victim not in up.engine_pids()
