"""Disaggregated Playgrounds (``spec.llmplane.disaggregation``) route by model name with no
extra YAML: the Playground's default route takes its decode replicas as candidates and pairs
each with a prefill replica of the same ``llmplane.io/pd-group`` (``pd.py``), in the exchange
its engine and KV connector call for (``controlplane/disaggregation.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from pydantic import ValidationError

from llmplane.api.inference import KVConnector
from llmplane.controlplane.disaggregation import gateway_mode
from llmplane.controlplane.plan import PD_GROUP_LABEL, ROLE_LABEL
from llmplane.gateway.playgrounds import playground_models
from llmplane.gateway.registry import EndpointState

GROUP_KEY = PD_GROUP_LABEL


def pd_pairs(
    playgrounds: Iterable[Mapping[str, Any]], states: Iterable[EndpointState]
) -> Iterator[tuple[str, tuple[EndpointState, ...], tuple[EndpointState, ...], str]]:
    """(model name, decode replicas, prefill replicas, exchange mode) per disaggregated
    Playground."""
    states = list(states)
    for obj in playgrounds:
        spec = obj.get("spec") or {}
        dis = (spec.get("llmplane") or {}).get("disaggregation")
        models = playground_models(spec)
        if not isinstance(dis, Mapping) or not models:
            continue
        meta = obj.get("metadata") or {}
        namespace, group = meta.get("namespace") or "default", meta.get("name")
        try:
            connector = KVConnector.model_validate(dis.get("kvConnector") or {})
        except ValidationError:
            continue  # stored by another version: the Playground's own status says so
        backend = (spec.get("backendRuntimeConfig") or {}).get("backendName") or "vllm"

        mine = [
            s
            for s in states
            if s.endpoint.namespace == namespace and s.endpoint.labels.get(PD_GROUP_LABEL) == group
        ]
        decodes = tuple(s for s in mine if s.endpoint.labels.get(ROLE_LABEL) == "decode")
        prefill = tuple(s for s in mine if s.endpoint.labels.get(ROLE_LABEL) == "prefill")
        yield models[0], decodes, prefill, gateway_mode(backend, connector)
