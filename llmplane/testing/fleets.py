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
