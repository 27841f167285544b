"""The in-cluster control loop against the Kubernetes API emulator: the real operator and
in-cluster gateway, with the LeaderWorkerSet controller and the kubelet played (``FakeLws``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from llmplane.api.documents import dump_resource
from llmplane.gateway import kube_activation
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.pods import kubernetes_sources
from llmplane.gateway.server import Gateway, start_gateway
from llmplane.operator.autoscaler import AutoscaleOptions
from llmplane.operator.main import Operator
from llmplane.render import builtin_backend_models
from llmplane.runtime.kube import KubeOptions
from llmplane.testing import Process
from llmplane.testing.kube_emulator import KubeEmulator, pod
from tests.integration.kube_fleet import ip

SVC = "inference.llmaz.io/v1alpha1"


LWS = "leaderworkerset.x-k8s.io/v1"


MODEL = "opt-125m"


def openmodel() -> dict[str, Any]:
    """The llmaz blog's opt-125m OpenModel."""
    return {
        "apiVersion": "llmaz.io/v1alpha1",
        "kind": "OpenModel",
        "metadata": {"name": MODEL},
        "spec": {"familyName": "opt", "source": {"modelHub": {"modelID": "facebook/opt-125m"}}},
    }


class FakeLws:
    """The LeaderWorkerSet controller and the kubelet, played: one Ready leader Pod per
    replica of the ``opt-125m`` LeaderWorkerSet, on engine ``i``'s address. Records the
    highest replica count the Playground ever asked for."""

    def __init__(self, kube: KubeEmulator, engines: list[Process]) -> None:
        self.kube, self.engines = kube, engines
        self.highest = 0
        self.task = asyncio.create_task(self._run())

    def replicas(self) -> int:
        pg = self.kube.get(SVC, "Playground", MODEL, "default") or {}
        return int((pg.get("spec") or {}).get("replicas", -1))

    def pods(self) -> int:
        return len(
            [p for p in self.kube.list("v1", "Pod") if p["metadata"]["name"].startswith(MODEL)]
        )

    async def _run(self) -> None:
        while True:
            self.highest = max(self.highest, self.replicas())
            lws = self.kube.get(LWS, "LeaderWorkerSet", MODEL, "default")
            want = int((lws or {}).get("spec", {}).get("replicas", 0)) if lws else 0
            want = min(want, len(self.engines))
            for i in range(len(self.engines)):
                name = f"{MODEL}-{i}"
                exists = self.kube.get("v1", "Pod", name, "default") is not None
                if i < want and not exists:
                    labels = {
                        "llmaz.io/model-name": MODEL,
                        "inference.llmaz.io/backend-name": "vllm",
                        "leaderworkerset.sigs.k8s.io/name": MODEL,
                        "leaderworkerset.sigs.k8s.io/worker-index": "0",
                    }
                    await self.kube.create(pod(name, labels, ip(self.engines[i])))
                elif i >= want and exists:
                    await self.kube.delete("v1", "Pod", name, "default")
            await asyncio.sleep(0.05)  # a controller's resync, not a test wait

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def cluster(
    engines: list[Process], autoscale: bool = True, **config: Any
) -> AsyncIterator[tuple[KubeEmulator, Gateway, FakeLws]]:
    """Emulator + built-in BackendRuntimes + in-cluster gateway (scale from zero through the
    API) + operator whose autoscaler reads that gateway's signals + the played LWS controller."""
    async with KubeEmulator() as kube:
        for backend in builtin_backend_models():
            doc = dump_resource(backend)
            doc.pop("status", None)
            await kube.create(doc)
        store, discovery = await kubernetes_sources(None, kube.url)
        scaler = kube_activation.KubeScaleFromZero(store.api, store)
        gateway = await start_gateway(
            store, discovery, config=GatewayConfig(**config), wake=scaler.wake
        )
        options = AutoscaleOptions(
            enabled=autoscale,
            gateway_urls=(f"http://127.0.0.1:{gateway.port}",),
            gateway_selector=None,
            interval=0.2,
            window=1.0,
        )
        operator = Operator(KubeOptions(), server=kube.url, resync_seconds=3600, autoscale=options)
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(operator.run(stop_flag=stop, ready_flag=ready))
        lws = FakeLws(kube, engines)
        try:
            await asyncio.wait_for(ready.wait(), 20)
            yield kube, gateway, lws
        finally:
            await lws.close()
            stop.set()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 20)
            await scaler.close()
            await gateway.close()
            await store.aclose()
