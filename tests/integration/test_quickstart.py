"""The README quickstart for real: SmolLM2-135M on llama.cpp behind the gateway, the openai client."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import OpenAI

from tests.integration.upprocess import Up, status, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def quickstart_two_replicas(tmp_path: Path):
    text = (ROOT / "examples" / "quickstart.yaml").read_text().replace("replicas: 1", "replicas: 2")
    path = tmp_path / "quickstart.yaml"
    path.write_text(text)
    up = Up(tmp_path / "state", str(path))
    try:
        yield up.start()
    finally:
        up.kill_everything()


def test_quickstart_answers_with_two_llamacpp_replicas(quickstart_two_replicas: Up) -> None:
    up = quickstart_two_replicas
    state = up.state_dir
    wait_for(
        lambda: status(state, "Playground", "smollm2-135m").get("readyReplicas") == 2,
        120,
        what="two ready replicas",
    )
    model_status = status(state, "OpenModel", "smollm2-135m", namespace=None)
    ready = next(c for c in model_status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and "SmolLM2-135M-Instruct.Q4_1.gguf" in ready["message"]

    client = OpenAI(base_url=f"{up.url}/v1", api_key="unused")
    served_by = set()
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24,
            temperature=0,
        )
        served_by.add(raw.headers["x-llmplane-endpoint"])
        answer = raw.parse().choices[0].message.content
        assert "Paris" in answer
    assert len(served_by) == 2  # both replicas serve traffic

    chunks = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert [m.id for m in client.models.list().data] == ["smollm2-135m"]
