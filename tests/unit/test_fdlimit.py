"""The open-files limit: raised to the hard limit at start, and the client-connection cap
derived from it (docs/security.md states the formula)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmplane.fdlimit import client_connection_cap


@pytest.mark.parametrize(
    ("limit", "cap"), [(256, 64), (512, 128), (1024, 256), (4096, 1408), (65536, 24448)]
)
def test_the_cap_leaves_the_control_plane_its_reserve(limit: int, cap: int) -> None:
    assert client_connection_cap(limit) == cap
    # Clients and their upstream connections together stay within what the reserve leaves.
    assert 2 * cap + min(limit // 2, 256 + limit // 4) <= limit


def test_a_tiny_limit_still_admits_a_client() -> None:
    assert client_connection_cap(1) == 1


def test_raise_open_files_lifts_the_soft_limit_to_the_hard_one() -> None:
    code = (
        "import resource; from llmplane.fdlimit import raise_open_files; "
        "print(raise_open_files(), resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    out = subprocess.run(
        ["prlimit", "--nofile=100:700", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == ["700", "(700,", "700)"], out
