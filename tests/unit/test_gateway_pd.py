"""Prefill/decode disaggregation: request bodies per connector and the routing table's PD
backend (no servers; the flows against real sims are in tests/integration/test_gateway_pd.py)."""

from __future__ import annotations

import copy

import orjson

from llmplane.gateway.discovery import Endpoint
from llmplane.gateway.pd import (
    decode_doc,
    host_of,
    kv_params_of,
    new_room,
    prefill_doc,
    with_bootstrap,
)
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.routing import PDBackend, build_table, mode_of

KTHENA = "networking.serving.volcano.sh/v1alpha1"

CLIENT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 64,
    "min_tokens": 8,
    "temperature": 0.2,
}


def test_prefill_body_is_one_unstreamed_token_and_leaves_the_client_body_alone():
    original = copy.deepcopy(CLIENT)
    body = prefill_doc(CLIENT, "http")
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "temperature": 0.2,
    }
    assert original == CLIENT  # the decode still gets the client's body


def test_prefill_body_caps_max_completion_tokens_only_when_given():
    assert prefill_doc({"model": "m", "max_completion_tokens": 50}, "http") == {
        "model": "m",
        "max_tokens": 1,
        "max_completion_tokens": 1,
    }
    assert "max_completion_tokens" not in prefill_doc({"model": "m"}, "http")
    assert prefill_doc({"model": "m"}, "lmcache") == {"model": "m", "max_tokens": 1}


def test_nixl_and_mooncake_prefill_asks_for_remote_decode():
    for mode in ("nixl", "mooncake"):
        body = prefill_doc({**CLIENT, "kv_transfer_params": {"x": 1}}, mode)
        assert body["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False}
        assert body["max_tokens"] == 1 and "stream" not in body
    assert "kv_transfer_params" not in prefill_doc(CLIENT, "sglang")


def test_decode_body_carries_the_prefill_params_verbatim():
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [3, 4, 5],
        "remote_engine_id": "e",
        "remote_host": "10.0.0.1",
        "remote_port": 8000,
        "tp_size": 1,
        "unknown_field": {"kept": True},
    }
    response = orjson.dumps({"id": "x", "choices": [], "kv_transfer_params": params})
    body = decode_doc(CLIENT, kv_params_of(response))
    assert body == {**CLIENT, "kv_transfer_params": params}
    assert body["stream"] is True and body["max_tokens"] == 64
    # No params from the prefill: the key is left out (the decode computes the prompt).
    assert kv_params_of(b'{"id": "x"}') is None
    assert kv_params_of(b"not json") is None
    assert kv_params_of(b"[1]") is None
    assert "kv_transfer_params" not in decode_doc({**CLIENT, "kv_transfer_params": 1}, None)


def test_sglang_bodies_share_a_room_and_name_the_prefill_host():
    room = new_room()
    assert 0 <= room < 2**63
    assert len({new_room() for _ in range(100)}) == 100
    host = host_of("10.1.2.3:30000")
    prefill = with_bootstrap(prefill_doc(CLIENT, "sglang"), host, room)
    decode = with_bootstrap(CLIENT, host, room)
    assert prefill["bootstrap_room"] == decode["bootstrap_room"] == room
    assert prefill["bootstrap_host"] == decode["bootstrap_host"] == "10.1.2.3"
    assert prefill["max_tokens"] == 1 and "stream" not in prefill
    assert decode == {**CLIENT, "bootstrap_host": "10.1.2.3", "bootstrap_room": room}
    assert host_of("[fd00::1]:30000") == "fd00::1"
    assert host_of("pod-0.svc") == "pod-0.svc"


def test_mode_of_engine_and_connector():
    assert mode_of("SGLang", "nixl") == "sglang"
    assert mode_of("vLLM", None) == "http"
    assert mode_of("vLLM", "mooncake") == "mooncake"


def _state(n, labels):
    return EndpointState(Endpoint(f"10.0.0.{n}:8000", labels, model_name="m"))


def _objects(**spec):
    return [
        {
            "apiVersion": KTHENA,
            "kind": "ModelServer",
            "metadata": {"name": "pd", "namespace": "default"},
            "spec": {
                "model": "m",
                "inferenceEngine": "vLLM",
                "workloadSelector": {
                    "matchLabels": {"app": "pd"},
                    "pdGroup": {
                        "groupKey": "g",
                        "prefillLabels": {"role": "prefill"},
                        "decodeLabels": {"role": "decode"},
                    },
                },
                **spec,
            },
        },
        {
            "apiVersion": KTHENA,
            "kind": "ModelRoute",
            "metadata": {"name": "pd", "namespace": "default"},
            "spec": {"modelName": "x", "rules": [{"targetModels": [{"modelServerName": "pd"}]}]},
        },
    ]


def test_routing_table_gives_decoders_as_candidates_and_prefillers_with_the_group():
    states = [
        _state(1, {"app": "pd", "role": "prefill", "g": "a"}),
        _state(2, {"app": "pd", "role": "decode", "g": "a"}),
        _state(3, {"app": "pd", "role": "prefill", "g": "b"}),
        _state(4, {"app": "other", "role": "prefill", "g": "a"}),  # not selected by matchLabels
        _state(5, {"app": "pd", "role": "decode"}),  # no group label: never paired
    ]
    backend = (
        build_table(_objects(kvConnector={"type": "nixl"}), states).resolve("x", "/", {}).backend
    )
    assert isinstance(backend.pd, PDBackend)
    assert [s.address for s in backend.candidates] == ["10.0.0.2:8000", "10.0.0.5:8000"]
    assert [s.address for s in backend.pd.prefill] == ["10.0.0.1:8000", "10.0.0.3:8000"]
    assert backend.pd.mode == "nixl" and backend.pd.group_key == "g"
    assert [backend.pd.group_of(s) for s in states] == ["a", "a", "b", "a", None]

    sglang = build_table(_objects(inferenceEngine="SGLang"), states).resolve("x", "/", {})
    assert sglang.backend.pd.mode == "sglang"
    plain = build_table(_objects(), states).resolve("x", "/", {})
    assert plain.backend.pd.mode == "http"
