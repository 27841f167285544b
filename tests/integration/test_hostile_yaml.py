"""Hostile YAML through every command that reads it: bounded time and memory, a clear one-line
error (exit 1; 2 for ``llmplane gateway``), no traceback, nothing stored."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.integration.upcli import cli

# The CLI itself peaks around 80 MB; before the bounded loader the 7-level bomb took 1.2 GB in
# `apply` and the 9-level one ran `validate` for minutes.
PEAK_RSS_LIMIT_MB = 300
KILL_AFTER_S = 60  # a hang guard, not a speed assertion: the bounded loader answers in < 1 s


def alias_bomb(levels: int) -> str:
    """An OpenModel whose managedFields holds ``10**levels`` strings in about 70 bytes/level."""
    lines = [
        "apiVersion: llmaz.io/v1alpha1",
        "kind: OpenModel",
        "metadata:",
        "  name: bomb",
        "  managedFields:",
        '    - &a0 {f: ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]}',
    ]
    for i in range(1, levels):
        lines.append(f"    - &a{i} {{f: [{','.join([f'*a{i - 1}'] * 10)}]}}")
    lines += ["spec:", "  familyName: x", "  source: {uri: 'host:///dev/null'}"]
    return "\n".join(lines) + "\n"


def nested(levels: int) -> str:
    """An OpenModel whose metadata is ``levels`` mappings deep."""
    return (
        "apiVersion: llmaz.io/v1alpha1\nkind: OpenModel\nmetadata: "
        + "{a: " * levels
        + "1"
        + "}" * levels
        + "\n"
    )


def recursive() -> str:
    return "apiVersion: llmaz.io/v1alpha1\nkind: OpenModel\nmetadata: &m {name: x, loop: *m}\n"


# Runs the CLI as ``python -m llmplane.cli`` would, and on the way out writes the process's own
# peak RSS (VmHWM of its fresh address space). wait4's ru_maxrss is no use here: Linux carries
# the parent's peak over exec, so a child of a big pytest process reports pytest's.
_MEASURED = """
import atexit, runpy, sys
PEAK_FILE = sys.argv.pop(1)
def peak():
    with open(PEAK_FILE, "w") as out:
        out.write(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")))
atexit.register(peak)
sys.argv[0] = "llmplane"
runpy.run_module("llmplane.cli", run_name="__main__", alter_sys=True)
"""


def run_measured(*args: str) -> tuple[int, str, float]:
    """(exit status, stderr, peak RSS in MB) of one ``llmplane`` process."""
    with tempfile.TemporaryDirectory() as tmp:
        peak_file = Path(tmp) / "peak"
        proc = subprocess.run(
            [sys.executable, "-c", _MEASURED, str(peak_file), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=KILL_AFTER_S,
        )
        peak_kb = int(peak_file.read_text().split()[1])
    return proc.returncode, proc.stderr, peak_kb / 1024


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (alias_bomb(9), "aliases expand this document"),  # the billion laughs
        (alias_bomb(7), "aliases expand this document"),  # 466 bytes, 10 million nodes
        (nested(1000), "nested deeper than 100 levels"),
        (recursive(), "recursive alias"),
    ],
    ids=["billion-laughs", "seven-levels", "nested-1000", "recursive-alias"],
)
def test_validate_and_apply_refuse_hostile_yaml_cheaply(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    state = tmp_path / "state"
    for command in (
        ["validate", "-f", str(path)],
        ["apply", "-f", str(path), "--state-dir", str(state)],
    ):
        status, stderr, peak_mb = run_measured(*command)
        assert status == 1, stderr
        assert "Traceback" not in stderr and "RecursionError" not in stderr
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}:"), stderr
        assert problem in lines[0], stderr
        assert peak_mb < PEAK_RSS_LIMIT_MB, f"{command[0]} peaked at {peak_mb:.0f} MB"
    # nothing was stored
    assert cli("get", "openmodels", "-o", "name", state_dir=state).stdout == ""


def test_up_and_gateway_refuse_hostile_yaml(tmp_path: Path) -> None:
    bomb, deep = tmp_path / "bomb.yaml", tmp_path / "deep.yaml"
    bomb.write_text(alias_bomb(7))
    deep.write_text(nested(1000))
    state = str(tmp_path / "state")
    for args, status_expected in (
        (["up", "--port", "0", "--state-dir", state, "-f", str(bomb)], 1),
        (["up", "--port", "0", "--state-dir", state, "-f", str(deep)], 1),
        (["up", "--port", "0", "--state-dir", state, "--gateway-config", str(deep)], 1),
        (["gateway", "--port", "0", "--state-dir", state, "--config", str(bomb)], 2),
        (["gateway", "--port", "0", "--state-dir", state, "--config", str(deep)], 2),
    ):
        status, stderr, peak_mb = run_measured(*args)
        assert status == status_expected, stderr
        assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
        assert "aliases expand" in stderr or "nested deeper than 100" in stderr, stderr
        assert peak_mb < PEAK_RSS_LIMIT_MB, f"{args[0]} peaked at {peak_mb:.0f} MB"


def test_anchors_and_merge_keys_in_ordinary_files_still_work(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(
        """
apiVersion: v1
kind: List
items:
  - apiVersion: llmaz.io/v1alpha1
    kind: OpenModel
    metadata: {name: a, labels: &labels {team: x, tier: gold}}
    spec: &spec {familyName: f, source: {uri: "host:///dev/null"}}
  - apiVersion: llmaz.io/v1alpha1
    kind: OpenModel
    metadata: {name: b, labels: {<<: *labels, tier: silver}}
    spec: *spec
"""
    )
    out = cli("validate", "-f", str(path), state_dir=None).stdout
    assert "OpenModel/a valid" in out and "OpenModel/b valid" in out
