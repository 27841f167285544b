"""Open files: raise the soft limit at start, and keep clients from taking the control plane's.

Every client connection costs the gateway a descriptor, and one more to an engine while its
request runs; the control plane needs its own for engine probes and spawns, the store, logs and
the workers' pipes. With the common soft limit of 1,024 and no cap, about a thousand idle
connections left ``llmplane up`` unable to probe its engines (EMFILE), and healthy engines were
stopped. So ``up`` and ``llmplane gateway`` raise the soft limit to the hard limit before they
fork anything (gateway workers inherit it), and the gateway caps client connections at what is
left after a reserve (:func:`client_connection_cap`, documented in docs/security.md).
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("llmplane.fdlimit")

# Descriptors kept for the control plane at any limit (the store, logs, listening sockets,
# pipes, shared memory, engine spawns): ``up`` with two engines holds about 30.
RESERVED = 256


def raise_open_files() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _kernel_max(soft) if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as err:  # a sandbox may refuse: keep what we have
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, err)
    return open_files_limit()


def _kernel_max(soft: int) -> int:
    """The most a process may open when the hard limit says "unlimited" (Linux: nr_open)."""
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return soft


def open_files_limit() -> int:
    """This process's soft limit on open files (a large number when unlimited)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return _kernel_max(1 << 20) if soft == resource.RLIM_INFINITY else soft


def client_connection_cap(limit: int) -> int:
    """Client connections one gateway process may hold at once with ``limit`` open files.

    ``reserve = min(limit / 2, 256 + limit / 4)`` stays with the control plane (a quarter of
    the limit covers the probes, scrapes and drains of about 4 descriptors per engine); each
    client connection may hold one upstream connection while its request runs, so clients get
    half of the rest: ``(limit - reserve) / 2``. 1,024 gives 256; 65,536 gives 24,448.
    """
    reserve = min(limit // 2, RESERVED + limit // 4)
    return max(1, (limit - reserve) // 2)
