"""``llmplane.gateway.discovery.pods.PodDiscovery`` against ``KubeEmulator`` (an in-process
Kubernetes API EMULATOR, not an API server; nothing runs the pods: the test plays the kubelet
by setting podIP and the Ready condition), plus its pure helpers."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from llmplane.gateway.discovery.pods import (
    PodDiscovery,
    engine_of,
    parse_namespaces,
    pod_address,
    pod_ready,
)
from llmplane.store.kube import KubeStore
from llmplane.testing import eventually
from llmplane.testing.kube_emulator import KubeEmulator, pod

pytestmark = pytest.mark.timeout(60)

KTHENA = "networking.serving.volcano.sh/v1alpha1"
GIE = "inference.networking.x-k8s.io/v1alpha2"
MODEL = "llmaz.io/model-name"
BACKEND = "inference.llmaz.io/backend-name"


def test_engine_of_backend_names() -> None:
    assert engine_of("vllm") == "vllm"
    assert engine_of("SGLang") == "sglang"
    assert engine_of("llama.cpp") == engine_of("llamacpp") == "llamacpp"
    assert engine_of("tgi") == "tgi"
    assert engine_of("sim") == "sim"
    assert engine_of("ollama") == "ollama"
    assert engine_of("vllm-openai-custom") == "vllm"
    assert engine_of("tensorrt-llm") == "tensorrt-llm"  # unknown: every metrics table is tried
    assert engine_of("") == engine_of(None) == "vllm"


def test_pod_ready_and_address() -> None:
    assert pod_ready(pod("p", {}, "10.0.0.1"))
    assert not pod_ready(pod("p", {}, "10.0.0.1", ready=False))
    assert not pod_ready(pod("p", {}, None))  # pending, no IP
    terminating = pod("p", {}, "10.0.0.1")
    terminating["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    assert not pod_ready(terminating)
    failed = pod("p", {}, "10.0.0.1")
    failed["status"]["phase"] = "Failed"
    assert not pod_ready(failed)
    assert pod_address("10.0.0.1", 8080) == "10.0.0.1:8080"
    assert pod_address("fd00::1", 8080) == "[fd00::1]:8080"


def test_parse_namespaces() -> None:
    assert parse_namespaces([]) is None
    assert parse_namespaces(["all"]) is None
    assert parse_namespaces(["a", "b,a"]) == ["a", "b"]
    assert parse_namespaces(["a", "all"]) is None


@contextlib.asynccontextmanager
async def discovering(
    kube: KubeEmulator, namespaces: list[str] | None = None
) -> AsyncIterator[PodDiscovery]:
    store = await KubeStore.connect(namespaces, server=kube.url)
    discovery = PodDiscovery(store.api, namespaces, store)
    try:
        await discovery.start()
        yield discovery
    finally:
        await discovery.close()
        await store.aclose()


def addresses(discovery: PodDiscovery) -> set[str]:
    return {e.address for e in discovery.endpoints()}


async def test_playground_pods_become_endpoints_while_ready() -> None:
    async with KubeEmulator() as kube:
        await kube.create(
            {
                "apiVersion": "llmaz.io/v1alpha1",
                "kind": "OpenModel",
                "metadata": {"name": "qwen"},
                "spec": {"familyName": "qwen", "source": {"uri": "ollama://qwen2:0.5b"}},
            }
        )
        await kube.create(pod("opt-0", {MODEL: "opt-125m", BACKEND: "sglang"}, "10.0.0.1"))
        await kube.create(pod("qwen-0", {MODEL: "qwen", BACKEND: "ollama"}, "10.0.0.2"))
        await kube.create(pod("web", {"app": "web"}, "10.0.0.9"))  # selected by nothing
        await kube.create(pod("opt-1", {MODEL: "opt-125m"}, None))  # not scheduled yet
        changes: list[int] = []
        async with discovering(kube) as discovery:
            discovery.subscribe(lambda: changes.append(1))
            by_address = {e.address: e for e in discovery.endpoints()}
            assert set(by_address) == {"10.0.0.1:8080", "10.0.0.2:8080"}
            opt = by_address["10.0.0.1:8080"]
            assert (opt.model_name, opt.engine, opt.backend, opt.namespace, opt.fixed_port) == (
                "opt-125m",
                "sglang",
                "sglang",
                "default",
                False,
            )
            assert opt.labels[MODEL] == "opt-125m"
            # an ollama:// OpenModel serves its tag; the label still names the Playground's model
            qwen = by_address["10.0.0.2:8080"]
            assert qwen.model_name == "qwen2:0.5b"
            assert qwen.served_names() == {"qwen2:0.5b", "qwen"}

            # the kubelet: opt-1 gets an IP and turns Ready; opt-0 turns NotReady
            await kube.set_pod_ready("opt-1", True, pod_ip="10.0.0.3")
            await eventually(lambda: "10.0.0.3:8080" in addresses(discovery))
            await kube.set_pod_ready("opt-0", False)
            await eventually(lambda: "10.0.0.1:8080" not in addresses(discovery))
            assert changes
            # deleted: gone
            await kube.delete("v1", "Pod", "qwen-0", "default")
            await eventually(lambda: addresses(discovery) == {"10.0.0.3:8080"})


async def test_routing_selectors_decide_which_other_pods_are_endpoints() -> None:
    async with KubeEmulator() as kube:
        await kube.create(pod("stable", {"app": "llama", "version": "stable"}, "10.0.0.1"))
        await kube.create(pod("canary", {"app": "llama", "version": "canary"}, "10.0.0.2"))
        await kube.create(
            pod("prefill", {"app": "pd", "role": "prefill"}, "10.0.0.3", namespace="team")
        )
        await kube.create(pod("gateway", {"app": "llmplane-gateway"}, "10.0.0.9"))
        async with discovering(kube) as discovery:
            assert discovery.endpoints() == []
            await kube.create(
                {
                    "apiVersion": KTHENA,
                    "kind": "ModelServer",
                    "metadata": {"name": "stable", "namespace": "default"},
                    "spec": {
                        "model": "llama",
                        "inferenceEngine": "vLLM",
                        "workloadSelector": {"matchLabels": {"version": "stable"}},
                    },
                }
            )
            await eventually(lambda: addresses(discovery) == {"10.0.0.1:8080"})
            [stable] = discovery.endpoints()
            assert (stable.model_name, stable.labels["version"]) == ("", "stable")
            # an InferencePool selector; only in its own namespace
            await kube.create(
                {
                    "apiVersion": GIE,
                    "kind": "InferencePool",
                    "metadata": {"name": "pd", "namespace": "team"},
                    "spec": {
                        "selector": {"app": "pd"},
                        "targetPortNumber": 8000,
                        "extensionRef": {"name": "epp"},
                    },
                }
            )
            await eventually(lambda: addresses(discovery) == {"10.0.0.1:8080", "10.0.0.3:8080"})
            prefill = next(e for e in discovery.endpoints() if e.namespace == "team")
            assert prefill.labels["role"] == "prefill"  # pdGroup role labels are just labels
            assert prefill.with_port(8000) == "10.0.0.3:8000"  # targetPortNumber replaces 8080
            await kube.delete(KTHENA, "ModelServer", "stable", "default")
            await eventually(lambda: addresses(discovery) == {"10.0.0.3:8080"})


async def test_namespaced_discovery_watches_only_its_namespaces() -> None:
    async with KubeEmulator() as kube:
        await kube.create(pod("a", {MODEL: "m"}, "10.0.0.1", namespace="team"))
        await kube.create(pod("b", {MODEL: "m"}, "10.0.0.2", namespace="other"))
        async with discovering(kube, ["team"]) as discovery:
            assert addresses(discovery) == {"10.0.0.1:8080"}
            assert discovery.endpoints()[0].namespace == "team"
            paths = {p for _, p in kube.requests}
            assert "/api/v1/namespaces/team/pods" in paths
            assert "/api/v1/pods" not in paths


async def test_a_pods_command_line_reaches_its_endpoint() -> None:
    """Concurrency, scheduling policy and KV events come from the engine container's args, so
    the pod cache keeps the containers' command lines (and nothing else of the spec)."""
    config = json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557"}
    )
    args = ["--max-num-seqs", "7", "--scheduling-policy", "priority", "--kv-events-config", config]
    engine = pod("opt-0", {MODEL: "opt-125m"}, "10.0.0.1")
    engine["spec"]["containers"][0].update(command=["vllm", "serve"], args=args)
    async with KubeEmulator() as kube:
        await kube.create(engine)
        async with discovering(kube) as discovery:
            [found] = discovery.endpoints()
            assert (found.max_num_seqs, found.priority_scheduling) == (7, True)
            assert found.kv_events == "tcp://10.0.0.1:5557"
            cached = next(iter(discovery.informers[0].objects.values()))
            assert set(cached["spec"]["containers"][0]) == {"command", "args"}
