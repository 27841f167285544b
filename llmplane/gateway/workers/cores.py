"""``llmplane gateway --workers auto``: one worker per core this process may actually run on,
its affinity mask bounded by its cgroup CPU quota (as Go's automaxprocs; ``os.cpu_count()``
counts the whole node), at most ``AUTO_CAP`` (docs/gateway.md, "Workers": the defaults)."""

from __future__ import annotations

import math
import os
from pathlib import Path

AUTO_CAP = 8


def _cpu_max(directory: Path) -> float | None:  # cgroup v2
    try:
        quota, _, period = (directory / "cpu.max").read_text().partition(" ")
        return None if quota.strip() == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _cfs_quota(directory: Path) -> float | None:  # cgroup v1
    try:
        quota, period = (
            int((directory / f"cpu.cfs_{n}_us").read_text()) for n in ("quota", "period")
        )
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_quota(
    root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")
) -> float | None:
    """The CPU quota in cores that bounds this process: the smallest ``cpu.max`` (cgroup v2)
    on the way from its own cgroup (``membership``, ``/proc/self/cgroup``) up to ``root``,
    else the same of the v1 ``cpu`` controller's ``cfs_quota_us / cfs_period_us``; None
    without one."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        lines = []
    v2 = v1 = "/"
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "":
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    for read, base, path in ((_cpu_max, root, v2), (_cfs_quota, root / "cpu", v1)):
        parts = [p for p in path.split("/") if p and p not in (".", "..")]  # never above root
        quotas = [read(base.joinpath(*parts[:n])) for n in range(len(parts) + 1)]
        known = [q for q in quotas if q is not None]
        if known:
            return min(known)
    return None


def usable_cores(
    root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")
) -> int:
    """Cores this process may use: its affinity mask, bounded by the cgroup quota (rounded
    up: 1.5 cores of quota keep two workers busy part of the time), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_quota(root, membership)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def auto_workers() -> int:
    """``--workers auto``: one per usable core, at most ``AUTO_CAP``."""
    return min(usable_cores(), AUTO_CAP)
