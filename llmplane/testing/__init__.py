"""Test kit shared by tests and benchmarks: process launchers (``process``), the stand-in
upstream (``upstream``), waiting on a condition (``wait``), the Kubernetes API emulator
(``kube_emulator``, NOT a Kubernetes API server) and more (docs/testing.md)."""

from llmplane.testing.process import (
    Process,
    Processes,
    Up,
    gateway,
    python,
    sim,
    sim_process,
    up,
    upstream,
    upstream_process,
)
from llmplane.testing.wait import always, eventually, keeps, wait_for

__all__ = [
    "Process",
    "Processes",
    "Up",
    "always",
    "eventually",
    "gateway",
    "keeps",
    "python",
    "sim",
    "sim_process",
    "up",
    "upstream",
    "upstream_process",
    "wait_for",
]
