"""``KubeRuntime`` (the ``Runtime`` on Kubernetes) against the Kubernetes API EMULATOR
(``llmplane.testing.kube_emulator.KubeEmulator``), not an API server: none can run here. The test
plays the LeaderWorkerSet controller and the kubelet by writing status.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmplane.api.documents import parse_paths
from llmplane.api.inference import BackendRuntime, Playground
from llmplane.api.llmaz import OpenModel
from llmplane.kube.client import KubeClient
from llmplane.render import builtin_backend_models
from llmplane.runtime.base import Runtime
from llmplane.runtime.kube import KubeOptions, KubeRuntime, playground_objects
from llmplane.testing.kube_emulator import KubeEmulator, pod

pytestmark = pytest.mark.timeout(60)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LWS = "leaderworkerset.x-k8s.io/v1"


def inputs() -> tuple[Playground, dict[str, OpenModel], BackendRuntime]:
    resources = parse_paths([EXAMPLES / "opt-125m.yaml"]).resources
    models = {r.name: r for r in resources if isinstance(r, OpenModel)}
    [pg] = [r for r in resources if isinstance(r, Playground)]
    backend = next(b for b in builtin_backend_models() if b.name == "vllm")
    return pg, models, backend


async def test_realise_observe_endpoints_remove() -> None:
    pg, models, backend = inputs()
    service, _ = playground_objects(pg, models, backend)
    async with KubeEmulator() as kube:
        client = await KubeClient.connect(kube.url)
        try:
            runtime = KubeRuntime(client, KubeOptions())
            assert isinstance(runtime, Runtime)
            plan = runtime.plan(service, models, backend)
            assert plan.key == "default/opt-125m"
            await runtime.realise(plan)
            lws = kube.get(LWS, "LeaderWorkerSet", "opt-125m", "default")
            assert lws["spec"]["startupPolicy"] == "LeaderReady"
            assert kube.get("v1", "Service", "opt-125m-lb", "default") is not None

            state = await runtime.observe(plan.key)
            assert not state.available and runtime.status(plan.key) == state
            assert runtime.endpoints() == []

            await kube.patch_status(
                LWS,
                "LeaderWorkerSet",
                "opt-125m",
                "default",
                {
                    "replicas": 1,
                    "readyReplicas": 1,
                    "hpaPodSelector": "leaderworkerset.sigs.k8s.io/name=opt-125m",
                    "conditions": [{"type": "Available", "status": "True", "reason": "Ready"}],
                },
            )
            labels = {
                "leaderworkerset.sigs.k8s.io/name": "opt-125m",
                "llmaz.io/model-name": "opt-125m",
                "inference.llmaz.io/backend-name": "vllm",
            }
            await kube.create(pod("opt-125m-0", labels, "10.0.0.7"))
            await kube.create(pod("opt-125m-1", labels, "10.0.0.8", ready=False))
            await kube.create(pod("other", {"llmaz.io/model-name": "x"}, "10.0.0.9"))

            state = await runtime.observe(plan.key)
            assert (state.available, state.replicas, state.ready) == (True, 1, 1)
            assert state.selector == "leaderworkerset.sigs.k8s.io/name=opt-125m"
            [endpoint] = runtime.endpoints({"llmaz.io/model-name": "opt-125m"})
            assert endpoint.address == "10.0.0.7:8080"
            assert (endpoint.workload, endpoint.model_name) == (plan.key, plan.model_name)
            assert runtime.endpoints({"llmaz.io/model-name": "x"}) == []

            await runtime.remove(plan.key)
            assert kube.get(LWS, "LeaderWorkerSet", "opt-125m", "default") is None
            assert kube.get("v1", "Service", "opt-125m-lb", "default") is None
            assert runtime.status(plan.key) is None and runtime.endpoints() == []
        finally:
            await client.close()


async def test_realise_needs_a_plan_of_its_own() -> None:
    pg, models, backend = inputs()
    service, _ = playground_objects(pg, models, backend)
    async with KubeEmulator() as kube:
        client = await KubeClient.connect(kube.url)
        try:
            runtime = KubeRuntime(client)
            plan = runtime.plan(service, models, backend)
            other = KubeRuntime(client)
            with pytest.raises(ValueError, match="plan made by this runtime"):
                await other.realise(plan)
            assert kube.get(LWS, "LeaderWorkerSet", "opt-125m", "default") is None
        finally:
            await client.close()
