"""``KubeRuntime``: the ``Runtime`` on a Kubernetes cluster, for the operator.

On Kubernetes a Service's pod templates are the user's (a Service may be written by hand), so
the objects realising a plan are built from the Service itself: ``plan(service, ...)`` plans it
with pod paths and prepares its LeaderWorkerSet (or Deployment) and ``<name>-lb`` Service;
``realise(plan)`` server-side-applies them. ``observe(key)`` reads the workload and its pods
back from the API server; ``status`` and ``endpoints`` answer from what was observed last.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llmplane.api.inference import BackendRuntime, Service
from llmplane.api.llmaz import OpenModel
from llmplane.controlplane.plan import BACKEND_LABEL, MODEL_NAME_LABEL, SERVICE_LABEL, WorkloadPlan
from llmplane.controlplane.planning import CONTAINER_PORT
from llmplane.controlplane.status import WorkloadState
from llmplane.kube.kinds import CORE_SERVICE, DEPLOYMENT, LEADERWORKERSET, POD, Kind
from llmplane.kube.pods import pod_address, pod_ready
from llmplane.runtime.endpoint import Endpoint, pod_max_num_seqs, pod_priority_scheduling
from llmplane.runtime.kube.base import LB_SUFFIX, LWS_NAME_LABEL, KubeOptions
from llmplane.runtime.kube.workload import plan_for, workload_objects

if TYPE_CHECKING:  # kubernetes_asyncio is the operator's extra; render needs none of it
    from llmplane.kube.client import KubeClient

_KINDS = {(k.api_version, k.kind): k for k in (LEADERWORKERSET, DEPLOYMENT, CORE_SERVICE)}


def _true(conditions: list[dict[str, Any]], type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


def workload_state(workload: dict[str, Any] | None) -> WorkloadState:
    """What a LeaderWorkerSet or Deployment says of itself (None: it does not exist)."""
    if workload is None:
        return WorkloadState()
    status = workload.get("status") or {}
    conditions = status.get("conditions") or []
    replicas = int(status.get("replicas") or 0)
    ready = int(status.get("readyReplicas") or 0)
    if workload["kind"] == "LeaderWorkerSet":
        available = _true(conditions, "Available")
        selector = status.get("hpaPodSelector")
    else:
        wanted = int((workload.get("spec") or {}).get("replicas", 1))
        available = (
            _true(conditions, "Available") and int(status.get("availableReplicas") or 0) >= wanted
        )
        labels = ((workload.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None
    return WorkloadState(available, replicas, ready, selector)


class KubeRuntime:
    """Workloads as LeaderWorkerSets (or Deployments) applied through the API server."""

    def __init__(self, client: KubeClient, options: KubeOptions | None = None):
        self.client = client
        self.options = options or KubeOptions()
        self._prepared: dict[str, tuple[WorkloadPlan, list[dict[str, Any]]]] = {}
        self._observed: dict[str, WorkloadState] = {}
        self._endpoints: dict[str, list[Endpoint]] = {}

    @property
    def workload_kind(self) -> Kind:
        return LEADERWORKERSET if self.options.use_leader_worker_set else DEPLOYMENT

    def plan(
        self, service: Service, models: dict[str, OpenModel], backend: BackendRuntime | None
    ) -> WorkloadPlan:
        """The Service's plan on this cluster; prepares the objects ``realise`` applies.

        Raises PlanningError when it cannot run here (e.g. multi-host without LeaderWorkerSet).
        """
        plan = plan_for(service, models, backend)
        objects = workload_objects(service, models, backend, self.options, plan)
        self._prepared[plan.key] = (plan, objects)
        return plan

    async def realise(self, plan: WorkloadPlan) -> None:
        prepared = self._prepared.get(plan.key)
        if prepared is None or prepared[0] != plan:
            raise ValueError(f"{plan.key}: realise() takes a plan made by this runtime's plan()")
        for obj in prepared[1]:
            await self.client.apply(_KINDS[obj["apiVersion"], obj["kind"]], obj)

    async def remove(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        await self.client.delete(self.workload_kind, name, namespace)
        await self.client.delete(CORE_SERVICE, name + LB_SUFFIX, namespace)
        self._prepared.pop(key, None)
        self._observed.pop(key, None)
        self._endpoints.pop(key, None)

    async def observe(self, key: str) -> WorkloadState:
        """Read the workload and its ready serving pods; ``status``/``endpoints`` then tell."""
        namespace, _, name = key.partition("/")
        kind = self.workload_kind
        workload = await self.client.get_or_none(kind, name, namespace)
        state = self._observed[key] = workload_state(workload)
        label = LWS_NAME_LABEL if kind is LEADERWORKERSET else SERVICE_LABEL
        pods = await self.client.list(POD, namespace, f"{label}={name}") if workload else []
        prepared = self._prepared.get(key)
        served = prepared[0].model_name if prepared else None
        self._endpoints[key] = [
            _endpoint(pod, key, served)
            for pod in pods
            if pod_ready(pod)
            and MODEL_NAME_LABEL in ((pod.get("metadata") or {}).get("labels") or {})
        ]
        return state

    def status(self, key: str) -> WorkloadState | None:
        return self._observed.get(key)

    def endpoints(self, selector: Mapping[str, str] | None = None) -> list[Endpoint]:
        out = [
            e
            for endpoints in self._endpoints.values()
            for e in endpoints
            if not selector or all(e.labels.get(k) == v for k, v in selector.items())
        ]
        return sorted(out, key=lambda e: (e.workload, e.address))


def _endpoint(pod: dict[str, Any], key: str, served: str | None) -> Endpoint:
    meta = pod.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    backend = labels.get(BACKEND_LABEL, "")
    return Endpoint(
        address=pod_address(pod["status"]["podIP"], CONTAINER_PORT),
        labels=labels,
        model_name=served or labels.get(MODEL_NAME_LABEL, ""),
        backend=backend,
        engine=(backend or "vllm").lower(),
        namespace=meta.get("namespace") or "default",
        workload=key,
        max_num_seqs=pod_max_num_seqs(pod),
        priority_scheduling=pod_priority_scheduling(pod),
    )
