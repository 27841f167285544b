"""A Tenant's API key stays at the gateway: ``llmplane gateway`` (a real process) in front of
the stand-in engine (``llmplane/testing/upstream.py``, which reports the headers of the last
inference request it served) sends the request upstream without ``Authorization`` or
``x-api-key`` once a key authenticated it; other headers go through. Without any Tenant the
client's ``Authorization`` still reaches the engine (an engine's own ``--api-key``)."""

from __future__ import annotations

import urllib.request

import orjson
import pytest

from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.store.paths import open_store
from llmplane.testing import Processes, gateway, upstream_process, wait_for
from tests.integration.upcli import cli

MODEL = "keyed-up"
TENANT = {
    "apiVersion": "llmplane.io/v1alpha1",
    "kind": "Tenant",
    "metadata": {"name": "team-k"},
    "spec": {"models": [MODEL]},
}


def post(url: str, headers: dict[str, str]) -> int:
    body = orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2})
    req = urllib.request.Request(url, body, {"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def engine_saw(address: str) -> dict[str, str]:
    with urllib.request.urlopen(f"http://{address}/admin", timeout=10) as resp:
        seen = orjson.loads(resp.read())["last_headers"]
    return {k.lower(): v for k, v in seen.items()}


@pytest.fixture
def setup(tmp_path):
    with Processes() as group:
        (engine,) = group.start(upstream_process(MODEL))
        state = tmp_path / "state"
        with open_store(state) as store:
            store.apply(endpoint_object("engine", engine.address, MODEL))
        (gw,) = group.start(gateway("--workers", "1", "--log-level", "WARNING", state_dir=state))
        yield engine, gw, state


def test_the_key_is_not_forwarded_and_other_headers_are(setup):
    engine, gw, state = setup
    url = f"http://{gw.address}/v1/completions"
    # No Tenant: open on loopback, and the client's Authorization is the engine's business.
    assert post(url, {"Authorization": "Bearer engine-key", "X-Trace": "t0"}) == 200
    assert engine_saw(engine.address)["authorization"] == "Bearer engine-key"

    with open_store(state) as store:
        store.apply(TENANT)
    key = cli("keys", "create", "team-k", state_dir=state).stdout.strip().splitlines()[-1]
    for headers in ({"Authorization": f"Bearer {key}"}, {"x-api-key": key}):
        wait_for(
            lambda h=headers: post(url, {**h, "X-Trace": "t1"}) == 200,
            30,
            what="the gateway serving the new key",
        )
        seen = engine_saw(engine.address)
        assert "authorization" not in seen and "x-api-key" not in seen, seen
        assert key not in orjson.dumps(seen).decode()
        assert seen["x-trace"] == "t1"  # the rest of the client's headers go through
