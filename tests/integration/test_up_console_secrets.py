"""What the console and the 404 of an unknown model show, against ``llmplane up`` with sim
replicas: credentials in env lists, engine argv, URLs and Tenant keys are masked; the console's
API needs a key once a Tenant exists; a key's 404 names only the models that key may use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmplane.store.paths import open_store
from llmplane.testing import Processes, Up, wait_for
from tests.integration.openai_errors import assert_openai_error
from tests.integration.tenant_keys import TENANT, admin_key
from tests.integration.upcli import cli, http, sim_fleet, status

# Every value below is a credential the console must never show.
ENV_SECRETS = {
    "HF_TOKEN": "hf_envsecret0000000001",
    "AWS_SECRET_ACCESS_KEY": "awsenvsecret0000000002",
    "OPENAI_API_KEY": "openaienvsecret000003",
    "DB_PASSWORD": "dbenvsecret0000000004",
    "HUGGING_FACE_HUB_TOKEN": "hubenvsecret000000005",
}
ARG_SECRETS = ["argsecret000000000006", "argsecret000000000007", "argsecret000000000008"]
URL_SECRETS = ["urlpass0000000000009", "urltoken000000000010", "urlsig0000000000000011"]
ENGINE_ARGS = [
    "--api-key",
    ARG_SECRETS[0],
    f"--hf-token={ARG_SECRETS[1]}",
    "--admin-password",
    ARG_SECRETS[2],
    "--lora-modules",
    f"ad=https://user:{URL_SECRETS[0]}@hub.example/ad?token={URL_SECRETS[1]}&sig={URL_SECRETS[2]}",
]
TENANT_ALL = """
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {name: team-all}
"""


def _fleet_yaml() -> str:
    envs = [{"name": n, "value": v} for n, v in ENV_SECRETS.items()]
    envs.append({"name": "LOG_LEVEL", "value": "debug-visible"})
    with_env = sim_fleet("tiny-b", 1) + f"    envs: {json.dumps(envs)}\n"
    # The sim has no --api-key: this replica fails at start, its log holds the argv (twice:
    # our "starting" line and argparse's complaint).
    leaky = sim_fleet("leaky", 1, args=ENGINE_ARGS)
    return sim_fleet("tiny-a", 1) + "---" + with_env + "---" + leaky


def _start(tmp_path: Path, processes: Processes, args: list[str]) -> Up:
    path = tmp_path / "fleet.yaml"
    path.write_text(_fleet_yaml())
    up = processes.up(tmp_path / "state", str(path), args=args)
    for name in ("tiny-a", "tiny-b"):
        wait_for(
            lambda n=name: status(up.state_dir, "Playground", n).get("readyReplicas") == 1,
            90,
            what=f"Playground {name} ready",
        )
    return up


@pytest.fixture
def up(tmp_path: Path, processes: Processes) -> Up:
    return _start(tmp_path, processes, [])


@pytest.fixture
def admin_up(tmp_path: Path, processes: Processes) -> tuple[Up, str]:
    """``up`` with an admin key configured: (up, the admin key)."""
    admin, config = admin_key(tmp_path)
    return _start(tmp_path, processes, ["--gateway-config", str(config)]), admin


def _get(up: Up, path: str, key: str | None = None) -> tuple[int, Any]:
    code, _, doc = http(
        f"{up.url}{path}", headers={"Authorization": f"Bearer {key}"} if key else {}
    )
    return code, doc


def _leaks(text: str, secrets: list[str]) -> list[str]:
    return [s for s in secrets if s in text]


def _tenant_key(state: Path, tmp_path: Path, doc: str, name: str) -> str:
    tenant_file = tmp_path / f"{name}.yaml"
    tenant_file.write_text(doc)
    cli("apply", "-f", str(tenant_file), state_dir=state)
    return cli("keys", "create", name, state_dir=state).stdout.strip().splitlines()[-1]


def test_console_masks_credentials_and_needs_a_key_once_tenants_exist(
    up: Up, tmp_path: Path
) -> None:
    secrets = [*ENV_SECRETS.values(), *ARG_SECRETS, *URL_SECRETS]
    # No Tenant, loopback: the console API is open, and shows no credential.
    code, resources = _get(up, "/console/api/resources")
    assert code == 200
    text = orjson.dumps(resources).decode()
    assert not _leaks(text, secrets)
    # What is not a credential stays readable: names, flags, ordinary env values.
    for visible in (
        "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "debug-visible",
        "--api-key",
        "--hf-token",
    ):
        assert visible in text, visible

    log = wait_for(
        lambda: (
            (r := _get(up, "/console/api/logs?workload=default/leaky&replica=0"))[0] == 200
            and "unrecognized arguments" in r[1]["text"]
            and r[1]["text"]
        ),
        60,
        what="the failing replica's log with argparse's complaint",
    )
    assert not _leaks(log, secrets)
    assert "--api-key" in log and "hub.example" in log
    code, fleet = _get(up, "/console/api/fleet")
    assert code == 200 and not _leaks(orjson.dumps(fleet).decode(), secrets)

    # A Tenant with a key and no admin key configured: nobody reads the console's API, the
    # tenant's key included, and the answer says how to configure an admin key.
    key = _tenant_key(up.state_dir, tmp_path, TENANT, "team-a")
    wait_for(lambda: _get(up, "/console/api/fleet")[0] == 401, 30, what="console API 401")
    # (the Tenant and its key are two writes: the 401 may come before the key is live)
    wait_for(lambda: _get(up, "/console/api/whoami", key)[1]["chat"], 30, what="the key live")
    for path in ("models", "fleet", "stats", "resources", "logs?workload=default/leaky&replica=0"):
        for presented in (None, "llmp-wrong-key", key):
            code, doc = _get(up, f"/console/api/{path}", presented)
            assert code == 401 and "llmplane keys admin" in doc["error"]["message"], (path, doc)
    nobody = {"admin": False, "chat": False, "tenant": None, "adminKey": False}
    assert _get(up, "/console/api/whoami") == (200, nobody)
    tenant = {"admin": False, "chat": True, "tenant": "team-a", "adminKey": False}
    assert _get(up, "/console/api/whoami", key) == (200, tenant)


def test_with_the_admin_key_tenant_key_salts_and_hashes_stay_hidden(
    admin_up: tuple[Up, str], tmp_path: Path
) -> None:
    up, admin = admin_up
    key = _tenant_key(up.state_dir, tmp_path, TENANT, "team-a")
    wait_for(lambda: _get(up, "/console/api/whoami", key)[1]["chat"], 30, what="the key live")
    assert _get(up, "/console/api/resources", key)[0] == 401
    code, resources = _get(up, "/console/api/resources", admin)
    assert code == 200
    # The Tenant's key salt and hash are in the store and nowhere in the console.
    with open_store(up.state_dir) as store:
        stored = store.get("Tenant", "team-a", "default")
    assert stored is not None
    hidden = [k[f] for k in stored["spec"]["keys"] for f in ("salt", "hash")]
    text = orjson.dumps(resources).decode()
    assert hidden and not _leaks(text, hidden)
    assert "team-a" in text and not _leaks(text, [*ENV_SECRETS.values(), *ARG_SECRETS])


def _unknown(up: Up, model: str, key: str) -> tuple[int, dict[str, Any]]:
    code, _, doc = http(
        f"{up.url}/v1/completions",
        {"model": model, "prompt": "hi", "max_tokens": 1},
        {"Authorization": f"Bearer {key}"},
    )
    return code, doc


def test_unknown_model_404_names_only_the_keys_models(up: Up, tmp_path: Path) -> None:
    key = _tenant_key(up.state_dir, tmp_path, TENANT, "team-a")
    everything = _tenant_key(up.state_dir, tmp_path, TENANT_ALL, "team-all")
    for k in (key, everything):  # two Tenants, two writes: wait until both keys are live
        wait_for(lambda k=k: _unknown(up, "tiny-a", k)[0] == 200, 30, what="the key served")
    # Names the tenant's pattern allows but nothing routes: 404, naming tiny-a only.
    for model in ("tiny-a-nope", "tiny-ab", "tiny-a2", "tiny-a.b"):
        code, doc = _unknown(up, model, key)
        assert_openai_error(code, doc, 404, "model_not_found")
        message = doc["error"]["message"]
        assert "available: tiny-a" in message, message
        assert "tiny-b" not in message and "leaky" not in message, message
    code, _, models = http(f"{up.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert code == 200 and [m["id"] for m in models["data"]] == ["tiny-a"]
    # A key for every model is told about every model.
    code, doc = _unknown(up, "no-such-model", everything)
    assert_openai_error(code, doc, 404, "model_not_found")
    for name in ("tiny-a", "tiny-b", "leaky"):
        assert name in doc["error"]["message"], doc
