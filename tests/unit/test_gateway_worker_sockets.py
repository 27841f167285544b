"""The workers' listening sockets (``workers/share.py``'s ``listen``): one ``SO_REUSEPORT``
group on one port, and a port something already listens on is refused, another gateway's
group included (with ``SO_REUSEPORT`` alone it would quietly join it)."""

from __future__ import annotations

import errno
import socket

import pytest

from llmplane.gateway.workers.share import listen


def test_port_0_binds_every_socket_to_one_free_port() -> None:
    socks = listen("127.0.0.1", 0, 3)
    try:
        ports = {s.getsockname()[1] for s in socks}
        assert len(socks) == 3 and len(ports) == 1 and ports != {0}
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for s in socks)
    finally:
        for s in socks:
            s.close()


def test_a_port_another_group_listens_on_is_refused() -> None:
    first = listen("127.0.0.1", 0, 2)
    try:
        port = first[0].getsockname()[1]
        with pytest.raises(OSError) as caught:
            listen("127.0.0.1", port, 2)
        assert caught.value.errno == errno.EADDRINUSE
    finally:
        for s in first:
            s.close()
