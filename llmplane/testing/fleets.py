"""Fleet YAML for tests and benchmarks: sim engines behind ``llmplane up``."""

from __future__ import annotations

import json
from collections.abc import Sequence


def sim_fleet(
    model: str,
    replicas: int | str,
    time_scale: str = "0.01",
    playground: str | None = None,
    args: Sequence[str] = (),
    source: str = "host:///dev/null",
) -> str:
    """YAML for an OpenModel ``model`` and a Playground of ``replicas`` sim engines serving it
    (named ``playground``, else like the model), the sim run with ``--time-scale time_scale``
    and ``args``, the model's files at ``source`` (none by default: the sim needs none). It
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
  replicas: {replicas}
  modelClaim: {{modelName: {model}}}
  backendRuntimeConfig:
    backendName: sim
    args: {engine_args}
"""


def vllm_fleet(
    name: str, model_dir: str, replicas: int, args: Sequence[str] = (), cache_gib: int = 1
) -> str:
    """YAML for an OpenModel ``name`` of the model files in ``model_dir`` and a Playground of
    ``replicas`` vLLM (CPU build) engines serving it with ``args``, offline, with ``cache_gib``
    GiB of KV cache."""
    envs = [
        {"name": "VLLM_CPU_KVCACHE_SPACE", "value": str(cache_gib)},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
    ]
    return f"""
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {{name: {name}}}
spec:
  familyName: llama
  source: {{uri: "host://{model_dir}"}}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  modelClaim: {{modelName: {name}}}
  backendRuntimeConfig:
    backendName: vllm
    args: {json.dumps(list(args))}
    envs: {json.dumps(envs)}
"""
