"""OpenAI's Responses API and Anthropic's Messages API through ``llmplane up`` (sim replicas):
the official ``openai`` client's ``responses.create`` and the official ``anthropic`` client's
``messages.create``, streamed and not, with a Tenant key (``Authorization: Bearer`` for one,
``x-api-key`` for the other) whose output-token limit and ``llmplane usage`` count each
request exactly as the engine reported it; ``count_tokens``, ``/tokenize`` and ``/detokenize``
routed by model too; the gateway's errors in each API's own shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmplane.testing import Processes, Up, wait_for
from llmplane.testing.process import gateway
from tests.integration.responses_messages import assert_anthropic_error, check_apis
from tests.integration.upcli import cli, http, sim_fleet, status


@pytest.fixture
def up(tmp_path: Path, processes: Processes) -> Up:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet("tiny", 2))
    config = tmp_path / "gateway.yaml"
    config.write_text("gateway:\n  usageFlushInterval: 0.2\n")
    up = processes.up(tmp_path / "state", str(fleet), args=["--gateway-config", str(config)])
    wait_for(
        lambda: status(up.state_dir, "Playground", "tiny").get("readyReplicas") == 2,
        90,
        what="Playground tiny ready",
    )
    return up


def test_responses_and_messages_with_a_tenant_key(up: Up, tmp_path: Path) -> None:
    check_apis(up, tmp_path, "tiny")


def test_an_engine_without_the_apis_gets_a_clear_error(
    tmp_path: Path, processes: Processes
) -> None:
    """A replica declared as llama.cpp (a real sim behind it, which would answer): the gateway
    refuses the Responses and Messages APIs and tokenize for it, naming the engine, in each
    API's shape; chat still goes through to it."""
    sim = processes.sim("smol")
    (tmp_path / "endpoint.yaml").write_text(
        f"""apiVersion: llmplane.io/v1alpha1
kind: Endpoint
metadata: {{name: smol-0}}
spec: {{address: {sim.address}, modelName: smol, engine: llamacpp}}
"""
    )
    state = tmp_path / "state"
    cli("apply", "-f", str(tmp_path / "endpoint.yaml"), state_dir=state)
    (gw,) = processes.start(gateway(state_dir=state))
    chat = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    wait_for(lambda: http(f"{gw.url}/v1/chat/completions", chat)[0] == 200, 30, what="chat served")
    code, _, doc = http(f"{gw.url}/v1/messages", chat)
    assert_anthropic_error(code, doc, 501, "api_error")
    assert "llamacpp" in doc["error"]["message"] and "/v1/messages" in doc["error"]["message"]
    for path, body in (
        ("/v1/responses", {"model": "smol", "input": "hi"}),
        ("/tokenize", {"model": "smol", "prompt": "hi"}),
    ):
        code, _, doc = http(f"{gw.url}{path}", body)
        assert code == 501 and doc["error"]["code"] == "unsupported_path", doc
        assert "llamacpp" in doc["error"]["message"] and path in doc["error"]["message"]
