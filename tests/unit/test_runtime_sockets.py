"""What a process listens on, read from /proc (llmplane/runtime/sockets.py), with real sockets
of this test process."""

from __future__ import annotations

import contextlib
import os
import socket

import pytest

from llmplane.runtime.sockets import beyond_loopback, is_loopback, listening

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/net"), reason="Linux /proc only")


def test_listening_sockets_and_which_are_beyond_loopback() -> None:
    with contextlib.ExitStack() as stack:

        def listener(family: int, host: str) -> int:
            s = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            s.bind((host, 0))
            s.listen()
            return s.getsockname()[1]

        local4 = listener(socket.AF_INET, "127.0.0.1")
        every4 = listener(socket.AF_INET, "0.0.0.0")
        every6 = listener(socket.AF_INET6, "::")
        local6 = listener(socket.AF_INET6, "::1")
        # Connected and unbound sockets are not listeners.
        stack.enter_context(socket.create_connection(("127.0.0.1", local4)))
        stack.enter_context(socket.socket())
        found = set(listening(os.getpid()))
        assert {
            ("127.0.0.1", local4),
            ("0.0.0.0", every4),
            ("::", every6),
            ("::1", local6),
        } <= found
        assert len([p for _, p in found if p == local4]) == 1
        exposed = beyond_loopback(os.getpid())
        assert f"0.0.0.0:{every4}" in exposed and f"[::]:{every6}" in exposed
        assert not [a for a in exposed if str(local4) in a or str(local6) in a]


def test_loopback_addresses() -> None:
    for address in ("127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"):
        assert is_loopback(address), address
    for address in ("0.0.0.0", "::", "192.0.2.2", "::ffff:10.0.0.1", "fd00::2"):
        assert not is_loopback(address), address


def test_a_process_that_is_gone_listens_nowhere() -> None:
    assert listening(2**22 + 12345) == [] and beyond_loopback(2**22 + 12345) == []
