"""A Tenant's default criticality applies to its requests on routes that carry none (a
Playground or Endpoint model, a ModelRoute); an InferenceModel's criticality wins. Real
gateway, real upstream processes; every scraped replica counts as saturated
(``saturationKv: -1``) and flow control is off, so a Sheddable request is shed at once and any
other is served (with flow control on, the same criticality picks the request's queue band:
tests/integration/test_gateway_flowcontrol.py)."""

from __future__ import annotations

from llmplane.gateway import apikeys
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.testing import eventually
from tests.integration.openai_errors import assert_openai_error

GIE = "inference.networking.x-k8s.io/v1alpha2"


def tenant(name: str, criticality: str, key: apikeys.NewKey) -> dict:
    return {
        "apiVersion": "llmplane.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "criticality": criticality,
            "keys": [{"id": key.id, "salt": key.salt, "hash": key.hash}],
        },
    }


async def post(client, gw, model: str, key: apikeys.NewKey):
    async with client.post(
        f"http://127.0.0.1:{gw.port}/v1/completions",
        json={"model": model, "prompt": "x", "max_tokens": 1},
        headers={"Authorization": f"Bearer {key.key}"},
    ) as r:
        return r.status, r.headers, await r.read()


async def test_tenant_criticality_applies_where_the_route_says_nothing(
    store, processes, client, gateways
):
    replica = processes.upstream("base")
    store.apply(endpoint_object("r0", replica.address, "base", labels={"pool": "p"}))
    store.apply(
        {
            "apiVersion": GIE,
            "kind": "InferencePool",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {
                "selector": {"pool": "p"},
                "targetPortNumber": 8000,
                "extensionRef": {"name": "epp"},
            },
        }
    )
    store.apply(
        {
            "apiVersion": GIE,
            "kind": "InferenceModel",
            "metadata": {"name": "chat", "namespace": "default"},
            "spec": {
                "modelName": "chat",
                "criticality": "Critical",
                "poolRef": {"name": "p"},
                "targetModels": [{"name": "base"}],
            },
        }
    )
    # An InferenceModel that names no criticality: the tenant's stays in force.
    store.apply(
        {
            "apiVersion": GIE,
            "kind": "InferenceModel",
            "metadata": {"name": "plain", "namespace": "default"},
            "spec": {
                "modelName": "plain",
                "poolRef": {"name": "p"},
                "targetModels": [{"name": "base"}],
            },
        }
    )
    batch, interactive = apikeys.new_key(), apikeys.new_key()
    store.apply(tenant("batch", "Sheddable", batch))
    store.apply(tenant("interactive", "Default", interactive))
    gw = await gateways(store, config=GatewayConfig(saturation_kv=-1, flow_control=False))
    await eventually(
        lambda: (
            len(gw.registry.states) == 1
            and all(s.has_load_metrics for s in gw.registry.states.values())
        ),
        what="the replica scraped",
    )
    # "base" is routed by its Endpoint, which has no criticality: the tenant's applies.
    status, headers, body = await post(client, gw, "base", batch)
    assert_openai_error(status, body, 429, "overloaded")
    assert int(headers["Retry-After"]) >= 1
    status, _, body = await post(client, gw, "base", interactive)
    assert status == 200, body
    # The InferenceModel says Critical: the Sheddable tenant is served there.
    status, _, body = await post(client, gw, "chat", batch)
    assert status == 200, body
    # "plain" says nothing: Sheddable is shed there, Default is served.
    status, _, body = await post(client, gw, "plain", batch)
    assert_openai_error(status, body, 429, "overloaded")
    status, _, body = await post(client, gw, "plain", interactive)
    assert status == 200, body
