"""Test kit shared by tests and benchmarks: process launchers (``process``), waiting on a
condition (``wait``), and the Kubernetes API emulator (``kube``, NOT a Kubernetes API server)."""

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
