"""Per-tenant limits and usage end to end: ``llmplane up`` with sim replicas, Tenants with a
request limit and an output-token limit applied and keyed with the CLI, the official
``openai`` client, 429s with Retry-After and ``x-ratelimit-*``, ``llmplane usage`` and the
usage metrics agreeing with what the clients were answered, and no key at rest or in logs."""

from __future__ import annotations

from pathlib import Path

import openai
import orjson
import pytest

from llmplane.testing import Processes, Up, wait_for
from tests.integration.openai_errors import assert_openai_error
from tests.integration.tenant_keys import authenticated, bearer, raw
from tests.integration.upcli import cli, http, sim_fleet, status

TENANTS = """
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {name: team-a}
spec:
  rateLimit: {requestsPerUnit: 4, unit: hour}
---
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {name: team-b}
spec:
  rateLimit: {outputTokensPerUnit: 20, unit: hour}
"""


@pytest.fixture
def up(tmp_path: Path, processes: Processes) -> Up:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet("tiny", 2))
    config = tmp_path / "gateway.yaml"
    config.write_text("gateway:\n  usageFlushInterval: 0.2\n")
    # -v: the access log goes to up's output, which the test searches for the keys.
    up = processes.up(tmp_path / "state", str(fleet), args=["-v", "--gateway-config", str(config)])
    wait_for(
        lambda: status(up.state_dir, "Playground", "tiny").get("readyReplicas") == 2,
        90,
        what="Playground tiny ready",
    )
    return up


def _complete(up: Up, key: str, max_tokens: int = 2) -> tuple[int, dict, dict]:
    body = {"model": "tiny", "prompt": "hello there", "max_tokens": max_tokens, "ignore_eos": True}
    return http(f"{up.url}/v1/completions", body, bearer(key))


def test_tenant_limits_and_usage(up: Up, tmp_path: Path) -> None:
    state = up.state_dir
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS)
    cli("apply", "-f", str(tenants), state_dir=state)
    key_a = cli("keys", "create", "team-a", state_dir=state).stdout.strip().splitlines()[-1]
    key_b = cli("keys", "create", "team-b", state_dir=state).stdout.strip().splitlines()[-1]
    answered: dict[str, list[dict]] = {"team-a": [], "team-b": []}  # the usage each was told

    # team-a: 4 requests an hour, through the official client (unary and streamed).
    client = openai.OpenAI(base_url=f"{up.url}/v1", api_key=key_a, max_retries=0)
    first = wait_for(
        lambda: authenticated(
            lambda: client.completions.create(model="tiny", prompt="hi", max_tokens=3)
        ),
        30,
        what="the openai client served with team-a's key",
    )
    answered["team-a"].append(first.usage.model_dump())
    answered["team-a"].append(
        client.completions.create(model="tiny", prompt="hi", max_tokens=3).usage.model_dump()
    )
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    answered["team-a"].append(chunks[-1].usage.model_dump())
    code, headers, doc = _complete(up, key_a)
    assert code == 200, doc
    assert headers["x-ratelimit-limit-requests"] == "4"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    answered["team-a"].append(doc["usage"])
    code, headers, doc = _complete(up, key_a)
    assert_openai_error(code, doc, 429, "rate_limit_exceeded")
    assert doc["error"]["type"] == "requests"
    assert int(headers["Retry-After"]) >= 800  # one request every 900 s, the last just taken
    assert headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model="tiny", prompt="hi", max_tokens=3)

    # team-b: 20 output tokens an hour; 8 per request: two fit, the third does not.
    wait_for(lambda: _complete(up, key_b, 8)[0] != 401, 30, what="team-b's key seen")
    code, headers, doc = _complete(up, key_b, 8)  # the wait above took the first 8
    assert code == 200 and doc["usage"]["completion_tokens"] == 8, doc
    answered["team-b"] += [doc["usage"], doc["usage"]]  # the same prompt twice
    assert headers["x-ratelimit-remaining-tokens-output"] == "4"
    code, headers, doc = _complete(up, key_b, 8)
    assert_openai_error(code, doc, 429, "rate_limit_exceeded")
    assert doc["error"]["type"] == "tokens" and "Tenant/team-b" in doc["error"]["message"]
    assert int(headers["Retry-After"]) >= 1 and headers["x-ratelimit-limit-tokens"] == "20"
    code, _, doc = _complete(up, key_b, 4)
    assert code == 200, doc  # what is left still fits
    answered["team-b"].append(doc["usage"])
    # team-a's limit does not hold team-b and the other way round.
    assert _complete(up, key_a)[0] == 429

    # `llmplane usage` (records flushed every 0.2 s) and the metrics say the same.
    expected = {
        tenant: {
            "requests": len(usages),
            "input_tokens": sum(u["prompt_tokens"] for u in usages),
            "output_tokens": sum(u["completion_tokens"] for u in usages),
        }
        for tenant, usages in answered.items()
    }

    def usage() -> dict[str, dict]:
        out = cli("usage", "--since", "1h", "-o", "json", state_dir=state).stdout
        return {r.pop("tenant"): r for r in orjson.loads(out) if r.pop("model") == "tiny"}

    wait_for(lambda: usage() == expected, 30, what=f"llmplane usage == {expected}: {usage()}")
    table = cli("usage", "--since", "1h", state_dir=state).stdout
    row = ["team-a", "tiny", *(str(v) for v in expected["team-a"].values())]
    assert row in [line.split() for line in table.splitlines()], table
    metrics = raw(f"{up.url}/metrics", {})
    assert (
        'llmplane_gateway_tenant_usage_requests_total{model="tiny",tenant="team-a"} 4.0' in metrics
    )
    out_b = expected["team-b"]["output_tokens"]
    assert (
        'llmplane_gateway_tenant_usage_tokens_total{direction="output",model="tiny",'
        f'tenant="team-b"}} {out_b:.1f}' in metrics
    )
    assert 'route="Tenant/team-a"' in metrics and 'direction="requests"' in metrics

    # No key at rest (store, usage log) or in up's output.
    up.stop()
    output = up.output()
    # The console wraps long log lines: search the output with its whitespace removed too,
    # so a key (or a name) cut across two lines is still found.
    flat = "".join(output.split())
    assert '"tenant":"team-a"' in flat and '"status":429' in flat  # the access log
    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.name == "usage.db" for p in files), files
    for key in (key_a, key_b):
        secret = key.split("-", 2)[2]
        assert key not in output and secret not in output
        assert key not in flat and secret not in flat
        for path in files:
            data = path.read_bytes()
            assert key.encode() not in data and secret.encode() not in data, path
