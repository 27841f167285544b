"""Pure planning with llmaz's semantics: Playground + OpenModel + BackendRuntime -> Service -> plan."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmplane.api.documents import InvalidResources, parse_document
from llmplane.controlplane.plan import FLAVORS_ANNOTATION, MODEL_FAMILY_LABEL, MODEL_NAME_LABEL
from llmplane.controlplane.planning import (
    Inputs,
    PlanningError,
    claims_of,
    config_name,
    missing_inputs,
    plan_service,
    render,
    service_for_playground,
)
from llmplane.up import builtin_backends
from tests.unit.planning_inputs import backend, locate, model, playground


def service(pg: Any, *models: Any, be: Any = None) -> Any:
    models = models or (model(),)
    return service_for_playground(Inputs(pg, {m.name: m for m in models}, be or backend()), locate)


def container(svc: Any) -> dict[str, Any]:
    return svc.to_dict()["spec"]["workloadTemplate"]["workerTemplate"]["spec"]["containers"][0]


def test_default_config_renders_model_path_and_name() -> None:
    c = container(service(playground()))
    assert c["name"] == "model-runner"
    assert c["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert c["args"] == [
        "--model",
        "/models/llama3-8b",
        "--served-model-name",
        "llama3-8b",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
    ]
    assert c["image"] == "vllm/vllm-openai:v0.32.0"


def test_config_name_inference() -> None:
    assert config_name(playground(), claims_of(playground())) == "default"
    spec_claims = {"models": [{"name": "llama3-8b"}, {"name": "llama3-1b", "role": "draft"}]}
    pg = playground(modelClaim=None, modelClaims=spec_claims)
    assert config_name(pg, claims_of(pg)) == "speculative-decoding"
    pg = playground(backendRuntimeConfig={"configName": "model-parallelism"})
    assert config_name(pg, claims_of(pg)) == "model-parallelism"


@pytest.mark.parametrize("explicit", ["default", "model-parallelism"])
def test_an_explicit_config_name_wins_over_a_claimed_draft_model(explicit: str) -> None:
    claims = {"models": [{"name": "llama3-8b"}, {"name": "llama3-1b", "role": "draft"}]}
    pg = playground(
        modelClaim=None, modelClaims=claims, backendRuntimeConfig={"configName": explicit}
    )
    assert config_name(pg, claims_of(pg)) == explicit
    params = {"TP": "1", "PP": "2"} if explicit == "model-parallelism" else {}
    flavors = [{"name": "f", "params": params}] if params else None
    main = model(inferenceConfig={"flavors": flavors}) if flavors else model()
    args = container(service(pg, main, model("llama3-1b")))["args"]
    assert "--speculative-config" not in args, args


def test_speculative_decoding_renders_the_draft_path() -> None:
    claims = {"models": [{"name": "llama3-8b"}, {"name": "llama3-1b", "role": "draft"}]}
    pg = playground(modelClaim=None, modelClaims=claims)
    c = container(service(pg, model(), model("llama3-1b")))
    spec = orjson.loads(c["args"][c["args"].index("--speculative-config") + 1])
    assert spec == {
        "method": "draft_model",
        "model": "/models/llama3-1b",
        "num_speculative_tokens": 5,
    }


def test_playground_args_are_appended_and_rendered() -> None:
    c = container(
        service(
            playground(
                backendRuntimeConfig={"args": ["--max-model-len", "4096", "--x={{ .ModelName }}"]}
            )
        )
    )
    assert c["args"][-3:] == ["--max-model-len", "4096", "--x=llama3-8b"]
    assert c["args"][:2] == ["--model", "/models/llama3-8b"]


def test_envs_merge_playground_wins() -> None:
    pg = playground(
        backendRuntimeConfig={"envs": [{"name": "A", "value": "pg"}, {"name": "B", "value": "b"}]}
    )
    be = backend()
    be.spec.envs = parse_document(
        {
            "apiVersion": "inference.llmaz.io/v1alpha1",
            "kind": "BackendRuntime",
            "metadata": {"name": "x"},
            "spec": {
                "image": "i",
                "version": "v",
                "envs": [{"name": "A", "value": "backend"}, {"name": "C", "value": "c"}],
            },
        }
    )[0].spec.envs
    env = {e["name"]: e["value"] for e in container(service(pg, be=be))["env"]}
    assert env == {"A": "pg", "B": "b", "C": "c"}


def test_resources_overwrite_per_key_and_shm() -> None:
    pg = playground(
        backendRuntimeConfig={
            "resources": {"limits": {"memory": "32Gi"}},
            "sharedMemorySize": "4Gi",
        }
    )
    svc = service(pg)
    c = container(svc)
    assert c["resources"]["limits"] == {"cpu": 4, "memory": "32Gi"}
    assert c["resources"]["requests"] == {"cpu": 4, "memory": "8Gi"}
    pod = svc.to_dict()["spec"]["workloadTemplate"]["workerTemplate"]["spec"]
    assert pod["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}
    ]
    assert c["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]


def test_flavor_limits_overwrite_accelerators_and_params_render() -> None:
    flavors = {
        "flavors": [
            {
                "name": "a100",
                "limits": {"nvidia.com/gpu": 8},
                "params": {"TP": "8", "PP": "2"},
                "nodeSelector": {"gpu": "a100"},
            },
            {"name": "h100", "limits": {"nvidia.com/gpu": 4}, "nodeSelector": {"gpu": "h100"}},
        ]
    }
    m = model(inferenceConfig=flavors)
    pg = playground(
        backendRuntimeConfig={
            "configName": "model-parallelism",
            "resources": {"limits": {"nvidia.com/gpu": 1}},
        }
    )
    svc = service(pg, m)
    c = container(svc)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 8
    assert c["args"][-4:] == ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"]
    data = svc.to_dict()
    assert data["spec"]["workloadTemplate"]["size"] == 2
    assert data["metadata"]["annotations"][FLAVORS_ANNOTATION] == "a100,h100"
    plan = plan_service(svc, {m.name: m}, backend(), locate)
    assert plan.node_selectors == [{"gpu": "a100"}, {"gpu": "h100"}]
    assert plan.size == 2


def test_claimed_flavors_restrict_and_order() -> None:
    flavors = {
        "flavors": [
            {"name": "a", "limits": {"nvidia.com/gpu": 8}},
            {"name": "b", "limits": {"nvidia.com/gpu": 2}},
        ]
    }
    m = model(inferenceConfig=flavors)
    svc = service(playground(modelClaim={"modelName": "llama3-8b", "inferenceFlavors": ["b"]}), m)
    assert container(svc)["resources"]["limits"]["nvidia.com/gpu"] == 2
    with pytest.raises(PlanningError, match=r"inferenceFlavors \['z'\] not found"):
        service(playground(modelClaim={"modelName": "llama3-8b", "inferenceFlavors": ["z"]}), m)


def test_unknown_and_empty_template_variables_are_errors() -> None:
    with pytest.raises(PlanningError, match=r"unknown template variable \{\{ .Nope \}\}"):
        render(["{{ .Nope }}"], {"ModelPath": "/m"}, "here")
    with pytest.raises(PlanningError, match="is empty"):
        render(["{{.ModelPath}}"], {"ModelPath": ""}, "here")
    # model-parallelism without TP/PP params is an error, not a silent empty flag
    with pytest.raises(PlanningError, match="TP"):
        service(playground(backendRuntimeConfig={"configName": "model-parallelism"}))


def test_missing_model_waits_with_abort_processing() -> None:
    with pytest.raises(PlanningError, match="Waiting for model creation") as info:
        service_for_playground(Inputs(playground(), {}, backend()), locate)
    assert info.value.reason == "AbortProcessing"


def test_missing_inputs_names_what_is_missing() -> None:
    pg = playground()
    models = {"llama3-8b": model()}
    assert missing_inputs(pg, models, backend()) is None
    assert missing_inputs(pg, {}, backend()) == (
        "Waiting for model creation: OpenModel llama3-8b not found"
    )
    assert missing_inputs(pg, models, None) == "Waiting for BackendRuntime vllm"
    assert missing_inputs(pg, models, None, ["sim", "llamacpp"]) == (
        "Waiting for BackendRuntime vllm (known: llamacpp, sim)"
    )


def test_missing_recommended_config() -> None:
    with pytest.raises(PlanningError, match="no recommendedConfig named 'fast'"):
        service(playground(backendRuntimeConfig={"configName": "fast"}))


def test_labels_owner_and_same_name() -> None:
    svc = service(playground())
    data = svc.to_dict()
    assert data["metadata"]["name"] == "pg"
    labels = data["spec"]["workloadTemplate"]["workerTemplate"]["metadata"]["labels"]
    assert labels[MODEL_NAME_LABEL] == "llama3-8b"
    assert labels[MODEL_FAMILY_LABEL] == "llama3"
    owner = data["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Playground",
        "pg",
        "u1",
        True,
    )


def test_ollama_model_name_is_the_tag() -> None:
    m = model("qwen", source={"uri": "ollama://qwen2:0.5b"})
    svc = service(
        playground(
            modelClaim={"modelName": "qwen"}, backendRuntimeConfig={"backendName": "ollama"}
        ),
        m,
        be=backend("ollama"),
    )
    assert "ollama run qwen2:0.5b" in container(svc)["args"][0]


def test_plan_uses_local_command_probes_and_health_path() -> None:
    m = model()
    be = backend("llamacpp")
    svc = service(playground(backendRuntimeConfig={"backendName": "llamacpp"}), m, be=be)
    plan = plan_service(svc, {m.name: m}, be, locate, local_command=list(be.spec.local.command))
    assert plan.local is not None
    assert plan.local.argv[:3] == ["python", "-m", "llmplane.engines.llamacpp_server"]
    assert plan.local.argv[3:5] == ["-m", "/models/llama3-8b"]
    assert plan.readiness_probe is not None and plan.readiness_probe.path == "/health"
    assert plan.startup_probe.failure_threshold == 30 and plan.startup_probe.period_seconds == 10
    assert plan.liveness_probe.initial_delay_seconds == 15
    assert plan.model_name == "llama3-8b"
    assert plan.models[0].path == "/models/llama3-8b"


def test_template_hash_ignores_replicas_only() -> None:
    m = model()
    a = plan_service(service(playground(replicas=1)), {m.name: m}, backend(), locate)
    b = plan_service(service(playground(replicas=3)), {m.name: m}, backend(), locate)
    c = plan_service(
        service(playground(backendRuntimeConfig={"args": ["--x"]})), {m.name: m}, backend(), locate
    )
    assert a.template_hash() == b.template_hash() != c.template_hash()
    assert (a.replicas, b.replicas) == (1, 3)


def test_builtin_backends_cover_llmaz_engines() -> None:
    names = {d["metadata"]["name"] for d in builtin_backends()}
    assert {"vllm", "sglang", "llamacpp", "tgi", "ollama", "tensorrt-llm", "sim"} <= names
    sglang = backend("sglang")
    assert sglang.spec.readiness_probe.http_get.path == "/health_generate"
    vllm = backend("vllm")
    assert vllm.spec.startup_probe.failure_threshold == 30
    assert vllm.spec.liveness_probe.initial_delay_seconds == 15
    assert vllm.spec.readiness_probe.period_seconds == 5


def test_pipeline_parallel_flavor_infers_model_parallelism() -> None:
    # The blog's llama3-405b Playground names no configName; its flavor's PP=2 needs TP/PP args.
    flavors = {"flavors": [{"name": "a100", "params": {"TP": "8", "PP": "2"}}]}
    m = model(inferenceConfig=flavors)
    svc = service(playground(), m)
    assert container(svc)["args"][-4:] == [
        "--tensor-parallel-size",
        "8",
        "--pipeline-parallel-size",
        "2",
    ]
    assert svc.to_dict()["spec"]["workloadTemplate"]["size"] == 2
    # a backend without that config keeps default
    assert (
        "--tensor-parallel-size"
        not in container(service(playground(), m, be=backend("sglang")))["args"]
    )


def test_termination_grace_period_reaches_the_pod_template_and_the_plan() -> None:
    m = model()
    default = plan_service(service(playground()), {m.name: m}, backend(), locate)
    assert default.termination_grace_seconds == 30
    svc = service(playground(llmplane={"terminationGracePeriodSeconds": 3}))
    pod = svc.to_dict()["spec"]["workloadTemplate"]["workerTemplate"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 3  # (on Kubernetes: the pods' own)
    assert plan_service(svc, {m.name: m}, backend(), locate).termination_grace_seconds == 3
    with pytest.raises(InvalidResources, match="terminationGracePeriodSeconds"):
        playground(llmplane={"terminationGracePeriodSeconds": -1})
