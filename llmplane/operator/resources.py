"""The Kubernetes resources the operator reads and writes: (API group, resource) pairs.

The Helm chart's ClusterRole must grant exactly these (tests/unit/test_kube_chart.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


OPENMODEL = Kind("llmaz.io", "v1alpha1", "openmodels", "OpenModel", namespaced=False)
BACKENDRUNTIME = Kind(
    "inference.llmaz.io", "v1alpha1", "backendruntimes", "BackendRuntime", namespaced=False
)
PLAYGROUND = Kind("inference.llmaz.io", "v1alpha1", "playgrounds", "Playground")
INFERENCE_SERVICE = Kind("inference.llmaz.io", "v1alpha1", "services", "Service")
LEADERWORKERSET = Kind("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet")
DEPLOYMENT = Kind("apps", "v1", "deployments", "Deployment")
CORE_SERVICE = Kind("", "v1", "services", "Service")
HPA = Kind("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")

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
]


def kind_for(api_version: str, kind: str) -> Kind:
    return OWNED[f"{api_version}/{kind}"]
