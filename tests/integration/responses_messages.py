"""OpenAI's Responses API and Anthropic's Messages API checked through ``llmplane up`` against any
engine (the sim, real vLLM): ``check_apis``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest

from llmplane.testing import Up, wait_for
from tests.integration.openai_errors import assert_openai_error
from tests.integration.upcli import cli, http

LIMIT = 1000  # output tokens a day: what the requests took is read from the headers


TENANT = f"""
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {{name: agents}}
spec:
  rateLimit: {{outputTokensPerUnit: {LIMIT}, unit: day}}
"""


def assert_anthropic_error(code: int, doc: Any, status: int, kind: str) -> None:
    assert code == status, (code, doc)
    assert doc["type"] == "error" and doc["error"]["type"] == kind, doc
    assert isinstance(doc["error"]["message"], str) and doc["error"]["message"], doc


def _served(call: Any) -> Any:
    try:
        return call()
    except (openai.AuthenticationError, anthropic.AuthenticationError):
        return None  # the gateway has not seen the new key yet


def check_apis(up: Up, tmp_path: Path, model: str) -> None:
    """Both APIs through ``up`` serving ``model`` with a Tenant key (the sim:
    ``test_up_responses_messages.py``; real vLLM: ``test_vllm_responses_messages.py``)."""
    state = up.state_dir
    (tmp_path / "tenant.yaml").write_text(TENANT)
    cli("apply", "-f", str(tmp_path / "tenant.yaml"), state_dir=state)
    key = cli("keys", "create", "agents", state_dir=state).stdout.strip().splitlines()[-1]
    oa = openai.OpenAI(base_url=f"{up.url}/v1", api_key=key, max_retries=0)
    an = anthropic.Anthropic(base_url=up.url, api_key=key, max_retries=0)
    used = 0  # output tokens settled so far, as the engine reported them
    usages: list[tuple[int, int]] = []  # (input, output) of each request

    def took(headers: Any, reserved: int) -> None:
        # The limit reserved ``reserved`` on top of what earlier requests settled at.
        remaining = int(headers["x-ratelimit-remaining-tokens-output"])
        assert remaining == LIMIT - used - reserved, (remaining, used, reserved)

    # Responses, not streamed (Bearer key).
    raw = wait_for(
        lambda: _served(
            lambda: oa.responses.with_raw_response.create(
                model=model, instructions="Be brief.", input="hello there", max_output_tokens=8
            )
        ),
        120,
        what="the openai client served with the tenant's key",
    )
    took(raw.headers, 8)
    response = raw.parse()
    assert response.status in ("completed", "incomplete") and response.output_text
    assert 1 <= response.usage.output_tokens <= 8 and response.usage.input_tokens > 0
    usages.append((response.usage.input_tokens, response.usage.output_tokens))
    used += response.usage.output_tokens

    # Responses, streamed: the events as the engine sent them, usage in response.completed.
    raw = oa.responses.with_raw_response.create(
        model=model,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "hi there"}]}],
        max_output_tokens=6,
        stream=True,
    )
    took(raw.headers, 6)
    events = list(raw.parse())
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds
    usage = events[-1].response.usage
    assert [e.sequence_number for e in events] == list(range(len(events)))
    usages.append((usage.input_tokens, usage.output_tokens))
    used += usage.output_tokens

    # Messages, not streamed (x-api-key).
    raw = wait_for(
        lambda: _served(
            lambda: an.messages.with_raw_response.create(
                model=model,
                max_tokens=7,
                system="Be brief.",
                messages=[{"role": "user", "content": "hello"}],
            )
        ),
        120,
        what="the anthropic client served with the tenant's key",
    )
    took(raw.headers, 7)
    message = raw.parse()
    assert message.type == "message" and message.content[0].type == "text"
    assert message.stop_reason in ("end_turn", "max_tokens")
    usages.append((message.usage.input_tokens, message.usage.output_tokens))
    used += message.usage.output_tokens

    # Messages, streamed: input in message_start, output in message_delta.
    raw = an.messages.with_raw_response.create(
        model=model,
        max_tokens=5,
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        stream=True,
    )
    took(raw.headers, 5)
    events = list(raw.parse())
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    delta = next(e for e in events if e.type == "message_delta")
    usages.append((events[0].message.usage.input_tokens, delta.usage.output_tokens))
    used += delta.usage.output_tokens

    # Requests that generate nothing: routed by model, keyed, no output tokens reserved.
    counted = an.messages.count_tokens(model=model, messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens > 0
    code, headers, doc = http(
        f"{up.url}/tokenize", {"model": model, "prompt": "hello there"}, {"x-api-key": key}
    )
    assert code == 200 and doc["count"] == len(doc["tokens"]) > 0, doc
    assert "x-ratelimit-remaining-tokens-output" not in headers
    code, _, doc = http(
        f"{up.url}/detokenize", {"model": model, "tokens": doc["tokens"]}, {"x-api-key": key}
    )
    assert code == 200 and isinstance(doc["prompt"], str), doc
    usages += [(0, 0)] * 3

    # The limit's bucket holds exactly what is left: one token more is refused (429 in
    # Anthropic's shape for Messages, OpenAI's for Responses).
    left = LIMIT - used
    with pytest.raises(anthropic.RateLimitError) as refused:
        an.messages.create(
            model=model, max_tokens=left + 1, messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.body["type"] == "error"
    assert refused.value.body["error"]["type"] == "rate_limit_error"
    assert int(refused.value.response.headers["Retry-After"]) >= 1
    with pytest.raises(openai.RateLimitError):
        oa.responses.create(model=model, input="hi", max_output_tokens=left + 1)

    # The gateway's own errors, each API's shape.
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
    assert_anthropic_error(
        *_status_doc(http(f"{up.url}/v1/messages", body, {"x-api-key": "llmp-nope"})),
        401,
        "authentication_error",
    )
    assert_anthropic_error(
        *_status_doc(http(f"{up.url}/v1/messages", {**body, "model": "nope"}, {"x-api-key": key})),
        404,
        "not_found_error",
    )
    for bad in ({"max_tokens": "4"}, {"max_tokens": 0}, {"messages": "hi"}, {"system": 3}):
        assert_anthropic_error(
            *_status_doc(http(f"{up.url}/v1/messages", {**body, **bad}, {"x-api-key": key})),
            400,
            "invalid_request_error",
        )
    code, _, doc = http(f"{up.url}/v1/messages", {**body, "max_tokens": None}, {"x-api-key": key})
    assert_anthropic_error(code, doc, 400, "invalid_request_error")
    code, _, doc = http(
        f"{up.url}/v1/responses",
        {"model": model, "input": "x", "max_output_tokens": "8"},
        {"Authorization": f"Bearer {key}"},
    )
    assert_openai_error(code, doc, 400, "invalid_type", "max_output_tokens")
    code, _, doc = http(
        f"{up.url}/v1/responses", {"model": "nope", "input": "x"}, {"x-api-key": key}
    )
    assert_openai_error(code, doc, 404, "model_not_found")

    # `llmplane usage` counts each request as the engine reported it.
    expected = {
        "requests": len(usages),
        "input_tokens": sum(i for i, _ in usages),
        "output_tokens": sum(o for _, o in usages),
    }

    def usage() -> dict[str, Any]:
        out = cli("usage", "--since", "1h", "-o", "json", state_dir=state).stdout
        rows = [r for r in orjson.loads(out) if r["tenant"] == "agents" and r["model"] == model]
        return {k: v for k, v in rows[0].items() if k in expected} if rows else {}

    wait_for(lambda: usage() == expected, 30, what=f"llmplane usage == {expected}: {usage()}")


def _status_doc(answer: tuple[int, dict[str, str], Any]) -> tuple[int, Any]:
    return answer[0], answer[2]
