"""Bursts that scale one role of a disaggregated Playground and not the other, for the per-role
autoscaling tests under ``llmplane up`` and under the operator."""

from __future__ import annotations

from typing import Any

import pytest


def prompt_heavy(n: int) -> dict[str, Any]:
    """About 1,500 prompt tokens (4 characters a token), distinct from the first block on, so
    no prefix cache saves the prefill; two tokens answered."""
    return {"prompt": f"request {n:06d} " + "long prompt text " * 350, "max_tokens": 2}


def decode_heavy(n: int) -> dict[str, Any]:
    """A few prompt tokens, 40 to 80 answered: the clients, started together, drift apart
    (prompts reach prefill spread out, as from independent users, not all in one step)."""
    return {"prompt": f"request {n:06d}: hi", "max_tokens": 40 + n * 17 % 41, "ignore_eos": True}


# Each burst: its requests, clients sending them back to back, the role it must scale and the
# signal the rescale Event must name (the other role must not scale).
BURSTS = pytest.mark.parametrize(
    ("burst", "clients", "scaled", "metric"),
    [
        (prompt_heavy, 8, "prefill", "vllm:num_requests_waiting"),
        (decode_heavy, 24, "decode", "vllm:num_requests_running"),
    ],
    ids=["prompt-heavy", "decode-heavy"],
)
