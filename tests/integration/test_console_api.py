"""The console's routes on a real gateway without a local runtime (as ``llmplane gateway`` runs
it, e.g. in Kubernetes): static files with a same-origin policy, the fleet built from the store
and the endpoints a Service's label claims (with a real sim engine's load), hostile query
strings refused, the admin seam, and the inference API never shadowed by an extension."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from llmplane.console.api import Console
from llmplane.controlplane.plan import MODEL_NAME_LABEL, SERVICE_LABEL
from llmplane.gateway.auth import Authenticator
from llmplane.gateway.discovery import Endpoint, StaticDiscovery
from llmplane.gateway.observability import GatewayMetrics
from llmplane.gateway.server import routes, start_gateway
from llmplane.store.sqlite import SQLiteStore
from llmplane.testing import sim

MODEL = "tiny"
PLAYGROUND = {
    "apiVersion": "inference.llmaz.io/v1alpha1",
    "kind": "Playground",
    "metadata": {"name": "chat", "namespace": "default"},
    "spec": {"replicas": 3, "modelClaim": {"modelName": MODEL}},
}


@pytest.fixture(scope="module")
def engine() -> Any:
    with sim(MODEL, "--time-scale", "0.01") as server:
        yield server


@pytest.fixture
async def console_gateway(tmp_path: Path, engine: Any) -> Any:
    store = SQLiteStore(tmp_path / "db.sqlite")
    store.apply(PLAYGROUND)
    labels = {MODEL_NAME_LABEL: MODEL, SERVICE_LABEL: "chat"}
    discovery = StaticDiscovery([Endpoint(engine.address, labels, MODEL, fixed_port=True)])
    gateway = await start_gateway(store, discovery, extensions=[Console])
    yield gateway
    await gateway.close()
    store.close()


async def get(gateway: Any, path: str) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{gateway.port}{path}") as resp,
    ):
        return resp.status, dict(resp.headers), await resp.read()


async def test_static_files_carry_a_same_origin_policy(console_gateway: Any) -> None:
    for path in ("/console", "/console/", "/console/index.html"):
        status, headers, body = await get(console_gateway, path)
        assert status == 200 and headers["Content-Type"].startswith("text/html"), path
        assert b"/console/app.js" in body
        csp = headers["Content-Security-Policy"]
        assert "default-src 'self'" in csp and "connect-src 'self'" in csp
        assert "unsafe-inline" not in csp
    status, headers, _ = await get(console_gateway, "/console/app.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    assert (await get(console_gateway, "/console/../pyproject.toml"))[0] == 404
    assert (await get(console_gateway, "/console/api.py"))[0] == 404  # only static/ is served


async def test_fleet_from_store_and_labelled_endpoints(console_gateway: Any, engine: Any) -> None:
    async def scraped() -> dict[str, Any]:
        while True:
            status, _, body = await get(console_gateway, "/console/api/fleet")
            assert status == 200
            data = orjson.loads(body)
            replicas = data["workloads"][0]["replicas"]
            if replicas and replicas[0]["endpoint"]["metricsFresh"]:
                return data
            await asyncio.sleep(0.05)

    data = await asyncio.wait_for(scraped(), 10)
    (workload,) = data["workloads"]
    assert (workload["kind"], workload["name"], workload["desired"]) == ("Playground", "chat", 3)
    (replica,) = workload["replicas"]
    assert replica["address"] == engine.address and replica["hasLog"] is False
    assert replica["endpoint"]["kv"] == 0.0 and replica["endpoint"]["served"] == [MODEL]
    assert data["embedded"] is False and data["otherEndpoints"] == []


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("/console/api/logs?workload=default/chat&replica=0", 404),  # no runtime: no logs
        ("/console/api/stats?since=yesterday", 400),
    ],
)
async def test_refusals(console_gateway: Any, query: str, status: int) -> None:
    code, headers, body = await get(console_gateway, query)
    assert code == status and headers["Content-Type"] == "application/json", body
    assert b'"message"' in body


async def test_log_names_are_checked_before_any_path() -> None:
    """With a runtime, a workload name that is not a DNS name never becomes a path."""

    class Runtime:
        asked: list[str] = []

        def status(self, key: str) -> Any:
            self.asked.append(key)
            return None

    gateway = type("G", (), {})()  # what the console reads of a gateway (ConsoleGateway)
    gateway.metrics = GatewayMetrics()
    gateway.auth = Authenticator(None)
    gateway.seat = None
    runtime = Runtime()
    console = Console(gateway, runtime)
    for bad in (
        "../../etc/passwd",
        "default/..",
        "default/a%2Fb",
        "x/Chat",
        "default/chat&replica=-1",
    ):
        request = type("Q", (), {"path_qs": f"/console/api/logs?workload={bad}", "headers": {}})()
        response = await console.logs(request)
        assert response.status == 400, bad
    assert runtime.asked == []


async def test_admin_seam_refuses_every_api_call(console_gateway: Any) -> None:
    console = console_gateway.extensions[0]
    console.authorize = lambda request: "the console needs the admin key"
    for name in ("models", "fleet", "stats", "resources", "logs"):
        status, _, body = await get(console_gateway, f"/console/api/{name}")
        assert status == 401 and b"admin key" in body, name
    assert (await get(console_gateway, "/console/"))[0] == 200  # no data in the page itself
    # whoami answers 200 and says the key is not enough (the page asks before it calls).
    status, _, body = await get(console_gateway, "/console/api/whoami")
    assert status == 200 and orjson.loads(body)["admin"] is False, body
    console.authorize = lambda request: None
    status, _, body = await get(console_gateway, "/console/api/whoami")
    expected = {"admin": True, "chat": True, "tenant": None, "adminKey": False}
    assert orjson.loads(body) == expected, body


def test_an_extension_never_replaces_the_api() -> None:
    class Greedy:
        def routes(self) -> dict[tuple[str, str], Any]:
            return {("POST", "/v1/chat/completions"): "mine", ("GET", "/x"): "mine"}

    gateway = type("G", (), {})()
    for name in ("handle", "models", "health", "prometheus", "autoscaling_signals"):
        setattr(gateway, name, name)
    gateway.extensions = [Greedy()]
    table = routes(gateway)  # type: ignore[arg-type]
    assert table[("POST", "/v1/chat/completions")] == "handle"
    assert table[("GET", "/x")] == "mine"
