"""Routing against real simulated engines (``python -m llmplane.sim``): Kthena ModelRoute +
ModelServer, Inference Extension InferencePool + InferenceModel, LoRA adapters, external
Endpoint objects in the store, workloadPort, live reload."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.testing import Processes, eventually, sim_process
from tests.integration.openai_errors import assert_openai_error

KTHENA = "networking.serving.volcano.sh/v1alpha1"
GIE = "inference.networking.x-k8s.io/v1alpha2"


def model_server(name, model, labels, **spec):
    return {
        "apiVersion": KTHENA,
        "kind": "ModelServer",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "model": model,
            "inferenceEngine": "vLLM",
            "workloadSelector": {"matchLabels": labels},
            **spec,
        },
    }


def model_route(name, spec):
    return {
        "apiVersion": KTHENA,
        "kind": "ModelRoute",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    adapter = tmp_path_factory.mktemp("lora") / "sql"
    adapter.mkdir()
    lora = ["--enable-lora", "--max-loras", "2", "--lora-modules", f"sql={adapter}"]
    with Processes() as group:  # all stopped, also when one fails to start
        servers = dict(
            zip(
                ("stable", "canary", "qwen-lora", "qwen"),
                group.start(
                    sim_process("llama-stable", "--time-scale", "0"),
                    sim_process("llama-canary", "--time-scale", "0"),
                    sim_process("qwen", "--time-scale", "0", *lora),
                    sim_process("qwen", "--time-scale", "0"),
                ),
                strict=True,
            )
        )
        yield servers


LABELS = {
    "stable": {"app": "llama", "track": "stable"},
    "canary": {"app": "llama", "track": "canary"},
    "qwen-lora": {"app": "qwen", "lora": "yes"},
    "qwen": {"app": "qwen"},
}


@pytest.fixture
def routed(store, sims):
    """The store with the four sims as Endpoint objects and a ModelServer per model."""
    for name, server in sims.items():
        model = "qwen" if name.startswith("qwen") else f"llama-{name}"
        store.apply(endpoint_object(name, server.address, model, labels=LABELS[name]))
    store.apply(model_server("stable", "llama-stable", {"track": "stable"}))
    store.apply(model_server("canary", "llama-canary", {"track": "canary"}))
    store.apply(model_server("qwen", "qwen", {"app": "qwen"}))
    return store


@pytest.fixture
async def gateway(routed, gateways):
    gw = await gateways(routed)
    await eventually(  # every endpoint's model list (the LoRA filter uses it)
        lambda: (
            len(gw.registry.states) == 4
            and all(s.served_models for s in gw.registry.states.values())
        ),
        what="four endpoints with their served models",
    )
    return gw


async def chat(client, gw, model, headers=None, path="/v1/chat/completions"):
    body = {"model": model, "max_tokens": 2}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hello"}]
    else:
        body["prompt"] = "hello"
    async with client.post(
        f"http://127.0.0.1:{gw.port}{path}", json=body, headers=headers or {}
    ) as r:
        return r.status, r.headers.get("x-llmplane-endpoint"), orjson.loads(await r.read())


async def test_weighted_split_and_rewrite(routed, gateway, client, sims):
    routed.apply(
        model_route(
            "llama",
            {
                "modelName": "llama",
                "rules": [
                    {
                        "name": "split",
                        "targetModels": [
                            {"modelServerName": "stable", "weight": 70},
                            {"modelServerName": "canary", "weight": 30},
                        ],
                    }
                ],
            },
        )
    )
    await eventually(lambda: "llama" in gateway.table.routes_by_model)
    counts = {"llama-stable": 0, "llama-canary": 0}
    n = 300
    for _ in range(n):
        status, endpoint, doc = await chat(client, gateway, "llama")
        assert status == 200, doc
        counts[doc["model"]] += 1  # the engine saw the rewritten model
        expected = sims["stable" if doc["model"] == "llama-stable" else "canary"].address
        assert endpoint == expected
    # 30 % canary: binomial sd = sqrt(300 * .3 * .7) = 7.9; allow 4.5 sd.
    assert abs(counts["llama-canary"] - 90) <= 36, counts


async def test_header_uri_and_body_rules(routed, gateway, client):
    routed.apply(
        model_route(
            "llama",
            {
                "modelName": "llama",
                "rules": [
                    {
                        "name": "premium",
                        "modelMatch": {"headers": {"x-user-tier": {"exact": "premium"}}},
                        "targetModels": [{"modelServerName": "canary"}],
                    },
                    {
                        "name": "ml-team",
                        "modelMatch": {"headers": {"x-team": {"regex": "^ml-"}}},
                        "targetModels": [{"modelServerName": "canary"}],
                    },
                    {
                        "name": "prod",  # Kthena StringMatch.prefix: a prefix, not a substring
                        "modelMatch": {"headers": {"x-env": {"prefix": "prod"}}},
                        "targetModels": [{"modelServerName": "canary"}],
                    },
                    {
                        "name": "gpu",  # StringMatch.regex is unanchored (Go's MatchString)
                        "modelMatch": {"headers": {"x-hw": {"regex": "gpu-[0-9]+"}}},
                        "targetModels": [{"modelServerName": "canary"}],
                    },
                    {
                        "name": "completions",
                        "modelMatch": {"uri": {"prefix": "/v1/completions"}},
                        "targetModels": [{"modelServerName": "canary"}],
                    },
                    {"name": "rest", "targetModels": [{"modelServerName": "stable"}]},
                ],
            },
        )
    )
    routed.apply(
        model_route(
            "adapters",
            {
                "loraAdapters": ["sql", "legal"],
                "rules": [
                    {
                        "name": "sql-only",
                        "modelMatch": {"body": {"model": "sql"}},
                        "targetModels": [{"modelServerName": "qwen"}],
                    }
                ],
            },
        )
    )
    await eventually(
        lambda: "sql" in gateway.table.routes_by_lora and "llama" in gateway.table.routes_by_model
    )
    assert (await chat(client, gateway, "llama", {"x-user-tier": "premium"}))[2][
        "model"
    ] == "llama-canary"
    assert (await chat(client, gateway, "llama", {"x-user-tier": "basic"}))[2][
        "model"
    ] == "llama-stable"
    assert (await chat(client, gateway, "llama", {"x-team": "ml-infra"}))[2][
        "model"
    ] == "llama-canary"
    assert (await chat(client, gateway, "llama", {"x-team": "web"}))[2]["model"] == "llama-stable"
    for headers, served in (
        ({"x-env": "production"}, "llama-canary"),
        ({"x-env": "preprod"}, "llama-stable"),  # contains "prod", does not start with it
        ({"x-hw": "nvidia-gpu-100-sxm"}, "llama-canary"),  # matches in the middle
        ({"x-hw": "gpu-x"}, "llama-stable"),
    ):
        assert (await chat(client, gateway, "llama", headers))[2]["model"] == served, headers
    assert (await chat(client, gateway, "llama", path="/v1/completions"))[2][
        "model"
    ] == "llama-canary"
    assert (await chat(client, gateway, "llama"))[2]["model"] == "llama-stable"
    # LoRA adapters keep their name, and go to the replica that has the adapter.
    for _ in range(10):
        status, endpoint, doc = await chat(client, gateway, "sql")
        assert status == 200, doc
        assert doc["model"] == "sql"
        assert endpoint == gateway_address(gateway, "qwen-lora")
    # No rule matches "legal": 404 in the OpenAI shape.
    status, _, doc = await chat(client, gateway, "legal")
    assert_openai_error(status, doc, 404, "no_matching_route")
    # Base model requests may go to either qwen replica.
    seen = {(await chat(client, gateway, "qwen"))[1] for _ in range(20)}
    assert len(seen) == 2


def gateway_address(gw, name):
    for state in gw.registry.states.values():
        if state.endpoint.labels == LABELS[name]:
            return state.address
    raise KeyError(name)


async def test_inference_pool_and_model(routed, gateway, client, sims):
    routed.apply(
        {
            "apiVersion": GIE,
            "kind": "InferencePool",
            "metadata": {"name": "llama-pool", "namespace": "default"},
            "spec": {
                "selector": {"app": "llama"},
                "targetPortNumber": 8000,
                "extensionRef": {"name": "epp"},
            },
        }
    )
    # Each sim serves one name; both pool members are candidates, so the served-model filter
    # (from /v1/models) sends each rewritten name to the replica that serves it.
    routed.apply(
        {
            "apiVersion": GIE,
            "kind": "InferenceModel",
            "metadata": {"name": "chat", "namespace": "default"},
            "spec": {
                "modelName": "chatbot",
                "criticality": "Critical",
                "poolRef": {"name": "llama-pool"},
                "targetModels": [
                    {"name": "llama-stable", "weight": 50},
                    {"name": "llama-canary", "weight": 50},
                ],
            },
        }
    )
    await eventually(lambda: "chatbot" in gateway.table.inference_models)
    counts = {"llama-stable": 0, "llama-canary": 0}
    for _ in range(200):
        status, endpoint, doc = await chat(client, gateway, "chatbot")
        assert status == 200, doc
        counts[doc["model"]] += 1
        assert endpoint == sims["stable" if doc["model"] == "llama-stable" else "canary"].address
    assert abs(counts["llama-stable"] - 100) <= 32, counts  # sd 7.1


async def test_workload_port_replaces_the_endpoint_port(store, sims, client, gateways):
    real = sims["stable"]
    # Registered like a pod, at a port nothing listens on; the ModelServer names the real one.
    store.apply(
        endpoint_object(
            "pod", "127.0.0.1:9", "llama-stable", labels={"app": "pod"}, fixed_port=False
        )
    )
    store.apply(endpoint_object("bare", "127.0.0.1", "llama-stable", labels={"app": "pod"}))
    store.apply(
        model_server("pod", "llama-stable", {"app": "pod"}, workloadPort={"port": real.port})
    )
    store.apply(
        model_route(
            "pod",
            {"modelName": "pod-model", "rules": [{"targetModels": [{"modelServerName": "pod"}]}]},
        )
    )
    gw = await gateways(store)
    for _ in range(6):  # both the pod-like and the bare-host endpoint
        status, endpoint, doc = await chat(client, gw, "pod-model")
        assert status == 200, doc
        assert endpoint == real.address
        assert doc["model"] == "llama-stable"


async def test_live_reload_keeps_in_flight_requests(store, processes, client, gateways):
    slow = processes.upstream("old-backend", "--delay", "1.0")
    fast = processes.upstream("new-backend")
    store.apply(endpoint_object("old", slow.address, "old-backend", labels={"v": "old"}))
    store.apply(endpoint_object("new", fast.address, "new-backend", labels={"v": "new"}))
    store.apply(model_server("old", "old-backend", {"v": "old"}))
    store.apply(model_server("new", "new-backend", {"v": "new"}))
    route = {"modelName": "app", "rules": [{"targetModels": [{"modelServerName": "old"}]}]}
    store.apply(model_route("app", route))
    gw = await gateways(store)
    in_flight = asyncio.create_task(chat(client, gw, "app"))
    await eventually(  # the request is now waiting on the slow backend
        lambda: slow.address in gw.registry.states and gw.registry.states[slow.address].inflight,
        what="the request in flight on the slow backend",
    )
    route["rules"][0]["targetModels"][0]["modelServerName"] = "new"
    store.apply(model_route("app", route))
    await eventually(
        lambda: gw.table.routes_by_model["app"][0].rules[0].targets[0].server == "new",
        what="the route reloaded",
    )
    status, endpoint, doc = await chat(client, gw, "app")
    assert (status, doc["model"], endpoint) == (200, "new-backend", fast.address)
    status, endpoint, doc = await in_flight
    assert (status, doc["model"], endpoint) == (200, "old-backend", slow.address)
    # Deleting the route: the name is gone.
    store.delete("ModelRoute", "app", "default")
    await eventually(lambda: "app" not in gw.table.routes_by_model, what="the route deleted")
    assert (await chat(client, gw, "app"))[0] == 404
