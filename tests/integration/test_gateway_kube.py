"""The in-cluster gateway (``llmplane gateway --kubernetes``) against a Kubernetes API EMULATOR.

The endpoint picker (``llmplane epp --kubernetes``, the chart's other mode) is run once the
same way, behind a real Envoy.

No Kubernetes API server can run here, so the API is ``llmplane.testing.kube_emulator.KubeEmulator``,
an in-process aiohttp emulator of the REST endpoints used (list/watch with resourceVersion,
label selectors, the status subresource). The gateway is the real one: ``KubeStore`` +
``PodDiscovery`` in-process, and once as the real ``python -m llmplane.gateway.cli
--kubernetes`` process reading a kubeconfig that points at the emulator.

Pods and ports: nothing runs pods, so each "pod" is a real simulated engine
(``python -m llmplane.sim``) listening on its own loopback address (``127.X.Y.2``, ``.3``,
``.4``; all of 127.0.0.0/8 is loopback on Linux) at port **8080**, the model-runner's container
port, exactly where discovery sends traffic (``podIP:8080``); the Pod objects carry those
podIPs. The test plays the kubelet by flipping the pods' Ready condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmplane import testing
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.pods import kubernetes_sources
from llmplane.gateway.server import Gateway, start_gateway
from llmplane.testing import Process, Processes, eventually, sim_process
from llmplane.testing.kube_emulator import KubeEmulator, pod
from tests.integration.kube_fleet import (
    BACKEND_LABEL,
    KTHENA,
    MODEL,
    MODEL_LABEL,
    free_loopback_prefix,
    ip,
    model_server,
    openmodel,
    playground,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Process]]:
    """Three simulated engines serving ``llama`` at ``<ip>:8080``: name -> server."""
    prefix = free_loopback_prefix()
    with Processes() as group:
        names = ("a", "b", "c")
        started = group.start(
            *(
                sim_process(
                    MODEL, "--host", f"{prefix}.{host}", "--port", "8080", "--time-scale", "0"
                )
                for host in (2, 3, 4)
            )
        )
        yield dict(zip(names, started, strict=True))


def model_route(model_name: str, server: str) -> dict[str, Any]:
    return {
        "apiVersion": KTHENA,
        "kind": "ModelRoute",
        "metadata": {"name": model_name, "namespace": "default"},
        "spec": {
            "modelName": model_name,
            "rules": [{"name": "all", "targetModels": [{"modelServerName": server}]}],
        },
    }


def playground_pod(name: str, server: Process, ready: bool = True) -> dict[str, Any]:
    return pod(name, {MODEL_LABEL: MODEL, BACKEND_LABEL: "sim"}, ip(server), ready=ready)


async def chat(port: int, model: str) -> tuple[int, str | None, dict[str, Any]]:
    """(status, x-llmplane-endpoint, body) of one chat completion through the gateway."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=aiohttp.ClientTimeout(total=10),
        ) as resp,
    ):
        return resp.status, resp.headers.get("x-llmplane-endpoint"), await resp.json()


async def until(port: int, model: str, predicate: Any, timeout: float = 10.0) -> Any:
    """Send requests until one's (status, endpoint, body) satisfies ``predicate``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await chat(port, model)
        if predicate(*result):
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{model}: last answer {result}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def gateway_on(kube: KubeEmulator, **config: Any) -> AsyncIterator[Gateway]:
    store, discovery = await kubernetes_sources(None, kube.url)
    gateway = await start_gateway(store, discovery, config=GatewayConfig(**config))
    try:
        yield gateway
    finally:
        await gateway.close()
        await store.aclose()


async def test_playground_pod_is_routable_by_model_name_and_dropped_when_not_ready(
    engines: dict[str, Process],
) -> None:
    a = engines["a"]
    async with KubeEmulator() as kube:
        await kube.create(openmodel(MODEL))
        await kube.create(playground(MODEL))
        await kube.create(playground_pod("llama-0", a))
        # Requests for a model without a ready pod are held this long by the activator.
        async with gateway_on(kube, activator_hold_timeout=0.2) as gateway:
            status, endpoint, body = await chat(gateway.port, MODEL)
            assert (status, endpoint) == (200, f"{ip(a)}:8080"), body
            assert body["choices"][0]["message"]["content"]
            [state] = gateway.registry.states.values()
            assert state.endpoint.engine == "sim" and state.endpoint.namespace == "default"

            # The kubelet marks the pod NotReady: it is dropped; the Playground's model now
            # answers 503 (starting / scaled to zero), not 404.
            await kube.set_pod_ready("llama-0", False)
            status, _, body = await until(gateway.port, MODEL, lambda s, e, b: s == 503)
            assert body["error"]["message"].startswith(f"model {MODEL!r} has no ready endpoint")
            assert gateway.registry.states == {}

            # Ready again: routable again.
            await kube.set_pod_ready("llama-0", True)
            await until(gateway.port, MODEL, lambda s, e, b: s == 200)

            # An unrelated ready pod in the namespace is never an endpoint: once a Playground
            # pod created after it is one, the gateway has seen both events.
            await kube.create(pod("web", {"app": "web"}, ip(engines["c"])))
            await kube.create(playground_pod("llama-1", engines["b"]))
            await eventually(
                lambda: f"{ip(engines['b'])}:8080" in gateway.registry.states,
                what="the later pod discovered",
            )
            assert set(gateway.registry.states) == {f"{ip(a)}:8080", f"{ip(engines['b'])}:8080"}


async def test_model_server_selects_only_matching_pods_and_new_routes_are_followed(
    engines: dict[str, Process],
) -> None:
    a, b, c = engines["a"], engines["b"], engines["c"]
    async with KubeEmulator() as kube:
        await kube.create(pod("llama-stable", {"app": "llama", "track": "stable"}, ip(a)))
        await kube.create(pod("llama-canary", {"app": "llama", "track": "canary"}, ip(b)))
        await kube.create(pod("other", {"app": "other"}, ip(c)))
        await kube.create(model_server("stable", {"app": "llama", "track": "stable"}))
        async with gateway_on(kube) as gateway:
            # Only the pod the ModelServer selects is discovered (the others match no route).
            assert set(gateway.registry.states) == {f"{ip(a)}:8080"}
            status, _, _ = await chat(gateway.port, "chat")
            assert status == 404

            # A ModelRoute created through the API is followed live.
            await kube.create(model_route("chat", "stable"))
            await until(gateway.port, "chat", lambda s, e, b: s == 200)
            endpoints = {(await chat(gateway.port, "chat"))[1] for _ in range(12)}
            assert endpoints == {f"{ip(a)}:8080"}

            # A second ModelServer on all app=llama pods, with workloadPort 8080 (the pods'
            # port): the route moves to it and spreads over both llama pods, never "other".
            await kube.create(
                model_server("all-llama", {"app": "llama"}, workloadPort={"port": 8080})
            )
            await kube.patch(
                KTHENA,
                "ModelRoute",
                "chat",
                "default",
                {
                    "spec": {
                        "rules": [
                            {"name": "all", "targetModels": [{"modelServerName": "all-llama"}]}
                        ]
                    }
                },
            )
            seen: set[str | None] = set()
            deadline = asyncio.get_running_loop().time() + 10
            while seen != {f"{ip(a)}:8080", f"{ip(b)}:8080"}:
                status, endpoint, body = await chat(gateway.port, "chat")
                assert status == 200, body
                seen.add(endpoint)
                assert asyncio.get_running_loop().time() < deadline, seen
            assert f"{ip(c)}:8080" not in gateway.registry.states

            # Deleting the route: the name is unknown again.
            await kube.delete(KTHENA, "ModelRoute", "chat", "default")
            await until(gateway.port, "chat", lambda s, e, b: s == 404)


async def test_the_gateway_process_with_kubernetes_flag(
    engines: dict[str, Process], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m llmplane.gateway.cli --kubernetes`` as the chart runs it, configured by a
    kubeconfig (no in-cluster service account here)."""
    a = engines["a"]
    async with KubeEmulator() as kube:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            f"""apiVersion: v1
kind: Config
clusters: [{{name: emulator, cluster: {{server: "{kube.url}"}}}}]
users: [{{name: tester, user: {{token: not-checked}}}}]
contexts: [{{name: emulator, context: {{cluster: emulator, user: tester}}}}]
current-context: emulator
"""
        )
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        await kube.create(openmodel(MODEL))
        await kube.create(playground(MODEL))
        await kube.create(playground_pod("llama-0", a))
        process = testing.gateway("--kubernetes", "--namespace", "default", "--no-access-log")
        await asyncio.to_thread(process.start)
        try:
            port = process.port
            status, endpoint, body = await chat(port, MODEL)
            assert (status, endpoint) == (200, f"{ip(a)}:8080"), body
            await kube.create(model_server("stable", {MODEL_LABEL: MODEL}))
            await kube.create(model_route("chat", "stable"))
            await until(port, "chat", lambda s, e, b: s == 200 and e == f"{ip(a)}:8080")
        finally:
            await asyncio.to_thread(process.stop)
        assert process.proc.returncode == 0
        # it read through the namespaced paths (and OpenModels cluster-wide)
        paths = {p for _, p in kube.requests}
        assert "/api/v1/namespaces/default/pods" in paths
        assert "/apis/llmaz.io/v1alpha1/openmodels" in paths


async def test_the_endpoint_picker_process_with_kubernetes_flag(
    engines: dict[str, Process], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``llmplane epp --kubernetes`` (the chart's endpoint-picker mode) behind a real Envoy:
    the InferencePool / InferenceModel and the Pod come from the API, as for the gateway."""
    from llmplane.epp.envoy import bootstrap
    from llmplane.testing.envoy import Envoy

    a = engines["a"]
    async with KubeEmulator() as kube:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            f"""apiVersion: v1
kind: Config
clusters: [{{name: emulator, cluster: {{server: "{kube.url}"}}}}]
users: [{{name: tester, user: {{token: not-checked}}}}]
contexts: [{{name: emulator, context: {{cluster: emulator, user: tester}}}}]
current-context: emulator
"""
        )
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        gie = "inference.networking.x-k8s.io/v1alpha2"
        await kube.create(pod("llama-0", {"app": "llama"}, ip(a)))
        await kube.create(
            {
                "apiVersion": gie,
                "kind": "InferencePool",
                "metadata": {"name": "llama", "namespace": "default"},
                "spec": {
                    "selector": {"app": "llama"},
                    "targetPortNumber": 8080,
                    "extensionRef": {"name": "llmplane-gateway", "failureMode": "FailClose"},
                },
            }
        )
        await kube.create(
            {
                "apiVersion": gie,
                "kind": "InferenceModel",
                "metadata": {"name": "chatbot", "namespace": "default"},
                "spec": {
                    "modelName": "chatbot",
                    "poolRef": {"name": "llama"},
                    "targetModels": [{"name": MODEL}],
                },
            }
        )
        picker = testing.python(
            "-m", "llmplane.cli", "epp", "--kubernetes", "--namespace", "default", "--port", "0",
            "--no-access-log",
        )  # fmt: skip
        envoy: Envoy | None = None
        try:
            await asyncio.to_thread(picker.start)
            envoy = Envoy(
                bootstrap(
                    listen="127.0.0.1:0",
                    picker=picker.address,
                    pool=[f"{ip(a)}:8080"],
                    fail_open=False,
                )
            )
            await asyncio.to_thread(envoy.start)
            await until(envoy.port, "chatbot", lambda s, e, b: s == 200 and e == f"{ip(a)}:8080")
        finally:
            if envoy is not None:
                await asyncio.to_thread(envoy.stop)
            await asyncio.to_thread(picker.stop)
        assert picker.returncode == 0, picker.output()


async def test_v1_and_v1alpha2_pools_and_llm_d_kinds_from_their_own_crds(
    engines: dict[str, Process],
) -> None:
    """A v1 pool (inference.networking.k8s.io) and a v1alpha2 pool (the x-k8s.io CRD), each
    reached by an InferenceModelRewrite (llm-d.ai); an InferenceObjective's priority."""
    new, old = ip(engines["a"]), ip(engines["b"])
    llmd = "llm-d.ai/v1alpha2"

    def rewrite(name: str, pool: str) -> dict[str, Any]:
        return {
            "apiVersion": llmd,
            "kind": "InferenceModelRewrite",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "poolRef": {"name": pool},
                "rules": [
                    {"matches": [{"model": {"value": name}}], "targets": [{"modelRewrite": MODEL}]}
                ],
            },
        }

    async with KubeEmulator() as kube:
        await kube.create(pod("new-0", {"pool": "new"}, new))
        await kube.create(pod("old-0", {"pool": "old"}, old))
        await kube.create(
            {
                "apiVersion": "inference.networking.k8s.io/v1",
                "kind": "InferencePool",
                "metadata": {"name": "new", "namespace": "default"},
                "spec": {
                    "selector": {"matchLabels": {"pool": "new"}},
                    "targetPorts": [{"number": 8080}],
                },
            }
        )
        await kube.create(
            {
                "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
                "kind": "InferencePool",
                "metadata": {"name": "old", "namespace": "default"},
                "spec": {
                    "selector": {"pool": "old"},
                    "targetPortNumber": 8080,
                    "extensionRef": {"name": "epp"},
                },
            }
        )
        await kube.create(rewrite("to-new", "new"))
        await kube.create(rewrite("to-old", "old"))
        await kube.create(
            {
                "apiVersion": llmd,
                "kind": "InferenceObjective",
                "metadata": {"name": "urgent", "namespace": "default"},
                "spec": {"priority": 5, "poolRef": {"name": "new"}},
            }
        )
        async with gateway_on(kube) as gateway:
            await until(gateway.port, "to-new", lambda s, e, b: (s, e) == (200, f"{new}:8080"))
            await until(gateway.port, "to-old", lambda s, e, b: (s, e) == (200, f"{old}:8080"))
            headers = {"x-llm-d-inference-objective": "urgent"}
            assert gateway.table.resolve("to-new", "/v1/completions", headers).priority == 5


if sys.platform != "linux":  # pragma: no cover
    pytestmark = [pytestmark, pytest.mark.skip(reason="needs 127.0.0.0/8 loopback (Linux)")]
