"""How many cores this process may use: ``llmplane gateway --workers auto``.

A gateway worker is one Python process, one core. ``auto`` starts one per core the process may
actually run on: the CPUs in its affinity mask (``taskset``, a cpuset), further bounded by a
cgroup CPU quota (a container's ``resources.limits.cpu`` on Kubernetes), as Go's automaxprocs
does; ``os.cpu_count()`` alone counts the whole node. At most ``AUTO_CAP`` workers: each one
holds its own store watch and memory, and past a few cores a second gateway replica is the
cheaper way to scale (docs/gateway.md, "Workers").
"""

from __future__ import annotations

import math
import os
from pathlib import Path

AUTO_CAP = 8


def _quota_v2(directory: Path) -> float | None:
    try:
        quota, _, period = (directory / "cpu.max").read_text().partition(" ")
        return None if quota.strip() == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _quota_v1(directory: Path) -> float | None:
    try:
        quota_us = int((directory / "cpu.cfs_quota_us").read_text())
        period_us = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def _smallest(quotas: list[float | None]) -> float | None:
    known = [q for q in quotas if q is not None]
    return min(known) if known else None


def cgroup_quota(
    root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")
) -> float | None:
    """The CPU quota in cores that bounds this process: the smallest ``cpu.max`` (cgroup v2)
    on the way from its own cgroup (``membership``, ``/proc/self/cgroup``) up to ``root``,
    else the v1 ``cpu`` controller's ``cfs_quota_us / cfs_period_us``; None without one."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        lines = []
    v2 = "/"
    v1 = "/"
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "":
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    quota = _smallest([_quota_v2(d) for d in _upwards(root, v2)])
    if quota is not None:
        return quota
    return _smallest([_quota_v1(d) for d in _upwards(root / "cpu", v1)])


def _upwards(root: Path, path: str) -> list[Path]:
    """``root/path`` and each of its parents down to ``root`` (nothing outside ``root``)."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    return [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


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
