"""Disaggregated Playgrounds on Kubernetes: one LeaderWorkerSet per role with role labels and
what each KV connector needs, valid against the real schemas (1.30-1.33)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmplane.controlplane.plan import PD_GROUP_LABEL, ROLE_LABEL
from llmplane.render import render_objects
from llmplane.runtime.kube import KubeOptions
from tests.unit.kube_objects import EXAMPLES, model_runner, render
from tests.unit.kube_schemas import validate


def _lws(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "LeaderWorkerSet"}


def test_vllm_example_renders_one_workload_per_role() -> None:
    objects = render_objects([str(EXAMPLES / "disaggregated-vllm.yaml")])
    for obj in objects:
        validate(obj)
    services = {
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "Service" and o["apiVersion"] == "inference.llmaz.io/v1alpha1"
    }
    assert services == {"qwen2-5-0-5b-prefill", "qwen2-5-0-5b-decode"}
    lws = _lws(objects)
    assert set(lws) == services
    for role in ("prefill", "decode"):
        spec = lws[f"qwen2-5-0-5b-{role}"]["spec"]
        assert spec["replicas"] == 1
        pod = spec["leaderWorkerTemplate"]["workerTemplate"]
        labels = pod["metadata"]["labels"]
        assert labels[ROLE_LABEL] == role and labels[PD_GROUP_LABEL] == "qwen2-5-0-5b"
        runner = model_runner(pod)
        config = orjson.loads(runner["args"][runner["args"].index("--kv-transfer-config") + 1])
        assert config["kv_connector_extra_config"]["shared_storage_path"] == "/workspace/kv"
        mount = next(m for m in runner["volumeMounts"] if m["mountPath"] == "/workspace/kv")
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
        assert volume["hostPath"]["path"] == "/var/lib/llmplane/kv/default/qwen2-5-0-5b"
    prefill = model_runner(
        lws["qwen2-5-0-5b-prefill"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    )
    assert "--max-num-batched-tokens" in prefill["args"]


PLAYGROUND = """
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {name: m}
spec: {familyName: f, source: {modelHub: {modelID: org/m}}}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {name: m}
spec:
  modelClaim: {modelName: m}
  llmplane:
    disaggregation:
      kvConnector: {type: CONNECTOR}
      prefill: {replicas: 2}
      decode: {replicas: 3}
"""


@pytest.mark.parametrize("connector", ["nixl", "lmcache", "mooncake", "offloading"])
def test_every_connector_renders_valid_workloads(connector: str) -> None:
    objects = render(PLAYGROUND.replace("CONNECTOR", connector))
    for obj in objects:
        validate(obj)
    lws = _lws(objects)
    assert {n: o["spec"]["replicas"] for n, o in lws.items()} == {"m-prefill": 2, "m-decode": 3}
    for obj in lws.values():
        runner = model_runner(obj["spec"]["leaderWorkerTemplate"]["workerTemplate"])
        ports = {p.get("name"): p["containerPort"] for p in runner.get("ports") or []}
        env = {e["name"]: e for e in runner.get("env") or []}
        if connector == "nixl":
            assert ports["nixl"] == 5600
            assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"] == {
                "fieldPath": "status.podIP"
            }
        else:
            assert "nixl" not in ports and "VLLM_NIXL_SIDE_CHANNEL_HOST" not in env


def test_sglang_prefill_pods_expose_the_bootstrap_port() -> None:
    doc = PLAYGROUND.replace("CONNECTOR", "mooncake").replace(
        "  modelClaim: {modelName: m}",
        "  modelClaim: {modelName: m}\n  backendRuntimeConfig: {backendName: sglang}",
    )
    objects = render(doc)
    for obj in objects:
        validate(obj)
    lws = _lws(objects)
    ports = {
        name: {
            p.get("name")
            for p in model_runner(o["spec"]["leaderWorkerTemplate"]["workerTemplate"]).get("ports")
            or []
        }
        for name, o in lws.items()
    }
    assert "bootstrap" in ports["m-prefill"] and "bootstrap" not in ports["m-decode"]
    prefill = model_runner(lws["m-prefill"]["spec"]["leaderWorkerTemplate"]["workerTemplate"])
    assert prefill["args"][-4:] == [
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-transfer-backend",
        "mooncake",
    ]


def test_deployment_mode_gives_one_deployment_per_role() -> None:
    objects = render(
        PLAYGROUND.replace("CONNECTOR", "nixl"), KubeOptions(use_leader_worker_set=False)
    )
    for obj in objects:
        validate(obj)
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    assert {n: d["spec"]["replicas"] for n, d in deployments.items()} == {
        "m-prefill": 2,
        "m-decode": 3,
    }
    for name, deployment in deployments.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels[ROLE_LABEL] == name.split("-")[1]
        assert labels[PD_GROUP_LABEL] == "m"
