"""``llmplane up`` start-up as an unlucky operator meets it: a restart right after a stop with
clients still connected, and a second ``up`` on the same state directory."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmplane.testing import Up
from tests.integration.upcli import cli, sim_fleet


@pytest.fixture
def ups() -> Iterator[list[Up]]:
    started: list[Up] = []
    yield started
    for up in started:
        up.kill_everything()


def test_restart_on_the_same_port_right_after_a_stop_with_clients_connected(
    tmp_path: Path, ups: list[Up]
) -> None:
    first = Up(tmp_path / "state")
    ups.append(first)
    first.start()
    port = first.port
    assert port
    # Keep-alive clients with a finished request each: the gateway closes them when it stops,
    # so their server side sits in TIME_WAIT on the gateway's port.
    clients = []
    for _ in range(4):
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        client.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.1 200")
        clients.append(client)
    assert first.stop(signal.SIGTERM) == 0
    for client in clients:
        assert client.recv(4096) == b""  # closed by the server: TIME_WAIT is on its side
        client.close()

    second = Up(tmp_path / "state", port=port)
    ups.append(second)
    second.start()  # fails with "port ... is in use" when the pre-check binds differently
    assert second.port == port


def test_a_second_up_on_the_same_state_dir_is_refused_before_applying_anything(
    tmp_path: Path, ups: list[Up]
) -> None:
    state = tmp_path / "state"
    first = Up(state)
    ups.append(first)
    first.start()
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet("tiny", 1))
    proc = cli("up", "--port", "0", "-f", str(fleet), state_dir=state, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "another llmplane runtime is running with the state directory" in lines[0]
    assert str(state) in proc.stderr.replace("\n", "")
    # nothing of the refused -f files reached the running instance's store
    assert cli("get", "playgrounds", "-o", "name", state_dir=state).stdout == ""
    assert cli("get", "openmodels", "-o", "name", state_dir=state).stdout == ""
    assert first.proc is not None and first.proc.poll() is None  # the first one is untouched
