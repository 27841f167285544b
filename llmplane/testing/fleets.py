"""Fleet YAML for tests and benchmarks: sim engines or real vLLM behind ``llmplane up``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _sizing(replicas: int | str, disaggregation: Mapping[str, Any] | None) -> str:
    """The Playground's spec line that sizes it: ``replicas``, or, for a disaggregated one,
    ``llmplane.disaggregation`` (each role has its own replicas; ``spec.replicas`` is refused
    next to it)."""
    if disaggregation is None:
        return f"  replicas: {replicas}"
    return f"  llmplane: {json.dumps({'disaggregation': dict(disaggregation)})}"


def sim_fleet(
    model: str,
    replicas: int | str,
    time_scale: str = "0.01",
    playground: str | None = None,
    args: Sequence[str] = (),
    source: str = "host:///dev/null",
    disaggregation: Mapping[str, Any] | None = None,
) -> str:
    """YAML for an OpenModel ``model`` and a Playground of ``replicas`` sim engines serving it
    (named ``playground``, else like the model), the sim run with ``--time-scale time_scale``
    and ``args``, the model's files at ``source`` (none by default: the sim needs none); with
    ``disaggregation`` (``spec.llmplane.disaggregation``, e.g. ``{"prefill": {"replicas": 2},
    "decode": {"replicas": 4}}``) it runs prefill and decode roles instead of ``replicas``. It
    ends with the Playground's spec open: a caller may append spec fields indented by two
    spaces (an ``elasticConfig``)."""
    engine_args = json.dumps(["--time-scale", str(time_scale), *args])
    return f"""
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {{name: {model}}}
spec:
  familyName: tiny
  source: {{uri: "{source}"}}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {{name: {playground or model}}}
spec:
{_sizing(replicas, disaggregation)}
  modelClaim: {{modelName: {model}}}
  backendRuntimeConfig:
    backendName: sim
    args: {engine_args}
"""


def vllm_fleet(
    model: Path,
    name: str,
    replicas: int = 1,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    disaggregation: Mapping[str, Any] | None = None,
) -> str:
    """YAML for an OpenModel ``name`` with its files at ``model`` (a tiny test model,
    ``llmplane.testing.tiny_model``) and a Playground of ``replicas`` vLLM for CPU engines
    serving it with the settings that model runs with (bfloat16, 512 tokens of context, 1 GiB
    of KV cache, offline) plus ``args`` and the environment variables ``env``; with
    ``disaggregation`` its prefill and decode roles instead of ``replicas`` (as
    ``sim_fleet``)."""
    argv = ["--dtype", "bfloat16", "--max-model-len", "512", *args]
    envs = [
        {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        *({"name": k, "value": v} for k, v in (env or {}).items()),
    ]
    return f"""
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {{name: {name}}}
spec:
  familyName: llama
  source: {{uri: "host://{model}"}}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {{name: {name}}}
spec:
{_sizing(replicas, disaggregation)}
  modelClaim: {{modelName: {name}}}
  backendRuntimeConfig:
    backendName: vllm
    args: {json.dumps(argv)}
    envs: {json.dumps(envs)}
"""
