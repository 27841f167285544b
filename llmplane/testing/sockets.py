"""The established TCP connections processes hold, read from /proc (Linux): tests and
benchmarks count the upstream connections a gateway worker opens."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def _tcp_table() -> dict[int, tuple[int, int]]:
    """Every established TCP socket of this network namespace: inode -> (local, remote) port."""
    out: dict[int, tuple[int, int]] = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "01":  # ESTABLISHED
                continue
            out[int(f[9])] = (int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16))
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def established(pids: Iterable[int]) -> dict[int, dict[int, tuple[int, int]]]:
    """Per pid: its established TCP sockets, inode -> (local port, remote port)."""
    table = _tcp_table()
    return {pid: {i: table[i] for i in _socket_inodes(pid) if i in table} for pid in pids}


def upstream(sockets: dict[int, tuple[int, int]], listening_port: int) -> set[int]:
    """The sockets of a server process (``established(...)[pid]``) that it opened itself:
    those whose local port is not the one it listens on."""
    return {i for i, (local, _) in sockets.items() if local != listening_port}
