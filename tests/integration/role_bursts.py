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


# The prefill role's own trigger for the "prompt-tokens" burst: the prompt tokens the gateway
# sent and has not had a first token for, 3,000 a replica (a prompt-heavy burst keeps several
# thousand waiting on one prefill replica).
PREFILL_TOKENS_TRIGGER = {
    "hpa": {
        "metrics": [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": "llmplane_gateway_endpoint_prefill_tokens"},
                    "target": {"type": "AverageValue", "averageValue": 3000},
                },
            }
        ]
    }
}

# Each burst: its requests, clients sending them back to back, the role it must scale, the
# signal the rescale Event must name (the other role must not scale) and the prefill role's own
# scale trigger (None: its default).
BURSTS = pytest.mark.parametrize(
    ("burst", "clients", "scaled", "metric", "prefill_trigger"),
    [
        (prompt_heavy, 8, "prefill", "vllm:num_requests_waiting", None),
        (
            prompt_heavy,
            8,
            "prefill",
            "llmplane_gateway_endpoint_prefill_tokens",
            PREFILL_TOKENS_TRIGGER,
        ),
        (decode_heavy, 24, "decode", "vllm:num_requests_running", None),
    ],
    ids=["prompt-heavy", "prompt-tokens", "decode-heavy"],
)
