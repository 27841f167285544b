"""OpenAI's Responses API and Anthropic's Messages API through ``llmplane up`` against real
vLLM (the CPU build, one replica of the tiny test model: one cold start): the official clients,
streamed and not, with a Tenant key whose output-token limit and ``llmplane usage`` count each
request exactly as vLLM reported it (the same checks as against the sim,
``tests/integration/responses_messages.py``); with vLLM's response store on, a follow-up naming
a stored response in ``previous_response_id`` (the id the gateway gave it names the replica).
Skipped where vLLM is not installed."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from llmplane.gateway.protocols.responses import replica_tag
from llmplane.testing import Processes, Up, wait_for
from llmplane.testing.fleets import vllm_fleet
from llmplane.testing.tiny_model import build_tiny_llama
from tests.integration.responses_messages import check_apis
from tests.integration.upcli import cli, condition, status
from tests.integration.vllm_cpu import require_vllm

require_vllm()

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ENGINE_START = 420  # a cold vLLM start on a shared 2-core machine
NAME = "tiny"


def test_vllm_responses_and_messages_with_a_tenant_key(
    tmp_path: Path, processes: Processes
) -> None:
    model = build_tiny_llama(tmp_path / "model")
    (tmp_path / "fleet.yaml").write_text(
        vllm_fleet(model, NAME, env={"VLLM_ENABLE_RESPONSES_API_STORE": "1"})
    )
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
    check_previous_response(up, tmp_path, NAME)


def check_previous_response(up: Up, tmp_path: Path, model: str) -> None:
    """vLLM stores the response under the id the gateway set (``request_id``) and continues
    it when a follow-up names it (a Tenant without limits: ``check_apis`` used up its own)."""
    (tmp_path / "free.yaml").write_text(
        "apiVersion: llmplane.io/v1alpha1\nkind: Tenant\nmetadata: {name: free}\n"
    )
    cli("apply", "-f", str(tmp_path / "free.yaml"), state_dir=up.state_dir)
    key = cli("keys", "create", "free", state_dir=up.state_dir).stdout.strip().splitlines()[-1]
    oa = openai.OpenAI(base_url=f"{up.url}/v1", api_key=key, max_retries=0)

    def first_response():
        try:
            return oa.responses.with_raw_response.create(
                model=model, input="hello there", max_output_tokens=4
            )
        except openai.AuthenticationError:
            return None  # the gateway has not seen the new key yet

    raw = wait_for(first_response, 60, what="served with the new tenant's key")
    first = raw.parse()
    assert first.id.endswith("-" + replica_tag(raw.headers["x-llmplane-endpoint"])), first.id
    second = oa.responses.create(
        model=model, input="and then?", max_output_tokens=4, previous_response_id=first.id
    )
    assert second.previous_response_id == first.id
    # The conversation so far came first in the prompt.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
