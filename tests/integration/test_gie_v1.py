"""The Inference Extension's v1 InferencePool and llm-d's InferenceObjective and
InferenceModelRewrite, end to end: the published example manifests (examples/gie-v1/, applied
unchanged with ``llmplane apply``), real sim engines registered as the pool's members, an
in-process gateway on the store the CLI wrote. Rewrites pick the served model, objectives give
requests their priority, and a v1alpha2 pool converted on apply routes as the same v1 pool."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.store.paths import open_store
from llmplane.testing import eventually, wait_for
from llmplane.testing.process import gateway
from tests.integration.openai_errors import assert_openai_error
from tests.integration.upcli import cli, http

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "gie-v1"
POOL_LABELS = {"app": "vllm-qwen3-32b"}  # what examples/gie-v1/inferencepool.yaml selects
SERVED = ("small-segment-lora-v1", "small-segment-lora-v2", "Qwen/Qwen3-32B")


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


async def chat(client, gw, model: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with client.post(
        f"http://127.0.0.1:{gw.port}/v1/completions",
        json={"model": model, "prompt": "hi", "max_tokens": 1},
        headers=headers or {},
    ) as r:
        return r.status, await r.json()


async def pool_gateway(processes, gateways, store, config: GatewayConfig | None = None):
    """Three sims in the pool (one per name the examples rewrite to) and a gateway."""
    for i, name in enumerate(SERVED):
        sim = processes.sim(name)
        store.apply(endpoint_object(f"r{i}", sim.address, name, labels=POOL_LABELS))
    gw = await gateways(store, config=config)
    await eventually(
        lambda: (
            len(gw.registry.states) == 3
            and all(s.served_models is not None for s in gw.registry.states.values())
        ),
        what="the pool's three replicas and the models they serve",
    )
    return gw


def served_by(reply: dict[str, Any]) -> str:
    return reply["model"]


async def test_published_examples_apply_unchanged_and_route(
    state, processes, gateways, client
) -> None:
    out = cli("apply", "-f", str(EXAMPLES), state_dir=state).stdout
    for ref in (
        "inferencepool.inference.networking.k8s.io/vllm-qwen3-32b created",
        "inferenceobjective.llm-d.ai/base-model created",
        "inferencemodelrewrite.llm-d.ai/small-segment-lora-alias created",
        "inferencemodelrewrite.llm-d.ai/generic-fallback created",
    ):
        assert ref in out, out
    again = cli("apply", "-f", str(EXAMPLES), state_dir=state).stdout
    assert "created" not in again and "configured" not in again, again  # stored as applied
    with open_store(state) as store:
        stored = store.get("InferenceModelRewrite", "small-segment-lora-alias", "default")
        assert stored["apiVersion"] == "llm-d.ai/v1alpha2"  # the old group's, stored as new
        gw = await pool_gateway(processes, gateways, store)
        # The alias (oldest of the two exact rewrites of the name; same age: by name) wins.
        for _ in range(5):
            status, reply = await chat(client, gw, "small-segment-lora")
            assert status == 200, reply
            assert served_by(reply) == "small-segment-lora-v1"
        # A model nothing routes: the rule without matches rewrites it for the pool.
        status, reply = await chat(client, gw, "no-such-model")
        assert status == 200 and served_by(reply) == "Qwen/Qwen3-32B", reply
        # A request without a model, or with a null one, too (the engine got the rewrite's).
        for body in ({}, {"model": None}):
            async with client.post(
                f"http://127.0.0.1:{gw.port}/v1/completions",
                json={**body, "prompt": "hi", "max_tokens": 1},
            ) as r:
                status, reply = r.status, await r.json()
            assert status == 200 and served_by(reply) == "Qwen/Qwen3-32B", reply
        # The objectives' priorities attach to requests that name them, for this pool only.
        decision = gw.table.resolve(
            "small-segment-lora", "/v1/completions", {"x-llm-d-inference-objective": "base-model"}
        )
        assert (decision.priority, decision.backend.ref) == (
            2,
            "InferencePool/default/vllm-qwen3-32b",
        )
        legacy = {"x-gateway-inference-objective": "small-segment-lora"}
        assert gw.table.resolve("small-segment-lora", "/v1/completions", legacy).priority == 1
        unknown = {"x-llm-d-inference-objective": "nope"}
        assert gw.table.resolve("small-segment-lora", "/v1/completions", unknown).priority is None


async def test_weighted_rewrite_splits_traffic(state, processes, gateways, client) -> None:
    cli("apply", "-f", str(EXAMPLES / "inferencepool.yaml"), state_dir=state)
    # The 90/10 canary only (the alias would win over it as the older rewrite).
    text = (EXAMPLES / "inferencemodelrewrite.yaml").read_text().split("\n---\n")[1]
    cli("apply", "-f", "-", state_dir=state, stdin=text)
    with open_store(state) as store:
        gw = await pool_gateway(processes, gateways, store)
        replies = await asyncio.gather(
            *(chat(client, gw, "small-segment-lora") for _ in range(100))
        )
    assert all(status == 200 for status, _ in replies), replies
    counts = Counter(served_by(reply) for _, reply in replies)
    assert set(counts) == {"small-segment-lora-v1", "small-segment-lora-v2"}, counts
    assert counts["small-segment-lora-v1"] > 70, counts  # 90 expected; 70 is 6 sigma away


async def test_v1alpha2_pool_is_stored_as_v1_and_routes_the_same(
    state, processes, gateways, client
) -> None:
    v1alpha2 = """
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferencePool
metadata: {name: vllm-qwen3-32b}
spec:
  selector: {app: vllm-qwen3-32b}
  targetPortNumber: 8000
  extensionRef: {name: epp, failureMode: FailOpen}
"""
    cli("apply", "-f", "-", state_dir=state, stdin=v1alpha2)
    cli("apply", "-f", str(EXAMPLES / "inferencemodelrewrite-fallback.yaml"), state_dir=state)
    with open_store(state) as store:
        pool = store.get("InferencePool", "vllm-qwen3-32b", "default")
        assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
        assert pool["spec"]["selector"] == {"matchLabels": POOL_LABELS}
        assert pool["spec"]["targetPorts"] == [{"number": 8000}]
        assert pool["spec"]["endpointPickerRef"]["port"] == {"number": 9002}
        assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
        gw = await pool_gateway(processes, gateways, store)
        status, reply = await chat(client, gw, "anything")
        assert status == 200 and served_by(reply) == "Qwen/Qwen3-32B", reply
    # Read back in the old group, converted from the stored v1.
    shown = cli(
        "get",
        "inferencepools.inference.networking.x-k8s.io",
        "vllm-qwen3-32b",
        "-o",
        "yaml",
        state_dir=state,
    ).stdout
    assert (
        "targetPortNumber: 8000" in shown
        and "apiVersion: inference.networking.x-k8s.io/v1alpha2" in shown
    )


async def test_rewrite_to_a_missing_or_h2c_pool_is_a_503(store, processes, gateways, client):
    sim = processes.sim("base")
    store.apply(endpoint_object("r0", sim.address, "base", labels=POOL_LABELS))
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "h2c", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": POOL_LABELS},
            "targetPorts": [{"number": 8000}],
            "appProtocol": "kubernetes.io/h2c",
        },
    }
    store.apply(pool)
    for name, target in (("to-h2c", "h2c"), ("to-none", "none")):
        store.apply(
            {
                "apiVersion": "llm-d.ai/v1alpha2",
                "kind": "InferenceModelRewrite",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "poolRef": {"name": target},
                    "rules": [
                        {
                            "matches": [{"model": {"value": name}}],
                            "targets": [{"modelRewrite": "base"}],
                        }
                    ],
                },
            }
        )
    gw = await gateways(store)
    await eventually(lambda: len(gw.registry.states) == 1, what="the replica")
    status, reply = await chat(client, gw, "to-h2c")
    assert "HTTP/1.1" in assert_openai_error(status, reply, 503, "no_backend")["message"]
    status, reply = await chat(client, gw, "to-none")
    assert "does not exist" in assert_openai_error(status, reply, 503, "no_backend")["message"]


def test_gateway_process_routes_the_published_examples(tmp_path: Path, processes) -> None:
    """``llmplane apply -f`` of the examples and of Endpoints for three sims in the pool, then
    the ``llmplane gateway`` process on that store (``llmplane up`` routes to the replicas it
    runs itself; external Endpoints are the standalone gateway's): the rewrites and an
    objective's header work through it."""
    endpoints = tmp_path / "endpoints.yaml"
    docs = []
    for i, name in enumerate(SERVED):
        sim = processes.sim(name)
        docs.append(
            f"""apiVersion: llmplane.io/v1alpha1
kind: Endpoint
metadata: {{name: r{i}}}
spec:
  address: {sim.address}
  modelName: {name}
  engine: vllm
  labels: {{app: vllm-qwen3-32b}}
"""
        )
    endpoints.write_text("---\n".join(docs))
    state = tmp_path / "state"
    cli("apply", "-f", str(endpoints), "-f", str(EXAMPLES), state_dir=state)
    (gw,) = processes.start(gateway(state_dir=state))

    def ask(model: str, headers: dict[str, str] | None = None) -> str:
        status, _, body = http(
            f"{gw.url}/v1/completions", {"model": model, "prompt": "x", "max_tokens": 1}, headers
        )
        return body["model"] if status == 200 else str(body)

    # Until the gateway has read every replica's models, a pick may land on one that does not
    # serve the adapter: wait for a run of answers, not one.
    wait_for(
        lambda: all(ask("small-segment-lora") == "small-segment-lora-v1" for _ in range(8)),
        30,
        what="the alias, eight times in a row",
    )
    objective = {"x-llm-d-inference-objective": "base-model"}
    assert ask("small-segment-lora", objective) == "small-segment-lora-v1"
    assert ask("nothing-serves-this") == "Qwen/Qwen3-32B"


async def test_a_request_without_a_model_is_permitted_by_the_name_it_is_sent_as(
    state, processes, gateways, client
) -> None:
    """A Tenant key's model list is checked against the catch-all rewrite's target: a key for
    ``Qwen/*`` is served, a key for other models gets the 403."""
    cli("apply", "-f", str(EXAMPLES / "inferencepool.yaml"), state_dir=state)
    cli("apply", "-f", str(EXAMPLES / "inferencemodelrewrite-fallback.yaml"), state_dir=state)
    tenants = """
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {name: qwen}
spec: {models: ["Qwen/*"]}
---
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {name: loras}
spec: {models: ["small-*"]}
"""
    cli("apply", "-f", "-", state_dir=state, stdin=tenants)
    keys = {
        name: cli("keys", "create", name, state_dir=state).stdout.strip().splitlines()[-1]
        for name in ("qwen", "loras")
    }
    with open_store(state) as store:
        gw = await pool_gateway(processes, gateways, store)

        async def unnamed(tenant: str) -> tuple[int, Any]:
            async with client.post(
                f"http://127.0.0.1:{gw.port}/v1/completions",
                json={"prompt": "hi", "max_tokens": 1},
                headers={"Authorization": f"Bearer {keys[tenant]}"},
            ) as r:
                return r.status, await r.json()

        await eventually(
            lambda: gw.auth.table.tenants == 2, what="the gateway to read both Tenants"
        )
        status, reply = await unnamed("qwen")
        assert status == 200 and served_by(reply) == "Qwen/Qwen3-32B", reply
        status, reply = await unnamed("loras")
        assert_openai_error(status, reply, 403, "model_not_allowed", "model")
