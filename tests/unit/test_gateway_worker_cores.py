"""``--workers auto``: the cores a process may use, from its affinity and its cgroup's CPU
quota (v2 ``cpu.max`` along its own cgroup's path, v1 ``cpu.cfs_*``), over fake cgroup trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmplane.gateway.cli import _parser
from llmplane.gateway.workers import cores


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def membership(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "self-cgroup"
    path.write_text(text)
    return path


def test_v2_quota_of_own_cgroup(tmp_path):
    root = tree(tmp_path / "fs", {"kubepods/pod1/ctr/cpu.max": "150000 100000\n"})
    own = membership(tmp_path, "0::/kubepods/pod1/ctr\n")
    assert cores.cgroup_quota(root, own) == 1.5


def test_v2_smallest_quota_on_the_way_up(tmp_path):
    root = tree(
        tmp_path / "fs",
        {
            "cpu.max": "max 100000\n",
            "system.slice/cpu.max": "100000 100000\n",
            "system.slice/llmplane.service/cpu.max": "max 100000\n",
        },
    )
    own = membership(tmp_path, "0::/system.slice/llmplane.service\n")
    assert cores.cgroup_quota(root, own) == 1.0
    (root / "cpu.max").write_text("300000 100000\n")  # a larger one above: still the smallest
    assert cores.cgroup_quota(root, own) == 1.0


def test_v2_no_quota(tmp_path):
    root = tree(tmp_path / "fs", {"cpu.max": "max 100000\n", "a/cpu.max": "max 100000\n"})
    assert cores.cgroup_quota(root, membership(tmp_path, "0::/a\n")) is None


def test_v1_quota(tmp_path):
    root = tree(
        tmp_path / "fs",
        {"cpu/docker/x/cpu.cfs_quota_us": "300000\n", "cpu/docker/x/cpu.cfs_period_us": "100000\n"},
    )
    own = membership(tmp_path, "4:memory:/docker/x\n2:cpu,cpuacct:/docker/x\n0::/\n")
    assert cores.cgroup_quota(root, own) == 3.0


def test_v1_unlimited_and_unreadable(tmp_path):
    root = tree(
        tmp_path / "fs",
        {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
    )
    assert cores.cgroup_quota(root, membership(tmp_path, "1:cpu:/\n")) is None
    assert cores.cgroup_quota(tmp_path / "missing", tmp_path / "missing-self") is None


def test_hostile_paths_stay_under_root(tmp_path):
    outside = tree(tmp_path, {"cpu.max": "100000 100000\n"})
    root = outside / "fs"
    root.mkdir()
    own = membership(tmp_path, "0::/../../\n")
    assert cores.cgroup_quota(root, own) is None


def test_usable_cores_bounded_by_affinity_and_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    root = tree(tmp_path / "fs", {"cpu.max": "50000 100000\n"})
    own = membership(tmp_path, "0::/\n")
    assert cores.usable_cores(root, own) == 1  # half a core of quota: one worker
    unlimited = tree(tmp_path / "fs2", {"cpu.max": "max 100000\n"})
    assert cores.usable_cores(unlimited, own) == affinity
    huge = tree(tmp_path / "fs3", {"cpu.max": "6400000 100000\n"})
    assert cores.usable_cores(huge, own) == affinity


def test_auto_is_capped(monkeypatch):
    monkeypatch.setattr(cores, "usable_cores", lambda: 96)
    assert cores.auto_workers() == cores.AUTO_CAP


@pytest.mark.parametrize("text", ["auto", "AUTO", " auto "])
def test_gateway_flag_takes_auto_and_defaults_to_it(text, monkeypatch):
    monkeypatch.setattr(cores, "usable_cores", lambda: 3)
    assert _parser().parse_args(["--workers", text]).workers == 3
    assert _parser().parse_args([]).workers == 3
    assert _parser().parse_args(["--workers", "1"]).workers == 1
