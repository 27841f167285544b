"""Disaggregated Playgrounds (spec.llmplane.disaggregation): validation, role Services, status."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmplane.controlplane.disaggregation import gateway_mode, roles_status, services_for
from llmplane.controlplane.plan import PD_GROUP_LABEL, ROLE_LABEL
from llmplane.controlplane.planning import Inputs, plan_service, service_for_playground
from tests.unit.apihelpers import assert_error, errors_of
from tests.unit.planning_inputs import backend, locate, model, playground


def disaggregated(**dis: Any) -> dict[str, Any]:
    return {"llmplane": {"disaggregation": dis}}


def pg_doc(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Playground",
        "metadata": {"name": "pg"},
        "spec": {"modelClaim": {"modelName": "m"}, **spec},
    }


def test_a_valid_declaration_is_accepted() -> None:
    spec = disaggregated(
        kvConnector={"type": "sharedStorage"},
        prefill={"replicas": 2, "args": ["--max-num-batched-tokens", "8192"]},
        decode={"replicas": 4, "elasticConfig": {"minReplicas": 1, "maxReplicas": 8}},
    )
    assert errors_of(pg_doc(spec)) == []


def test_a_long_name_leaves_room_for_the_role_suffix() -> None:
    doc = pg_doc(disaggregated())
    doc["metadata"]["name"] = "p" * 56
    assert_error(doc, "metadata.name", "at most 55 characters")
    doc["metadata"]["name"] = "p" * 55
    assert errors_of(doc) == []


@pytest.mark.parametrize(
    "extra",
    [{"k" * 129: 1}, {"path": "x" * 4097}, {f"k{i}": i for i in range(33)}, {"k": [1]}, {"": 1}],
)
def test_extra_config_is_bounded(extra: dict[str, Any]) -> None:
    doc = pg_doc(disaggregated(kvConnector={"type": "offloading", "extraConfig": extra}))
    assert any("extraConfig" in m for m in errors_of(doc)), errors_of(doc)


@pytest.mark.parametrize(
    ("spec", "path", "fragment"),
    [
        ({"replicas": 3, **disaggregated()}, "spec.replicas", "each role has its own replicas"),
        (
            {"elasticConfig": {"minReplicas": 1}, **disaggregated()},
            "spec.elasticConfig",
            "each role has its own elasticConfig",
        ),
        (
            disaggregated(prefill={"elasticConfig": {"minReplicas": 0, "maxReplicas": 2}}),
            "spec.llmplane.disaggregation.prefill.elasticConfig.minReplicas",
            "scale to zero applies to the pair",
        ),
        (
            disaggregated(kvConnector={"type": "carrier-pigeon"}),
            "spec.llmplane.disaggregation.kvConnector.type",
            "",
        ),
        (
            disaggregated(prefill={"replicas": -1}),
            "spec.llmplane.disaggregation.prefill.replicas",
            "",
        ),
        (
            disaggregated(router={"replicas": 1}),
            "spec.llmplane.disaggregation.router",
            "unknown field",
        ),
    ],
)
def test_mistakes_are_reported_at_their_field(
    spec: dict[str, Any], path: str, fragment: str
) -> None:
    assert_error(pg_doc(spec), path, fragment)


def role_services(backend_name: str = "vllm", **dis: Any) -> dict[str, Any]:
    pg = playground(
        **disaggregated(**dis),
        backendRuntimeConfig={"backendName": backend_name, "args": ["--seed", "1"]},
    )
    models = {"llama3-8b": model()}
    be = backend(backend_name)
    services = services_for(
        pg, lambda p: service_for_playground(Inputs(p, models, be), locate), "/kv/pg"
    )
    return {s.name: plan_service(s, models, be, locate) for s in services}


def test_roles_become_two_labelled_workloads_with_the_connector() -> None:
    plans = role_services(
        prefill={"replicas": 2, "args": ["--max-num-batched-tokens", "8192"]},
        decode={"replicas": 3, "resources": {"limits": {"cpu": "8"}}},
    )
    assert set(plans) == {"pg-prefill", "pg-decode"}
    prefill, decode = plans["pg-prefill"], plans["pg-decode"]
    assert (prefill.replicas, decode.replicas) == (2, 3)
    assert prefill.labels[ROLE_LABEL] == "prefill" and decode.labels[ROLE_LABEL] == "decode"
    assert prefill.labels[PD_GROUP_LABEL] == decode.labels[PD_GROUP_LABEL] == "pg"
    assert prefill.model_name == decode.model_name == "llama3-8b"
    # Role args after the Playground's, the connector last; decode's resources its own.
    assert prefill.args[-5:-2] == ["1", "--max-num-batched-tokens", "8192"]
    assert "--max-num-batched-tokens" not in decode.args
    assert decode.resources["limits"]["cpu"] == "8" and prefill.resources["limits"]["cpu"] != "8"
    for plan in plans.values():
        flag = plan.args.index("--kv-transfer-config")
        config = orjson.loads(plan.args[flag + 1])
        assert config == {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": "/kv/pg"},
        }


@pytest.mark.parametrize(
    ("connector", "name", "prefill_role", "mode"),
    [
        ("nixl", "NixlConnector", "kv_both", "nixl"),
        ("mooncake", "MooncakeConnector", "kv_producer", "mooncake"),
        ("lmcache", "LMCacheConnectorV1", "kv_both", "lmcache"),
        ("offloading", "OffloadingConnector", "kv_both", "http"),
    ],
)
def test_each_vllm_connector(connector: str, name: str, prefill_role: str, mode: str) -> None:
    plans = role_services(kvConnector={"type": connector, "extraConfig": {"num_cpu_blocks": 64}})
    prefill = plans["pg-prefill"]
    config = orjson.loads(prefill.args[prefill.args.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == name and config["kv_role"] == prefill_role
    assert config["kv_connector_extra_config"] == {"num_cpu_blocks": 64}
    if connector == "nixl":
        assert prefill.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    from llmplane.api.inference import KVConnector

    assert gateway_mode("vllm", KVConnector(type=connector)) == mode


def test_the_sim_and_sglang_get_their_own_role_flags() -> None:
    sim = role_services("sim")
    assert sim["pg-prefill"].args[-2:] == ["--role", "prefill"]
    assert sim["pg-decode"].args[-2:] == ["--role", "decode"]
    sglang = role_services("sglang", kvConnector={"type": "mooncake"})
    assert sglang["pg-decode"].args[-4:] == [
        "--disaggregation-mode",
        "decode",
        "--disaggregation-transfer-backend",
        "mooncake",
    ]


def svc(available: bool, message: str = "", reason: str = "ServiceNotReady") -> dict[str, Any]:
    condition = {
        "type": "Available",
        "status": "True" if available else "False",
        "reason": "ServiceReady" if available else reason,
        "message": message,
    }
    return {"status": {"conditions": [condition], "replicas": 1, "readyReplicas": int(available)}}


def test_status_names_the_role_that_is_not_ready() -> None:
    status = roles_status(
        None, 1, {"prefill": svc(True), "decode": svc(False, "0/1 replicas ready")}
    )
    available = next(c for c in status["conditions"] if c["type"] == "Available")
    assert available["status"] == "False"
    assert available["message"] == "decode not ready: 0/1 replicas ready"
    assert (status["replicas"], status["readyReplicas"]) == (2, 1)
    failing = roles_status(
        None, 1, {"prefill": svc(False, "exit 1", "CrashLoopBackOff"), "decode": svc(True)}
    )
    available = next(c for c in failing["conditions"] if c["type"] == "Available")
    assert available["reason"] == "CrashLoopBackOff" and available["message"].startswith("prefill")
    ready = roles_status(None, 1, {"prefill": svc(True), "decode": svc(True)})
    assert next(c for c in ready["conditions"] if c["type"] == "Available")["status"] == "True"
