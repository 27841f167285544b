"""The Kubernetes resources the operator reads and writes (the kinds live in ``llmplane.kube``).

The Helm chart's ClusterRole must grant exactly these (tests/unit/test_kube_chart.py checks it).
"""

from __future__ import annotations

from llmplane.kube.kinds import (
    BACKENDRUNTIME,
    CORE_SERVICE,
    DEPLOYMENT,
    HPA,
    INFERENCE_SERVICE,
    LEADERWORKERSET,
    OPENMODEL,
    PLAYGROUND,
    Kind,
)

# Objects the operator creates (server-side apply), by (apiVersion, kind).
OWNED = {
    k.api_version + "/" + k.kind: k
    for k in (INFERENCE_SERVICE, LEADERWORKERSET, DEPLOYMENT, CORE_SERVICE, HPA)
}

WATCHES = [
    (k.group, k.plural)
    for k in (OPENMODEL, BACKENDRUNTIME, PLAYGROUND, INFERENCE_SERVICE, LEADERWORKERSET, DEPLOYMENT)
]
WRITES = [
    (k.group, k.plural) for k in (INFERENCE_SERVICE, LEADERWORKERSET, DEPLOYMENT, CORE_SERVICE, HPA)
] + [
    ("inference.llmaz.io", "playgrounds/status"),
    ("inference.llmaz.io", "services/status"),
    ("inference.llmaz.io", "playgrounds/scale"),  # the operator's autoscaler
    ("", "events"),  # its SuccessfulRescale Events
]


def kind_for(api_version: str, kind: str) -> Kind:
    return OWNED[f"{api_version}/{kind}"]
