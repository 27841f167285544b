"""OpenAI's Responses API and Anthropic's Messages API through ``llmplane up`` against real
vLLM (the CPU build, one replica of the tiny test model: one cold start): the official clients,
streamed and not, with a Tenant key whose output-token limit and ``llmplane usage`` count each
request exactly as vLLM reported it (the same checks as against the sim,
``tests/integration/responses_messages.py``). Skipped where vLLM is not installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmplane.testing import Processes, wait_for
from llmplane.testing.fleets import vllm_fleet
from llmplane.testing.tiny_model import build_tiny_llama
from tests.integration.responses_messages import check_apis
from tests.integration.upcli import condition, status
from tests.integration.vllm_cpu import require_vllm

require_vllm()

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ENGINE_START = 420  # a cold vLLM start on a shared 2-core machine
NAME = "tiny"


def test_vllm_responses_and_messages_with_a_tenant_key(
    tmp_path: Path, processes: Processes
) -> None:
    model = build_tiny_llama(tmp_path / "model")
    (tmp_path / "fleet.yaml").write_text(vllm_fleet(model, NAME))
    (tmp_path / "gateway.yaml").write_text("gateway:\n  usageFlushInterval: 0.2\n")
    up = processes.up(
        tmp_path / "state",
        str(tmp_path / "fleet.yaml"),
        args=["--gateway-config", str(tmp_path / "gateway.yaml")],
    )
    wait_for(
        lambda: (
            condition(up.state_dir, "Playground", NAME, "Available").get("status") == "True"
            and status(up.state_dir, "Playground", NAME).get("readyReplicas") == 1
        ),
        ENGINE_START,
        every=1,
        what="the vLLM replica ready",
    )
    check_apis(up, tmp_path, NAME)
