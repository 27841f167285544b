"""Discovery adapters: the embedded runtime (duck-typed), store Endpoint objects, merging."""

from __future__ import annotations

from types import SimpleNamespace

from llmplane.gateway.discovery import (
    CombinedDiscovery,
    Endpoint,
    RuntimeDiscovery,
    StaticDiscovery,
)
from llmplane.gateway.discovery.store_endpoints import endpoint_from_object, endpoint_object


def test_runtime_discovery_passes_runtime_endpoints_on():
    own = Endpoint("127.0.0.1:4000", {"llmaz.io/model-name": "m"}, "m", fixed_port=True)
    runtime = SimpleNamespace(endpoints=lambda: [own])
    discovery = RuntimeDiscovery(runtime)
    calls = []
    discovery.subscribe(lambda: calls.append(1))
    assert discovery.endpoints() == [own]
    assert RuntimeDiscovery().endpoints() == []
    discovery.notify()
    assert calls == [1]


def test_endpoint_objects_and_ports():
    e = endpoint_from_object(
        endpoint_object("x", "10.0.0.1:8000", "m", labels={"a": "b"}, engine="SGLang")
    )
    assert (e.address, e.labels, e.engine, e.fixed_port) == (
        "10.0.0.1:8000",
        {"a": "b"},
        "sglang",
        True,
    )
    pod = endpoint_from_object(endpoint_object("x", "10.0.0.1:1", "m", fixed_port=False))
    assert pod.with_port(9000) == "10.0.0.1:9000" and pod.with_port(None) == "10.0.0.1:1"
    bare = endpoint_from_object(endpoint_object("x", "10.0.0.2", "m"))
    assert bare.with_port(9000) == "10.0.0.2:9000" and bare.with_port(None) == "10.0.0.2:8080"
    assert endpoint_from_object({"metadata": {"name": "x"}, "spec": {}}) is None


def test_combined_discovery_merges_and_forwards_changes():
    a = StaticDiscovery([Endpoint("h:1", model_name="a")])
    b = StaticDiscovery([Endpoint("h:1", model_name="dup"), Endpoint("h:2", model_name="b")])
    both = CombinedDiscovery(a, b)
    calls = []
    both.subscribe(lambda: calls.append(1))
    assert [e.model_name for e in both.endpoints()] == ["a", "b"]
    b.remove("h:2")
    assert calls == [1] and len(both.endpoints()) == 1
