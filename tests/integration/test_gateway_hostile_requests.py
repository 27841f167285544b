"""Requests built to slip past the gateway's decisions, against a real ``llmplane.sim``:
request fields of the wrong type (``"stream": "true"`` served a stream the token limit never
saw), model names as metric labels, and a browser's cross-site requests (Content-Type and
Host checks)."""

from __future__ import annotations

import logging

import aiohttp
import orjson
import pytest

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import Endpoint, StaticDiscovery
from llmplane.gateway.exposure import make_guard
from llmplane.gateway.server import start_gateway
from llmplane.store.sqlite import SQLiteStore
from llmplane.testing.process import sim

KTHENA = "networking.serving.volcano.sh/v1alpha1"
MODEL = "hostile-model"
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def engine():
    server = sim(MODEL, "--time-scale", "0")
    yield server
    server.stop()


@pytest.fixture
async def gateway(tmp_path, engine):
    store = SQLiteStore(tmp_path / "db.sqlite")
    store.apply(
        {
            "apiVersion": KTHENA,
            "kind": "ModelServer",
            "metadata": {"name": "srv", "namespace": "default"},
            "spec": {
                "model": MODEL,
                "inferenceEngine": "vLLM",
                "workloadSelector": {"matchLabels": {"app": "h"}},
            },
        }
    )
    store.apply(
        {
            "apiVersion": KTHENA,
            "kind": "ModelRoute",
            "metadata": {"name": "limited", "namespace": "default"},
            "spec": {
                "modelName": "limited",
                "rules": [{"targetModels": [{"modelServerName": "srv"}]}],
                "rateLimit": {"outputTokensPerUnit": 1000, "unit": "hour"},
            },
        }
    )
    discovery = StaticDiscovery([Endpoint(engine.address, {"app": "h"}, MODEL, fixed_port=True)])
    gw = await start_gateway(store, discovery, config=GatewayConfig())
    yield gw
    await gw.close()
    store.close()


@pytest.fixture
async def client():
    async with aiohttp.ClientSession() as session:
        yield session


async def post(client, gw, body, headers=JSON, path="/v1/completions"):
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with client.post(f"http://127.0.0.1:{gw.port}{path}", data=data, headers=headers) as r:
        return r.status, r.headers, await r.read()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stream", "true"),
        ("stream", 1),
        ("max_tokens", "5000"),
        ("max_tokens", 2.5),
        ("max_tokens", True),
        ("max_tokens", -1),
        ("n", "3"),
        ("n", 0),
        ("n", 1000000),  # forwarded before: the engine computed every choice
        ("n", 129),
        ("best_of", 1000000),
        ("stream_options", "include_usage"),
        ("stream_options", {"include_usage": "yes"}),
        ("temperature", "hot"),
        ("prompt", {"text": "x"}),
    ],
)
async def test_fields_of_the_wrong_type_are_400_before_routing(
    gateway, client, field, value
) -> None:
    body = {"model": "limited", "prompt": "hi", "max_tokens": 300, field: value}
    status, _, raw = await post(client, gateway, body)
    assert status == 400, raw
    error = orjson.loads(raw)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_type"
    assert error["param"].split(".")[0] == field
    assert f"'{error['param']}'" in error["message"]  # names the field, as OpenAI does


async def test_stream_true_as_a_string_cannot_bypass_the_token_limit(gateway, client) -> None:
    """Before: ``"stream": "true"`` was served as a stream (the engine coerces it) but
    reserved and settled as a unary request: 3,001 tokens on a 1,000/hour route."""
    served = 0
    for _ in range(5):
        body = {"model": "limited", "prompt": "hi", "max_tokens": 600, "ignore_eos": True}
        status, _, raw = await post(client, gateway, {**body, "stream": "true"})
        assert status == 400, raw
        status, _, raw = await post(client, gateway, {**body, "stream": True})
        if status == 200:
            served += raw.count(b'"text"')
        else:
            assert status == 429, raw
    # Only well-formed streams were served, and the limit held them to what it allows.
    assert 0 < served <= 1000 + 600


async def test_unknown_model_names_share_one_metric_label(gateway, client) -> None:
    for i in range(200):
        status, _, _ = await post(client, gateway, {"model": f"no-such-model-{i}-" + "x" * 200})
        assert status == 404
    status, _, _ = await post(
        client, gateway, {"model": "limited", "prompt": "hi", "max_tokens": 1}
    )
    assert status == 200
    status, _, _ = await post(client, gateway, b"{not json")
    assert status == 400
    text = gateway.metrics.render().decode()
    lines = [
        line for line in text.splitlines() if line.startswith("llmplane_gateway_requests_total{")
    ]
    models = {line.split('model="', 1)[1].split('"', 1)[0] for line in lines}
    assert models == {"", "limited"}, models  # the routed name, and one value for the rest
    assert "no-such-model" not in text
    assert len(text) < 64 * 1024


HUGE = 8 * 1024 * 1024


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/completions", {"model": "m" * HUGE, "prompt": "hi"}, 404),
        ("/v1/chat/completions", {"model": "é" * (HUGE // 2), "messages": []}, 404),
        ("/v1/completions", {"model": "limited", "prompt": "hi", "stream": "s" * HUGE}, 400),
        ("/v1/completions", {"model": "limited", "prompt": {"text": "x" * HUGE}}, 400),
        ("/v1/completions", {"model": "limited", "prompt": "hi", "n": ["n"] * 100000}, 400),
        ("/v1/" + "p" * 60000, {"model": "limited", "prompt": "hi"}, 404),
    ],
    ids=["model", "utf-8 model", "string field", "object field", "list field", "path"],
)
async def test_client_strings_are_clipped_in_errors_and_logs(
    gateway, client, caplog, path, body, status
) -> None:
    """Before: an 8 MB ``model`` was echoed in the 404 and written twice to the log (the
    access line's model and its error)."""
    caplog.set_level(logging.INFO, logger="llmplane")
    got, _, raw = await post(client, gateway, body, path=path)
    assert got == status, raw[:300]
    assert len(raw) < 2048, f"a {len(raw)}-byte error body echoes the client's string"
    message = orjson.loads(raw)["error"]["message"]
    assert "characters)" in message or "..." in message, message
    logged = sum(len(r.getMessage()) for r in caplog.records)
    assert logged < 8192, f"{logged} characters logged for one request"


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
async def test_browser_simple_request_content_types_are_415(gateway, client, content_type):
    body = {"model": "limited", "prompt": "hi", "max_tokens": 1}
    status, _, raw = await post(client, gateway, body, headers={"Content-Type": content_type})
    assert status == 415, raw
    error = orjson.loads(raw)["error"]
    assert error["code"] == "unsupported_media_type" and error["type"] == "invalid_request_error"


async def test_json_content_types_and_none_are_served(gateway, client) -> None:
    body = orjson.dumps({"model": "limited", "prompt": "hi", "max_tokens": 1})
    for headers in (JSON, {"Content-Type": "application/json; charset=utf-8"}, {}):
        # aiohttp adds application/octet-stream to bytes without a type: skip_auto_headers
        async with client.post(
            f"http://127.0.0.1:{gateway.port}/v1/completions",
            data=body,
            headers=headers,
            skip_auto_headers=() if headers else ("Content-Type",),
        ) as r:
            assert r.status == 200, await r.text()


async def test_host_must_be_a_loopback_name_on_a_loopback_gateway(gateway, client) -> None:
    """DNS rebinding: a page at evil.example resolved to 127.0.0.1 sends Host: evil.example."""
    body = {"model": "limited", "prompt": "hi", "max_tokens": 1}
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example"):
        status, _, raw = await post(client, gateway, body, headers={**JSON, "Host": host})
        assert status == 403, (host, raw)
        assert orjson.loads(raw)["error"]["code"] == "host_not_allowed"
        assert b"allowedHosts" in raw
        async with client.get(
            f"http://127.0.0.1:{gateway.port}/v1/models", headers={"Host": host}
        ) as r:
            assert r.status == 403  # reading is refused too
    for host in ("localhost", f"localhost:{gateway.port}", "127.0.0.1", "[::1]:80"):
        status, _, raw = await post(client, gateway, body, headers={**JSON, "Host": host})
        assert status == 200, (host, raw)


async def test_allowed_hosts_are_configurable(engine, client) -> None:
    discovery = StaticDiscovery([Endpoint(engine.address, {}, MODEL, fixed_port=True)])
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    for allowed, host, expected in (
        (["gw.internal"], "gw.internal:8000", 200),
        (["gw.internal"], "other.internal", 403),
        (["*"], "anything.example", 200),
    ):
        gw = await start_gateway(None, discovery, config=GatewayConfig(allowed_hosts=allowed))
        try:
            status, _, raw = await post(client, gw, body, headers={**JSON, "Host": host})
            assert status == expected, (allowed, host, raw)
        finally:
            await gw.close()


def test_the_host_check_follows_the_listen_address() -> None:
    class Req:
        method = "GET"

        def __init__(self, host: str) -> None:
            self.headers = {"host": host}

    # Listening beyond loopback (a pod, a LAN): any Host unless allowedHosts is set.
    assert make_guard("0.0.0.0", [])(Req("gateway.example")) is None
    assert make_guard("0.0.0.0", ["gw.example"])(Req("other.example")).status == 403
    assert make_guard("::1", [])(Req("evil.example")).status == 403
    assert make_guard("127.0.0.1", [])(Req("[::1]:8000")) is None
