"""Where a process actually listens, read from /proc (Linux), to hold engines to loopback.

The local runtime points every engine at 127.0.0.1 (``launch.rewrite_argv``), but an engine can
bind elsewhere anyway: a flag spelled in a way we do not rewrite, an environment variable, a
config file. So after the engine starts answering, the runtime asks the kernel what the engine
process listens on: the socket inodes among ``/proc/<pid>/fd`` matched against the LISTEN rows
of ``/proc/<pid>/net/tcp`` and ``tcp6`` (the process's own network namespace).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

PROC = Path("/proc")
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    fd_dir = PROC / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _address(hex_address: str) -> tuple[str, int]:
    """``0100007F:1F90`` / 32-hex-digit IPv6 (kernel byte order, 4-byte words) -> (ip, port)."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    # Each 32-bit word is in host (little-endian) order.
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(packed)), int(port, 16)


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on; [] if it is gone or /proc is
    missing."""
    inodes = _socket_inodes(pid)
    if not inodes:
        return []
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            # The table lists every socket of the namespace (the gateway's connections too):
            # split only LISTEN rows (" 0A " occurs nowhere else: addresses have no spaces).
            if f" {_LISTEN} " not in line:
                continue
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and fields[9] in inodes:
                found.append(_address(fields[1]))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def beyond_loopback(pid: int) -> list[str]:
    """``address:port`` of each socket ``pid`` listens on that is not loopback-only
    (``0.0.0.0`` and ``::`` are every interface)."""
    return [
        f"[{a}]:{p}" if ":" in a else f"{a}:{p}" for a, p in listening(pid) if not is_loopback(a)
    ]
