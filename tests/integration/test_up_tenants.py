"""Tenants and API keys end to end: ``llmplane up`` with sim replicas, keys made and revoked
with ``llmplane keys`` in another terminal, real HTTP and the official ``openai`` client."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from llmplane.testing import Processes, Up, always, wait_for
from tests.integration.openai_errors import assert_openai_error
from tests.integration.tenant_keys import TENANT, admin_key, authenticated, bearer, raw
from tests.integration.upcli import cli, http, sim_fleet, status


@pytest.fixture
def fleet(tmp_path: Path, processes: Processes) -> tuple[Up, str]:
    path = tmp_path / "fleet.yaml"
    path.write_text(sim_fleet("tiny-a", 1) + "---" + sim_fleet("tiny-b", 1))
    admin, config = admin_key(tmp_path)
    up = processes.up(tmp_path / "state", str(path), args=["-v", "--gateway-config", str(config)])
    for name in ("tiny-a", "tiny-b"):
        wait_for(
            lambda n=name: status(up.state_dir, "Playground", n).get("readyReplicas") == 1,
            90,
            what=f"Playground {name} ready",
        )
    return up, admin


def _complete(up: Up, model: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    body = {"model": model, "prompt": "hello", "max_tokens": 2}
    code, _, doc = http(f"{up.url}/v1/completions", body, headers)
    return code, doc


def test_keys_guard_models_metrics_and_never_leak(fleet: tuple[Up, str], tmp_path: Path) -> None:
    up, admin = fleet
    state = up.state_dir
    # No Tenant and a loopback gateway: open, as before.
    assert _complete(up, "tiny-a")[0] == 200

    tenant_file = tmp_path / "tenant.yaml"
    tenant_file.write_text(TENANT)
    cli("apply", "-f", str(tenant_file), state_dir=state)
    # A Tenant exists: a request without a key is refused once the gateway has seen it.
    code, doc = wait_for(
        lambda: (r := _complete(up, "tiny-a"))[0] == 401 and r, 30, what="401 without a key"
    )
    assert_openai_error(code, doc, 401, "invalid_api_key")
    assert doc["error"]["type"] == "invalid_request_error"

    made = cli("keys", "create", "team-a", "--name", "ci", state_dir=state).stdout
    key = made.strip().splitlines()[-1]
    key_id = key.split("-")[1]
    assert key.startswith("llmp-") and len(key) > 40
    listing = cli("keys", "list", "team-a", state_dir=state).stdout
    assert key_id in listing and key not in listing and "active" in listing

    # The official client with the key.
    client = openai.OpenAI(base_url=f"{up.url}/v1", api_key=key, max_retries=0)
    done = wait_for(
        lambda: authenticated(
            lambda: client.completions.create(model="tiny-a", prompt="hi", max_tokens=2)
        ),
        30,
        what="the openai client served with the new key",
    )
    assert done.choices and done.model == "tiny-a"
    # Applying the Tenant's file again (it has no keys: `llmplane keys` writes them), also with
    # a changed spec, keeps the key working (issue 27; more cases in test_apply_owned_fields.py).
    assert "unchanged" in cli("apply", "-f", str(tenant_file), state_dir=state).stdout
    tenant_file.write_text(TENANT.replace("criticality: Critical", "weight: 2"))
    assert "configured" in cli("apply", "-f", str(tenant_file), state_dir=state).stdout
    assert key_id in cli("keys", "list", "team-a", state_dir=state).stdout
    always(lambda: _complete(up, "tiny-a", bearer(key))[0] == 200, 1, every=0.1)
    # x-api-key works too; /v1/models lists only what the key may use.
    assert _complete(up, "tiny-a", {"x-api-key": key})[0] == 200
    code, _, models = http(f"{up.url}/v1/models", headers=bearer(key))
    assert code == 200 and [m["id"] for m in models["data"]] == ["tiny-a"]

    # Wrong keys: a wrong secret behind the right id, garbage, another scheme.
    for headers in (
        bearer(key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")),
        bearer("sk-not-ours"),
        {"Authorization": f"Basic {key}"},
        {"x-api-key": ""},
    ):
        code, doc = _complete(up, "tiny-a", headers)
        assert_openai_error(code, doc, 401, "invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{up.url}/v1", api_key="llmp-wrong", max_retries=0).models.list()

    # A model it may not use answers exactly as a model that does not exist.
    forbidden = _complete(up, "tiny-b", bearer(key))
    unknown = _complete(up, "no-such-model", bearer(key))
    assert_openai_error(*forbidden, 403, "model_not_allowed", "model")
    assert_openai_error(*unknown, 403, "model_not_allowed", "model")
    same = unknown[1]["error"]["message"].replace("no-such-model", "tiny-b")
    assert forbidden[1]["error"]["message"] == same
    with pytest.raises(openai.PermissionDeniedError):
        client.completions.create(model="tiny-b", prompt="hi", max_tokens=2)

    # /metrics and the console's JSON API need the admin key; the tenant's key is not it.
    assert http_status(f"{up.url}/metrics") == 401
    assert http_status(f"{up.url}/metrics", bearer(key)) == 401
    assert http_status(f"{up.url}/console/api/fleet") == 401
    assert http_status(f"{up.url}/console/api/fleet", bearer(admin)) == 200
    metrics = raw(f"{up.url}/metrics", bearer(admin))
    assert 'llmplane_gateway_tenant_requests_total{status="200",tenant="team-a"}' in metrics
    assert 'status="403",tenant="team-a"' in metrics

    # Revoked: refused again.
    cli("keys", "revoke", "team-a", key_id, state_dir=state)
    code, doc = wait_for(
        lambda: (r := _complete(up, "tiny-a", bearer(key)))[0] == 401 and r,
        30,
        what="401 for the revoked key",
    )
    assert_openai_error(code, doc, 401, "invalid_api_key")
    assert "revoked" in cli("keys", "list", state_dir=state).stdout

    # The key is nowhere at rest or in the logs; the access log names the tenant.
    up.stop()
    output = up.output()
    # The console wraps long log lines: search the output with its whitespace removed too,
    # so a key cut across two lines is still found.
    flat = "".join(output.split())
    assert '"tenant":"team-a"' in flat
    secret = key.split("-", 2)[2]
    assert key not in output and secret not in output
    assert key not in flat and secret not in flat
    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.suffix == ".db" or "sqlite" in p.name for p in files), files
    for path in files:
        data = path.read_bytes()
        assert key.encode() not in data and secret.encode() not in data, path
    assert key_id.encode() in b"".join(p.read_bytes() for p in files)  # the search can find


def http_status(url: str, headers: dict[str, str] | None = None) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {})) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code
