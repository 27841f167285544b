"""Retries, timeouts, outlier ejection and admission (shedding), with real upstream processes
(``llmplane/testing/upstream.py``: exact control of delays and injected failures)."""

from __future__ import annotations

import asyncio

import orjson

from llmplane.controlplane.plan import MODEL_NAME_LABEL
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import Endpoint, StaticDiscovery
from llmplane.gateway.discovery.store_endpoints import StoreEndpoints, endpoint_object
from llmplane.gateway.server import start_gateway
from llmplane.testing import eventually
from tests.integration.openai_errors import assert_openai_error

KTHENA = "networking.serving.volcano.sh/v1alpha1"
GIE = "inference.networking.x-k8s.io/v1alpha2"


def static(model, servers):
    return StaticDiscovery(
        Endpoint(s.address, {MODEL_NAME_LABEL: model}, model, fixed_port=True) for s in servers
    )


async def post(client, gw, body, headers=None):
    async with client.post(
        f"http://127.0.0.1:{gw.port}/v1/completions", json=body, headers=headers or {}
    ) as r:
        return r.status, r.headers, await r.read()


async def test_killing_a_replica_under_load_fails_no_request(processes, client):
    replicas = [processes.upstream("m", "--delay", "0.02") for _ in range(3)]
    gw = await start_gateway(None, static("m", replicas))
    try:
        results = []
        sem = asyncio.Semaphore(12)

        async def one(i):
            async with sem:
                status, headers, _ = await post(
                    client, gw, {"model": "m", "prompt": f"request {i}"}
                )
                results.append((status, headers.get("x-llmplane-endpoint")))

        tasks = [asyncio.create_task(one(i)) for i in range(300)]
        await eventually(
            lambda: any(e == replicas[0].address for _, e in results), what="load on replica 0"
        )
        replicas[0].kill()  # SIGKILL: connections reset, new ones refused
        await asyncio.gather(*tasks)
        assert [s for s, _ in results if s != 200] == []
        late = [e for _, e in results[-100:]]
        assert replicas[0].address not in late  # ejected: no longer tried
        state = gw.registry.states[replicas[0].address]
        assert state.ejected_until > 0
        text = gw.metrics.render().decode()
        assert (
            "llmplane_gateway_retries_total" in text and "llmplane_gateway_ejections_total" in text
        )
    finally:
        await gw.close()


async def test_5xx_is_retried_elsewhere_and_the_replica_ejected(processes, client):
    bad, good = processes.upstream("m"), processes.upstream("m")
    async with client.post(f"http://{bad.address}/admin", json={"fail_status": 500}) as r:
        assert r.status == 200
    gw = await start_gateway(
        None, static("m", [bad, good]), config=GatewayConfig(ejection_failures=2)
    )
    try:
        # Each request may try the bad replica first (the pick among idle replicas is a random
        # tie-break); every answer still comes from the good one, and after two failures the
        # bad one is ejected. Bounded: 200 requests without two bad picks would be 2^-190.
        for i in range(200):
            status, headers, body = await post(client, gw, {"model": "m", "prompt": str(i)})
            assert status == 200, body
            assert headers["x-llmplane-endpoint"] == good.address
            if gw.registry.states[bad.address].ejected_until > 0:
                break
        assert gw.registry.states[bad.address].ejected_until > 0, "never ejected in 200 requests"
    finally:
        await gw.close()


async def test_last_attempt_relays_the_engine_error(processes, client):
    bad = processes.upstream("m")
    async with client.post(f"http://{bad.address}/admin", json={"fail_status": 503}) as r:
        assert r.status == 200
    gw = await start_gateway(None, static("m", [bad]))
    try:
        status, headers, body = await post(client, gw, {"model": "m", "prompt": "x"})
        assert status == 503
        assert orjson.loads(body)["error"]["message"] == "injected failure"
        assert headers["x-llmplane-endpoint"] == bad.address
    finally:
        await gw.close()


async def test_nothing_listening_gives_502(client):
    gw = await start_gateway(None, static("m", []))
    gw.discovery.set([Endpoint("127.0.0.1:9", {}, "m", fixed_port=True)])
    try:
        status, _, body = await post(client, gw, {"model": "m", "prompt": "x"})
        doc = orjson.loads(body)
        assert_openai_error(status, doc, 502, "bad_gateway")
        assert "3 attempts" in doc["error"]["message"]
    finally:
        await gw.close()


async def test_traffic_policy_timeout_and_retry(store, processes, client):
    slow = processes.upstream("m", "--delay", "2")
    store.apply(endpoint_object("slow", slow.address, "m", labels={"app": "slow"}))
    store.apply(
        {
            "apiVersion": KTHENA,
            "kind": "ModelServer",
            "metadata": {"name": "slow", "namespace": "default"},
            "spec": {
                "model": "m",
                "inferenceEngine": "vLLM",
                "workloadSelector": {"matchLabels": {"app": "slow"}},
                "trafficPolicy": {
                    "timeout": "300ms",
                    "retry": {"attempts": 1, "retryInterval": "50ms"},
                },
            },
        }
    )
    store.apply(
        {
            "apiVersion": KTHENA,
            "kind": "ModelRoute",
            "metadata": {"name": "slow", "namespace": "default"},
            "spec": {
                "modelName": "slow",
                "rules": [{"targetModels": [{"modelServerName": "slow"}]}],
            },
        }
    )
    gw = await start_gateway(store, StoreEndpoints(store))
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        status, _, body = await post(client, gw, {"model": "slow", "prompt": "x"})
        elapsed = loop.time() - started
        doc = orjson.loads(body)
        assert_openai_error(status, doc, 504, "upstream_timeout")
        # one timeout for the request, as Envoy's route timeout: a timed-out attempt is not
        # retried (the retry would have none left), not the engine's 2 s
        assert "(1 attempt)" in doc["error"]["message"]
        assert elapsed < 1.0
        # Streaming: the timeout bounds the time to the first byte.
        status, _, body = await post(client, gw, {"model": "slow", "prompt": "x", "stream": True})
        assert_openai_error(status, body, 504, "upstream_timeout")
    finally:
        await gw.close()


async def test_only_sheddable_traffic_is_shed_with_flow_control_off(store, processes, client):
    # Flow control off (today's behaviour without it): Sheddable gets 429 at once, the others
    # go to the engines' queues. With it on, see test_gateway_flowcontrol.py.
    # One running slot each: a running request puts KV use at 1.0 (> 0.8): saturated.
    replicas = [
        processes.upstream("base", "--delay", "1.5", "--max-running", "1") for _ in range(2)
    ]
    for i, s in enumerate(replicas):
        store.apply(endpoint_object(f"r{i}", s.address, "base", labels={"pool": "p"}))
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
    for name, criticality in (("batch", "Sheddable"), ("chat", "Critical"), ("std", "Default")):
        store.apply(
            {
                "apiVersion": GIE,
                "kind": "InferenceModel",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "modelName": name,
                    "criticality": criticality,
                    "poolRef": {"name": "p"},
                    "targetModels": [{"name": "base"}],
                },
            }
        )
    gw = await start_gateway(store, StoreEndpoints(store), config=GatewayConfig(flow_control=False))
    try:
        await eventually(
            lambda: (
                len(gw.registry.states) == 2
                and all(s.has_load_metrics for s in gw.registry.states.values())
            ),
            what="both replicas scraped",
        )
        # Idle: sheddable traffic is served.
        status, _, _ = await post(client, gw, {"model": "batch", "prompt": "x"})
        assert status == 200
        load = [
            asyncio.create_task(post(client, gw, {"model": "chat", "prompt": str(i)}))
            for i in range(4)
        ]
        await eventually(  # both replicas busy (KV full) and scraped
            lambda: all(s.kv_usage >= 1.0 for s in gw.registry.states.values()),
            what="both replicas saturated",
        )
        status, headers, body = await post(client, gw, {"model": "batch", "prompt": "x"})
        assert_openai_error(status, body, 429, "overloaded")
        assert int(headers["Retry-After"]) >= 1
        critical = asyncio.create_task(post(client, gw, {"model": "chat", "prompt": "y"}))
        default = asyncio.create_task(post(client, gw, {"model": "std", "prompt": "z"}))
        assert (await critical)[0] == 200
        assert (await default)[0] == 200
        assert all(r[0] == 200 for r in await asyncio.gather(*load))
        assert 'llmplane_gateway_shed_total{model="batch"} 1.0' in gw.metrics.render().decode()
    finally:
        await gw.close()
