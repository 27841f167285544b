"""The Endpoint kind: external model servers registered for routing."""

from __future__ import annotations

from typing import Any

import pytest

from llmplane.api.documents import dump_resource, parse_document
from llmplane.gateway.discovery.store_endpoints import endpoint_from_object
from tests.unit.apihelpers import assert_error, errors_of


def endpoint(**spec: Any) -> dict[str, Any]:
    body = {"address": "10.0.0.5:8000", "modelName": "llama"}
    body.update(spec)
    return {
        "apiVersion": "llmplane.io/v1alpha1",
        "kind": "Endpoint",
        "metadata": {"name": "e"},
        "spec": body,
    }


def test_defaults_and_gateway_view() -> None:
    resource, _ = parse_document(endpoint(labels={"app": "x"}))
    data = dump_resource(resource)
    assert data["spec"]["engine"] == "vllm" and data["spec"]["fixedPort"] is True
    assert data["metadata"]["namespace"] == "default"
    ep = endpoint_from_object(data)
    assert ep is not None and ep.address == "10.0.0.5:8000" and ep.labels == {"app": "x"}


@pytest.mark.parametrize("address", ["10.0.0.5:8000", "gpu-box", "[::1]:8000", "http://host:1"])
def test_valid_addresses(address: str) -> None:
    assert errors_of(endpoint(address=address)) == []


@pytest.mark.parametrize(
    ("address", "fragment"), [("a b:1", "host:port"), ("host:70000", "between 1 and 65535")]
)
def test_invalid_addresses(address: str, fragment: str) -> None:
    assert_error(endpoint(address=address), "spec.address", fragment)


def test_engine_enum_and_required_model() -> None:
    assert_error(endpoint(engine="VLLM"), "spec.engine", "'vllm'")
    doc = endpoint()
    del doc["spec"]["modelName"]
    assert_error(doc, "spec.modelName", "required")


def test_labels_are_checked() -> None:
    assert_error(endpoint(labels={"bad key": "x"}), "spec.labels['bad key']", "label key")


def test_scheduling_policy_reaches_the_gateway_view() -> None:
    for policy, expected in (("priority", True), ("fcfs", False), (None, False)):
        doc = endpoint() if policy is None else endpoint(schedulingPolicy=policy)
        resource, _ = parse_document(doc)
        ep = endpoint_from_object(dump_resource(resource))
        assert ep is not None and ep.priority_scheduling is expected, policy
    assert_error(endpoint(schedulingPolicy="lifo"), "spec.schedulingPolicy", "'fcfs'")
