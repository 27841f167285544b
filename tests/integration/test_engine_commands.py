"""Nothing from a resource reaches a shell as code: the built-in ollama engine runs an
``sh -c`` script, so its model tag is validated against ollama's name grammar when the resource
is applied, and shell-quoted when rendered. A fake ``ollama`` on PATH (the real one is not
installed here) records what it was asked to run; the launcher and ``sh`` are the real ones."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from llmplane.api.documents import parse_document, parse_text
from llmplane.controlplane.planning import (
    Inputs,
    PlanningError,
    plan_service,
    served_model_name,
    service_for_playground,
)
from llmplane.testing import wait_for
from tests.integration.upcli import cli

HOSTILE_TAG = 'qwen$(touch PWNED-1)`touch PWNED-2`;touch PWNED-3 "x'

FAKE_OLLAMA = """#!/bin/sh
# A stand-in for ollama: `serve` waits, `list` succeeds, `run TAG` records TAG.
case "$1" in
  serve) exec sleep 600 ;;
  list) exit 0 ;;
  run) printf '%s' "$2" > "$OLLAMA_RECORD"; exit 0 ;;
esac
exit 1
"""


def openmodel(uri: str) -> str:
    return f"""
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {{name: qwen}}
spec:
  familyName: qwen
  source: {{uri: {uri!r}}}
"""


def test_a_hostile_ollama_tag_is_refused_when_applied(tmp_path: Path) -> None:
    path = tmp_path / "model.yaml"
    for tag in (HOSTILE_TAG, "qwen$(touch PWNED)", "qwen;id", "qwen:`id`", "-rf"):
        path.write_text(openmodel(f"ollama://{tag}"))
        for command in ("validate", "apply"):
            state = tmp_path / "state" if command == "apply" else None
            proc = cli(command, "-f", str(path), state_dir=state, check=False)
            assert proc.returncode == 1, (tag, proc.stdout, proc.stderr)
            assert "ollama address must be a model name" in proc.stderr, proc.stderr
            assert "Traceback" not in proc.stderr
    path.write_text(openmodel("ollama://registry.ollama.ai/library/qwen2:0.5b-instruct-q4_K_M"))
    assert "OpenModel/qwen valid" in cli("validate", "-f", str(path), state_dir=None).stdout


SHELL_BACKEND = """
apiVersion: inference.llmaz.io/v1alpha1
kind: BackendRuntime
metadata: {name: shelly}
spec:
  command: ["sh", "-c"]
  image: ollama/ollama
  version: latest
  recommendedConfigs:
    - name: default
      args: ["ollama serve & ollama run {{ .ModelPath }} && wait"]
"""


def test_values_rendered_into_a_shell_script_are_only_data(tmp_path: Path) -> None:
    """A BackendRuntime of your own may be an ``sh -c`` script; a host path (which may hold
    anything) rendered into it reaches the command as one argument and runs none of it."""
    hostile_path = "/models/qwen$(touch PWNED-1)`touch PWNED-2`;touch PWNED-3"
    backend = parse_text(SHELL_BACKEND).resources[0]
    model = parse_text(openmodel(f"host://{hostile_path}")).resources[0]
    playground = parse_document(
        {
            "apiVersion": "inference.llmaz.io/v1alpha1",
            "kind": "Playground",
            "metadata": {"name": "qwen", "namespace": "default", "uid": "u1"},
            "spec": {
                "modelClaim": {"modelName": "qwen"},
                "backendRuntimeConfig": {"backendName": "shelly"},
            },
        }
    )[0]
    inputs = Inputs(playground, {"qwen": model}, backend)
    service = service_for_playground(inputs, lambda m: hostile_path)
    plan = plan_service(service, {"qwen": model}, backend, locate=lambda m: hostile_path)
    assert plan.local is not None and plan.local.argv[:2] == ["sh", "-c"]

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ollama"
    fake.write_text(FAKE_OLLAMA)
    fake.chmod(0o755)
    record = tmp_path / "ran"
    work = tmp_path / "cwd"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OLLAMA_RECORD": str(record)}
    proc = subprocess.Popen(plan.local.argv, cwd=work, env=env, start_new_session=True)
    try:
        wait_for(record.exists, 30, 0.05, what="the fake `ollama run` to be called")
        assert list(work.iterdir()) == []  # no PWNED-* file: nothing of it ran
        assert record.read_text() == hostile_path  # one argument, byte for byte
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_a_stored_hostile_tag_is_a_planning_error_not_a_command() -> None:
    """A row stored before the tag rule existed never reaches the engine's script."""
    model = parse_text(openmodel("ollama://qwen2:0.5b")).resources[0]
    model.spec.source.uri = f"ollama://{HOSTILE_TAG}"  # skips validation, as an old row would
    with pytest.raises(PlanningError, match="ollama address must be a model name"):
        served_model_name(model)
