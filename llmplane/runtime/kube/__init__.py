"""The Kubernetes runtime: manifests for llmaz resources (pure functions) and ``KubeRuntime``.

What the operator server-side-applies, and what ``llmplane render`` prints, in llmaz's shapes:

- Playground -> inference Service (same name, controller owner reference) and, with an
  ``elasticConfig`` and a scale trigger (the Playground's, else the recommended config's), an
  ``autoscaling/v2`` HorizontalPodAutoscaler targeting the Playground's scale subresource;
- Service -> LeaderWorkerSet (``leaderworkerset.x-k8s.io/v1``, startupPolicy LeaderReady) and a
  ClusterIP Service ``<name>-lb`` on 8080 selecting the leader pods; or, with
  ``use_leader_worker_set=False``, an ``apps/v1`` Deployment (single-host only).

The Service spec comes from the same pure planning code as the embedded substrate
(``llmplane.controlplane.planning``); model paths are located under ``/workspace/models``.
Pods get, as llmaz's Service controller injects them: init containers ``model-loader`` and
``model-loader-N`` running ``llmplane load-model`` into an emptyDir, a read-only mount of it in
``model-runner``, ``host://`` models as hostPath volumes, credentials only as
``secretKeyRef`` env vars, model labels, flavor accelerator limits and node affinity.

Modules: ``base`` (constants, options, object metadata), ``models`` (model paths, loader
init containers, credentials), ``service`` (Playground -> Service + HPA), ``workload`` (Service
-> LeaderWorkerSet / Deployment + ``<name>-lb``), ``render`` (everything at once) and
``runtime`` (``KubeRuntime``: apply and observe through the API server).

Objects carry no status and no fields the API server fills in, so applying the same inputs twice
changes nothing (server-side apply with field manager ``llmplane``).
"""

from llmplane.runtime.kube.base import DEFAULT_IMAGE, KubeOptions, owner_reference
from llmplane.runtime.kube.models import loader_args, pod_model_path, source_kind
from llmplane.runtime.kube.render import objects_for
from llmplane.runtime.kube.runtime import KubeRuntime, workload_state
from llmplane.runtime.kube.service import (
    hpa_for_playground,
    playground_objects,
    service_for_playground,
    service_object,
)
from llmplane.runtime.kube.workload import lb_service, plan_for, workload_objects

__all__ = [
    "DEFAULT_IMAGE",
    "KubeOptions",
    "KubeRuntime",
    "hpa_for_playground",
    "lb_service",
    "loader_args",
    "objects_for",
    "owner_reference",
    "plan_for",
    "playground_objects",
    "pod_model_path",
    "service_for_playground",
    "service_object",
    "source_kind",
    "workload_objects",
    "workload_state",
]
