"""Playground -> inference Service (same name, owned) + HorizontalPodAutoscaler, as llmaz builds them."""

from __future__ import annotations

import copy
import shlex
from typing import Any

from llmplane.api.documents import dump_resource
from llmplane.api.inference import BackendRuntime, Playground, ScaleTrigger, Service
from llmplane.api.llmaz import OpenModel
from llmplane.controlplane import autoscaling, planning
from llmplane.controlplane.plan import (
    MODEL_FAMILY_LABEL,
    MODEL_NAME_LABEL,
)
from llmplane.controlplane.planning import PlanningError
from llmplane.runtime.endpoint import kv_events_addresses
from llmplane.runtime.kube.base import (
    object_metadata,
    runner_container,
)
from llmplane.runtime.kube.models import (
    pod_model_path,
)
from llmplane.runtime.launch import KV_EVENTS_ENGINES, kv_events_flag

# Metrics only the gateway has (no metrics adapter serves them): llmplane's autoscaler reads them.
GATEWAY_METRIC_PREFIXES = ("llmplane_gateway_", "llmplane:")
AUTOSCALER_ANNOTATION = "llmplane.io/autoscaler"

# Multi-host commands for built-in engines whose BackendRuntime has no multiHostCommands.
# vLLM: a Ray cluster across the group (the llmaz blog's scripts); the leader starts the server.
_RAY_LEADER = """ray start --head --disable-usage-stats --include-dashboard false
i=0
while true; do
  active_nodes=$(python3 -c 'import ray; ray.init(); print(sum(node["Alive"] for node in ray.nodes()))')
  if [ "$active_nodes" -eq "$(LWS_GROUP_SIZE)" ]; then
    echo "All ray workers are active and the ray cluster is initialized successfully."
    break
  fi
  if [ $i -eq 60 ]; then
    echo "Initialization failed. Exiting..."
    exit 1
  fi
  echo "Wait for $active_nodes/$(LWS_GROUP_SIZE) workers to be active."
  i=$((i+1))
  sleep 5s
done
python3 -m vllm.entrypoints.openai.api_server"""
_RAY_WORKER = """i=0
while true; do
  ray start --address=$(LWS_LEADER_ADDRESS):6379 --block
  if [ $? -eq 0 ]; then
    echo "Worker: Ray runtime started with head address $(LWS_LEADER_ADDRESS):6379"
    break
  fi
  if [ $i -eq 60 ]; then
    echo "Initialization failed. Exiting..."
    exit 1
  fi
  echo "Waiting until the ray worker is active..."
  sleep 5s
done"""
_SGLANG_DIST = [
    "--nnodes",
    "$(LWS_GROUP_SIZE)",
    "--node-rank",
    "$(LWS_WORKER_INDEX)",
    "--dist-init-addr",
    "$(LWS_LEADER_ADDRESS):20000",
]

# The pod port a vLLM (or sim) replica publishes its KV-cache events on (replay: the next).
KV_EVENTS_PORT = 5557


def _first_flavor_params(pg: Playground, model: OpenModel) -> dict[str, str]:
    claims = planning.claims_of(pg)
    flavors = planning.select_flavors(model, claims.inference_flavors)
    return dict(flavors[0].params or {}) if flavors else {}


def _merge_into_command(command: list[str], args: list[str]) -> list[str]:
    """A shell command cannot take args: append them to its script (llmaz's rule)."""
    if not args:
        return list(command)
    if len(command) >= 3 and command[-2] == "-c":
        return [*command[:-1], command[-1].rstrip() + " " + shlex.join(args)]
    return [*command, *args]


def _multi_host_commands(
    backend: BackendRuntime, args: list[str], params: dict[str, str]
) -> tuple[list[str], list[str] | None, list[str] | None]:
    """(leader command, leader args, worker command or None meaning 'same as leader')."""
    multi = backend.spec.multi_host_commands
    if multi and multi.leader and multi.worker:
        return _merge_into_command(list(multi.leader), args), None, list(multi.worker)
    if backend.name == "vllm":
        leader = ["sh", "-c", _RAY_LEADER]
        return _merge_into_command(leader, args), None, ["sh", "-c", _RAY_WORKER]
    if backend.name == "sglang":
        extra = list(_SGLANG_DIST)
        if "TP" in params and "--tp-size" not in args and "--tp" not in args:
            extra += ["--tp-size", str(int(params["TP"]) * int(params.get("PP", "1") or 1))]
        return list(backend.spec.command or []), [*args, *extra], None
    raise PlanningError(
        f"BackendRuntime/{backend.name} has no multiHostCommands (leader and worker) "
        f"for a multi-host flavor (PP={params.get('PP')})"
    )


def service_for_playground(
    pg: Playground, models: dict[str, OpenModel], backend: BackendRuntime
) -> Service:
    """The inference Service a Playground owns, as llmaz's Playground controller builds it.

    Single-host: the planning result with a RollingUpdate rollout strategy. Multi-host (the
    first flavor's ``PP`` > 1): ``size`` = PP, a leader template running the leader command with
    the engine args, and a worker template running the worker command (no args, ports, probes
    or lifecycle).
    """
    service = planning.service_for_playground(
        planning.Inputs(pg, models, backend), locate=pod_model_path
    )
    data = dump_resource(service)
    data["spec"].setdefault("rolloutStrategy", {"type": "RollingUpdate"})
    template = data["spec"]["workloadTemplate"]
    if template.get("size", 1) > 1:
        main = planning.main_and_draft(planning.claims_of(pg))[0]
        params = _first_flavor_params(pg, models[main])
        worker = template["workerTemplate"]
        runner = runner_container(worker["spec"])
        leader_command, leader_args, worker_command = _multi_host_commands(
            backend, list(runner.get("args") or []), params
        )
        leader = copy.deepcopy(worker)
        leader_runner = runner_container(leader["spec"])
        leader_runner["command"] = leader_command
        if leader_args:
            leader_runner["args"] = leader_args
        else:
            leader_runner.pop("args", None)
        runner.pop("ports", None)
        for key in ("startupProbe", "livenessProbe", "readinessProbe", "lifecycle"):
            runner.pop(key, None)
        if worker_command is not None:
            runner["command"] = worker_command
            runner.pop("args", None)
        else:
            runner["command"] = leader_command
            runner["args"] = leader_args or []
        # Model labels go to the leader only: it serves; workers hold shards.
        worker_labels = worker.get("metadata", {}).get("labels") or {}
        for key in (MODEL_NAME_LABEL, MODEL_FAMILY_LABEL):
            worker_labels.pop(key, None)
        template["leaderTemplate"] = leader
    else:
        with_kv_events(runner_container(template["workerTemplate"]["spec"]), backend.name)
    return Service.model_validate(data)


def with_kv_events(runner: dict[str, Any], engine: str) -> None:
    """An engine that publishes KV-cache events (vLLM, the sim) binds them on the pod's
    ``KV_EVENTS_PORT`` (replay on the next port), where every gateway subscribes at the pod's
    IP (``endpoint.pod_kv_events``); a command that sets ``--kv-events-config`` keeps its own."""
    args = list(runner.get("args") or [])
    if engine not in KV_EVENTS_ENGINES:
        return
    if kv_events_addresses([*(runner.get("command") or []), *args], "pod") is not None:
        return
    runner["args"] = [
        *args,
        *kv_events_flag(f"tcp://*:{KV_EVENTS_PORT}", f"tcp://*:{KV_EVENTS_PORT + 1}"),
    ]
    ports = list(runner.get("ports") or [])
    ports += [
        {"name": "kv-events", "containerPort": KV_EVENTS_PORT},
        {"name": "kv-replay", "containerPort": KV_EVENTS_PORT + 1},
    ]
    runner["ports"] = ports


def service_object(service: Service) -> dict[str, Any]:
    """The Service as applied: spec and identifying metadata only (no status, no server fields)."""
    data = dump_resource(service)
    data.pop("status", None)
    meta = data["metadata"]
    keep = ("name", "namespace", "labels", "annotations", "ownerReferences")
    data["metadata"] = {k: meta[k] for k in keep if meta.get(k)}
    refs = data["metadata"].get("ownerReferences")
    if refs is not None:
        data["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid")]
        if not data["metadata"]["ownerReferences"]:
            del data["metadata"]["ownerReferences"]
    return data


def hpa_reads(trigger: ScaleTrigger | None) -> bool:
    """Whether a real HPA can read every metric of ``trigger`` (with metrics-server or a metrics
    adapter). The gateway's own metrics (``llmplane_gateway_*``, the built-in default trigger)
    and a trigger without metrics are llmplane's to read."""
    if trigger is None or not trigger.hpa.metrics:
        return False
    for metric in trigger.hpa.metrics:
        source = metric.pods or metric.object or metric.external
        if source is not None and source.metric.name.startswith(GATEWAY_METRIC_PREFIXES):
            return False
    return True


def scaled_by_llmplane(
    pg: Playground, backend: BackendRuntime | None, models: dict[str, OpenModel] | None = None
) -> bool:
    """An elastic Playground that gets no HPA: the operator's own autoscaler scales it
    (``operator/autoscaler.py``), with the decision the embedded substrate runs."""
    return pg.spec.elastic_config is not None and hpa_for_playground(pg, backend, models) is None


def hpa_for_playground(
    pg: Playground, backend: BackendRuntime | None, models: dict[str, OpenModel] | None = None
) -> dict[str, Any] | None:
    """autoscaling/v2 HPA on the Playground's scale subresource, as llmaz builds it.

    Only with ``elasticConfig``, ``minReplicas`` of 1 or more and a scale trigger whose metrics
    an HPA reads (``hpa_reads``): the Playground's, else the one of the recommended config in
    use. ``maxReplicas`` defaults to 99999 (llmaz; the HPA requires one). Otherwise (no trigger:
    the built-in default; the gateway's in-flight metric; scale to zero) the operator's own
    autoscaler scales the Playground (``scaled_by_llmplane``).
    """
    elastic = pg.spec.elastic_config
    if elastic is None or elastic.min_replicas == 0:
        return None  # an HPA cannot scale to zero (without the HPAScaleToZero feature gate)
    trigger = elastic.scale_trigger or autoscaling.recommended_trigger(pg, backend, models or {})
    if not hpa_reads(trigger):
        return None
    assert trigger is not None
    spec: dict[str, Any] = {
        "scaleTargetRef": {
            "apiVersion": pg.api_version,
            "kind": "Playground",
            "name": pg.name,
        },
        "minReplicas": elastic.min_replicas,
        "maxReplicas": elastic.max_replicas if elastic.max_replicas is not None else 99999,
    }
    spec["metrics"] = [m.to_dict() for m in trigger.hpa.metrics or []]
    if trigger.hpa.behavior:
        spec["behavior"] = trigger.hpa.behavior.to_dict()
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_metadata(pg.name, pg.namespace, pg),
        "spec": spec,
    }


def playground_objects(
    pg: Playground, models: dict[str, OpenModel], backend: BackendRuntime
) -> tuple[Service, list[dict[str, Any]]]:
    """(the Service model, [Service object, HPA object if any]) for one Playground. A
    Playground the operator's autoscaler scales instead of an HPA says so on its Service
    (``AUTOSCALER_ANNOTATION``), so ``llmplane render`` and ``kubectl get -o yaml`` show it."""
    service = service_for_playground(pg, models, backend)
    objects = [service_object(service)]
    hpa = hpa_for_playground(pg, backend, models)
    if hpa is not None:
        objects.append(hpa)
    elif pg.spec.elastic_config is not None:
        note = llmplane_autoscaling(pg, backend, models)
        objects[0]["metadata"].setdefault("annotations", {})[AUTOSCALER_ANNOTATION] = note
    return service, objects


def llmplane_autoscaling(
    pg: Playground, backend: BackendRuntime | None, models: dict[str, OpenModel]
) -> str:
    """One line saying how the operator's autoscaler scales an elastic Playground."""
    elastic = pg.spec.elastic_config
    assert elastic is not None
    trigger = autoscaling.trigger_in_force(pg, backend, models)
    assert trigger is not None
    low, high = autoscaling.bounds(elastic)
    metrics = []
    for metric in trigger.hpa.metrics or []:
        source = metric.pods or metric.object or metric.external
        if source is not None:
            target = source.target
            value = target.average_value if target.type == "AverageValue" else target.value
            metrics.append(f"{source.metric.name} {target.type} {value}")
        elif metric.resource is not None:
            metrics.append(f"{metric.resource.name} {metric.resource.target.type}")
    upper = str(high) if elastic.max_replicas is not None else "unbounded"
    return f"llmplane-operator: {low}..{upper} replicas on {', '.join(metrics)}"
