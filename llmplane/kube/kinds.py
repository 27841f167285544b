"""Kubernetes API resources by (group, version, plural, kind): the one type every
Kubernetes-facing module names a resource with, and the resources llmplane reads or writes."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Kind:
    """An API resource: ``/api/v1/pods``, ``/apis/{group}/{version}/{plural}``."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The collection's path (in ``namespace`` when namespaced), or one object's."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name)}"
        return base

    @classmethod
    def of(cls, kind: str) -> Kind:
        """The resource of an llmplane kind (``Playground``, ``ModelRoute``, ...)."""
        from llmplane.api.registry import KINDS

        model = KINDS[kind]
        return cls(model.group, model.version, model.plural, kind, model.namespaced)

    @classmethod
    def served_of(cls, kinds: tuple[str, ...] | list[str]) -> list[Kind]:
        """The resources of older groups that serve these kinds too (InferencePool in
        inference.networking.x-k8s.io/v1alpha2)."""
        from llmplane.api.registry import SERVED

        return [
            cls(v.model.group, v.model.version, v.model.plural, v.kind, v.model.namespaced)
            for v in SERVED.values()
            if v.kind in kinds and v.crd and v.model is not None
        ]


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
POD = Kind("", "v1", "pods", "Pod")
SECRET = Kind("", "v1", "secrets", "Secret")
EVENT = Kind("", "v1", "events", "Event")
