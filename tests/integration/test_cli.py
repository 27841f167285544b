"""The kubectl-like CLI as a user runs it: real processes, a real state directory."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.integration.upcli import cli

ROOT = Path(__file__).resolve().parents[2]

BROKEN = """
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {name: qwen}
spec:
  replicas: 1
  modelClaim: {modelName: qwen}
  elasticConfig: {minReplicas: 3, maxReplicas: 3}
---
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {name: qwen}
spec:
  familyName: qwen
  source: {uri: "ftp://x/y", modelHub: {modelID: a/b, filename: f, allowPatterns: ["*"]}}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {name: ms}
spec:
  inferenceEngine: vllm
  workloadSelector: {matchLabels: {app: x}}
  workloadPort: {port: 70000}
"""


def test_validate_lists_every_mistake_and_stores_nothing(tmp_path: Path) -> None:
    state = tmp_path / "s"
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    for command in ("validate", "apply"):
        proc = cli(
            command, "-f", str(path), state_dir=state if command == "apply" else None, check=False
        )
        assert proc.returncode == 1
        assert "Traceback" not in proc.stderr
        err = proc.stderr
        assert (
            "Playground/qwen: spec.elasticConfig.minReplicas: must be less than maxReplicas (3)"
            in err
        )
        assert "OpenModel/qwen: spec.source.uri: protocol 'ftp' is not one of" in err
        assert "OpenModel/qwen: spec.source: only one of modelHub or uri may be set" in err
        assert "OpenModel/qwen: spec.source.modelHub.filename: may not be set together" in err
        assert "ModelServer/ms: spec.inferenceEngine:" in err and "'vLLM' or 'SGLang'" in err
        assert "ModelServer/ms: spec.workloadPort.port:" in err
    # the valid documents of an invalid file were not stored either
    assert cli("get", "om", "qwen", state_dir=state, check=False).returncode == 1


def test_apply_then_get_shows_defaults(tmp_path: Path) -> None:
    state = tmp_path / "s"
    out = cli("apply", "-f", str(ROOT / "examples" / "opt-125m.yaml"), state_dir=state)
    assert "openmodel.llmaz.io/opt-125m created" in out.stdout
    assert "playground.inference.llmaz.io/opt-125m created" in out.stdout
    assert "deprecated" in out.stderr  # the blog's flavor `requests` was upgraded with a warning
    again = cli("apply", "-f", str(ROOT / "examples" / "opt-125m.yaml"), state_dir=state)
    assert "unchanged" in again.stdout

    model = yaml.safe_load(
        cli("get", "openmodels", "opt-125m", "-o", "yaml", state_dir=state).stdout
    )
    assert model["spec"]["source"]["modelHub"]["name"] == "Huggingface"
    assert model["spec"]["source"]["modelHub"]["revision"] == "main"
    assert model["spec"]["inferenceConfig"]["flavors"][0]["limits"] == {"nvidia.com/gpu": 1}
    assert model["metadata"]["generation"] == 1 and model["metadata"]["uid"]

    pg = json.loads(cli("get", "pl", "opt-125m", "-o", "json", state_dir=state).stdout)
    assert pg["spec"]["backendRuntimeConfig"]["backendName"] == "vllm"
    assert pg["metadata"]["namespace"] == "default"

    names = cli("get", "playground", "-o", "name", state_dir=state).stdout.split()
    assert names == ["playground.inference.llmaz.io/opt-125m"]


def test_stdin_selectors_delete_and_errors(tmp_path: Path) -> None:
    state = tmp_path / "s"
    doc = (ROOT / "examples" / "playground-qwen.yaml").read_text()
    cli("apply", "-f", "-", state_dir=state, stdin=doc)
    assert "qwen2-0--5b" in cli("get", "om", state_dir=state).stdout
    assert cli("get", "pl", "-l", "nope=1", state_dir=state).stderr.startswith("No resources found")

    unknown = cli("get", "widgets", state_dir=state, check=False)
    assert unknown.returncode == 1 and "unknown resource type 'widgets'" in unknown.stderr
    bad_selector = cli("get", "pl", "-l", "a in (", state_dir=state, check=False)
    assert bad_selector.returncode == 1 and "invalid label selector" in bad_selector.stderr
    missing = cli("delete", "pl", "ghost", state_dir=state, check=False)
    assert missing.returncode == 1 and "Playground/ghost not found" in missing.stderr
    assert "Traceback" not in unknown.stderr + bad_selector.stderr + missing.stderr
    usage = cli("get", "--no-such-flag", state_dir=state, check=False)
    assert (
        usage.returncode == 2
        and "No such option" in usage.stderr
        and "Traceback" not in usage.stderr
    )

    assert "deleted" in cli("delete", "-f", "-", state_dir=state, stdin=doc).stdout
    assert cli("get", "pl", "-A", state_dir=state).stderr.startswith("No resources found")


def test_crds_print_every_kind(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all(cli("crds", state_dir=None).stdout))
    names = {d["metadata"]["name"] for d in docs}
    assert "playgrounds.inference.llmaz.io" in names
    assert "modelroutes.networking.serving.volcano.sh" in names
    assert "inferencepools.inference.networking.x-k8s.io" in names


def test_up_rejects_a_bad_gateway_config_and_exits(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("plugins: [{type: no-such-plugin}]\n")
    proc = cli(
        "up", "--port", "0", "--gateway-config", str(config), state_dir=tmp_path / "s", check=False
    )
    assert proc.returncode == 1
    assert "invalid gateway config" in proc.stderr and "no-such-plugin" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_gateway_rejects_a_bad_config_and_exits(tmp_path: Path) -> None:
    for text, expected in (
        ("plugins: [{type: no-such-plugin}]\n", "no-such-plugin"),
        ("plugins: [\n", "not valid YAML"),
        ("gateway: {maxBodyByte: 1}\n", "gateway.maxBodyByte: unknown setting"),
    ):
        config = tmp_path / "gateway.yaml"
        config.write_text(text)
        proc = cli(
            "gateway", "--port", "0", "--config", str(config), state_dir=tmp_path / "s", check=False
        )
        assert proc.returncode == 2, proc.stderr
        assert f"llmplane gateway: {config}:" in proc.stderr and expected in proc.stderr
        assert "Traceback" not in proc.stderr


def test_gateway_startup_problems_are_one_line(tmp_path: Path) -> None:
    import os
    import socket
    import subprocess
    import sys

    def gateway(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "llmplane.cli",
                "gateway",
                "--state-dir",
                str(tmp_path / "s"),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env},
        )

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        proc = gateway("--port", str(busy.getsockname()[1]))
    assert proc.returncode == 2 and "cannot listen on 127.0.0.1:" in proc.stderr
    assert "Traceback" not in proc.stderr
    empty = tmp_path / "kubeconfig"
    empty.write_text("")
    proc = gateway("--kubernetes", "--port", "0", KUBECONFIG=str(empty))
    assert proc.returncode == 2 and "--kubernetes: no usable Kubernetes API" in proc.stderr
    assert "Traceback" not in proc.stderr
