"""In-cluster autoscaling: the real operator (kopf, its autoscaler) and the real in-cluster
gateway (``KubeStore`` + ``PodDiscovery`` + activator) against a Kubernetes API EMULATOR, not a
Kubernetes API server (``llmplane.testing.kube_emulator``; see tests/integration/
test_operator_emulator.py for why no real one). Short intervals and windows are configured,
so the rules are the production ones on a faster clock.

Nothing runs pods here, so the test plays the LeaderWorkerSet controller and the kubelet
(``FakeLws``): for every replica the LeaderWorkerSet asks for it creates a Ready leader Pod
whose podIP is a real simulated engine (``python -m llmplane.sim``) listening on its own
loopback address at port 8080, where discovery sends traffic; replicas it no longer asks for
lose their Pod.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from llmplane.testing import Process, Processes, eventually, keeps, sim_process
from llmplane.testing.kube_emulator import KubeEmulator
from tests.integration.kube_fleet import free_loopback_prefix
from tests.integration.operator_cluster import LWS, MODEL, SVC, cluster, openmodel

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def engines() -> Iterator[list[Process]]:
    """Three slowed simulated engines serving ``opt-125m`` at ``<ip>:8080`` (time scale 5:
    about 2 s per 60-token completion, so requests stay in flight)."""
    prefix = free_loopback_prefix()
    with Processes() as group:
        yield group.start(
            *(
                sim_process(
                    MODEL, "--host", f"{prefix}.{host}", "--port", "8080", "--time-scale", "5"
                )
                for host in (2, 3, 4)
            )
        )


def playground(replicas: int, elastic: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": SVC,
        "kind": "Playground",
        "metadata": {"name": MODEL, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "modelClaim": {"modelName": MODEL},
            "elasticConfig": elastic,
        },
    }


class Load:
    """``clients`` tasks sending 60-token completions back to back through the gateway."""

    def __init__(self, port: int, clients: int) -> None:
        self.url = f"http://127.0.0.1:{port}/v1/completions"
        self.statuses: list[int] = []
        self.stopping = False
        self.tasks = [asyncio.create_task(self._loop()) for _ in range(clients)]

    async def _loop(self) -> None:
        body = {"model": MODEL, "prompt": "hello there", "max_tokens": 60}
        async with aiohttp.ClientSession() as session:
            while not self.stopping:
                async with session.post(self.url, json=body) as resp:
                    await resp.read()
                    self.statuses.append(resp.status)

    async def stop(self) -> None:
        self.stopping = True
        await asyncio.gather(*self.tasks)


def rescale_events(kube: KubeEmulator) -> list[str]:
    """The Playground's SuccessfulRescale Event messages, oldest first."""
    events = [
        e
        for e in kube.list("v1", "Event")
        if e.get("reason") == "SuccessfulRescale" and e["involvedObject"]["name"] == MODEL
    ]
    events.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [e["message"] for e in events]


async def test_blog_example_scales_in_cluster_on_the_default_trigger(
    engines: list[Process],
) -> None:
    """llmaz's blog: ``elasticConfig: {minReplicas: 1, maxReplicas: 3}`` and no scaleTrigger
    (the vllm BackendRuntime names none). No HPA can read the default trigger, so none is
    rendered; the operator scales the Playground through its scale subresource on the
    gateway's in-flight counts, up to maxReplicas and never above."""
    async with cluster(engines) as (kube, gateway, lws):
        await kube.create(openmodel())
        await kube.create(playground(1, {"minReplicas": 1, "maxReplicas": 3}))
        await eventually(lambda: lws.pods() == 1, 30, what="the first replica's pod")
        await eventually(
            lambda: len(gateway.registry.states) == 1, 30, what="the gateway routes to it"
        )
        await keeps(lambda: lws.replicas() == 1, 1.0, what="idle: stays at 1")
        assert kube.get("autoscaling/v2", "HorizontalPodAutoscaler", MODEL, "default") is None

        load = Load(gateway.port, clients=30)  # ~30 in flight against 8 per replica
        try:
            await eventually(lambda: lws.replicas() == 3, 60, what="up to maxReplicas")
            await eventually(lambda: lws.pods() == 3, 30, what="three pods")
            await eventually(lambda: len(gateway.registry.states) == 3, 30, what="routing to three")
            await keeps(lambda: lws.replicas() == 3, 1.0, what="stays at maxReplicas")
        finally:
            await load.stop()
        assert lws.highest == 3  # never above maxReplicas
        assert set(load.statuses) == {200}, load.statuses
        # The chain: Playground scale -> Service replicas -> LeaderWorkerSet replicas.
        svc = kube.get(SVC, "Service", MODEL, "default")
        assert svc["spec"]["replicas"] == 3
        events = rescale_events(kube)
        assert events and events[-1].startswith("New size: 3;"), events
        assert "llmplane_gateway_endpoint_inflight" in events[-1]  # it says why


async def test_idle_scales_to_zero_and_a_request_brings_a_replica_back(
    engines: list[Process],
) -> None:
    """``minReplicas: 0``: idle past ``scaleToZeroAfterSeconds``, the operator stops the last
    replica; the next request is held by the gateway's activator, answered once a replica is
    ready, and counted as held."""
    elastic = {
        "minReplicas": 0,
        "maxReplicas": 2,
        "scaleToZeroAfterSeconds": 2,
        "scaleTrigger": {"hpa": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 1}}}},
    }
    async with cluster(engines, activator_hold_timeout=60) as (kube, gateway, lws):
        await kube.create(openmodel())
        await kube.create(playground(1, elastic))
        await eventually(lambda: lws.pods() == 1, 30, what="the first replica's pod")
        assert kube.get("autoscaling/v2", "HorizontalPodAutoscaler", MODEL, "default") is None
        await eventually(lambda: lws.replicas() == 0, 30, what="scaled to zero once idle")
        await eventually(lambda: lws.pods() == 0, 30, what="the pod gone")
        await eventually(lambda: not gateway.registry.states, 30, what="no endpoint left")
        assert any("scale to zero" in e for e in rescale_events(kube)), rescale_events(kube)

        async with aiohttp.ClientSession() as session:
            body = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
            url = f"http://127.0.0.1:{gateway.port}/v1/completions"
            async with session.post(url, json=body) as resp:
                assert resp.status == 200, await resp.text()
        assert lws.replicas() >= 1
        held = gateway.activator.metrics.held.labels(MODEL)
        assert held.value >= 1


async def test_gateway_asks_the_api_for_the_first_replica(engines: list[Process]) -> None:
    """With the operator's autoscaler off, only the gateway can scale from zero: a held request
    writes the Playground's scale subresource (0 -> max(1, minReplicas)) and is answered."""
    async with cluster(engines, autoscale=False, activator_hold_timeout=60) as (
        kube,
        gateway,
        lws,
    ):
        await kube.create(openmodel())
        await kube.create(playground(0, {"minReplicas": 0, "maxReplicas": 2}))
        await eventually(
            lambda: kube.get(LWS, "LeaderWorkerSet", MODEL, "default"), 30, what="the LWS"
        )
        await keeps(lambda: lws.replicas() == 0, 0.5, what="no replica before a request")
        async with aiohttp.ClientSession() as session:
            body = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
            url = f"http://127.0.0.1:{gateway.port}/v1/completions"
            async with session.post(url, json=body) as resp:
                assert resp.status == 200, await resp.text()
        assert lws.replicas() == 1
        assert gateway.activator.metrics.held.labels(MODEL).value == 1


async def test_scale_from_zero_writes_only_elastic_playgrounds_at_zero() -> None:
    """``KubeScaleFromZero`` against the emulator: 0 -> max(1, minReplicas) (clamped to
    maxReplicas) for an elastic Playground at zero; a fixed ``replicas: 0`` stays as written;
    a Playground changed since the gateway's cache read it is read again, not overwritten."""
    from llmplane.gateway.kube_activation import KubeScaleFromZero
    from llmplane.store.kube import KubeStore

    def pg(name: str, replicas: int, elastic: dict[str, Any] | None) -> dict[str, Any]:
        obj = playground(replicas, elastic or {})
        obj["metadata"]["name"] = name
        if elastic is None:
            del obj["spec"]["elasticConfig"]
        return obj

    async with KubeEmulator() as kube:
        await kube.create(pg("warm", 0, {"minReplicas": 2, "maxReplicas": 3}))
        await kube.create(pg("fixed", 0, None))
        stale = await kube.create(pg("raced", 0, {"minReplicas": 0, "maxReplicas": 1}))
        store = await KubeStore.connect(None, kube.url)
        try:
            scaler = KubeScaleFromZero(store.api, store)
            for name in ("warm", "fixed"):
                scaler.wake(f"default/{name}")
            await asyncio.gather(*scaler._pending.values())
            assert kube.get(SVC, "Playground", "warm", "default")["spec"]["replicas"] == 2
            assert kube.get(SVC, "Playground", "fixed", "default")["spec"]["replicas"] == 0

            # Someone scaled "raced" to 0 -> 1 -> 0 again since the cache's copy: the write with
            # the old resourceVersion conflicts, the fresh read shows 0, the retry writes 1.
            await kube.patch(SVC, "Playground", "raced", "default", {"spec": {"replicas": 1}})
            await kube.patch(SVC, "Playground", "raced", "default", {"spec": {"replicas": 0}})

            class StaleCache:
                def get(self, *_: Any) -> dict[str, Any]:
                    return stale

            raced = KubeScaleFromZero(store.api, StaleCache())  # type: ignore[arg-type]
            raced.wake("default/raced")
            await asyncio.gather(*raced._pending.values())
            after = kube.get(SVC, "Playground", "raced", "default")
            assert after["spec"]["replicas"] == 1
            # Two scale writes: the stale one (409 Conflict, nothing changed) and the retry.
            assert [m for m, p in kube.requests if p.endswith("/raced/scale")] == ["PATCH", "PATCH"]
        finally:
            await store.aclose()
