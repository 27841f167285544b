"""Kubernetes manifests for llmaz resources: pure functions, no API calls.

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

Objects carry no status and no fields the API server fills in, so applying the same inputs twice
changes nothing (server-side apply with field manager ``llmplane``).
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from llmplane.api.base import Resource
from llmplane.api.documents import dump_resource
from llmplane.api.inference import BackendRuntime, Playground, Service
from llmplane.api.llmaz import OpenModel, split_uri
from llmplane.controlplane import planning
from llmplane.controlplane.plan import (
    MODEL_FAMILY_LABEL,
    MODEL_NAME_LABEL,
    SERVICE_LABEL,
    SKIP_LOADER_ANNOTATION,
    WorkloadPlan,
)
from llmplane.controlplane.planning import CONTAINER_NAME, CONTAINER_PORT, PlanningError
from llmplane.loader.locate import locate

MODELS_ROOT = "/workspace/models"
MODEL_MOUNT_PATH = MODELS_ROOT + "/"
MODEL_VOLUME = "model-volume"
LOADER_NAME = "model-loader"
DEFAULT_IMAGE = "ghcr.io/llmplane/llmplane:0.1.0"

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LB_SUFFIX = "-lb"

# Secrets llmaz reads credentials from (each key optional: a missing secret leaves it unset).
MODELHUB_SECRET = "modelhub-secret"
AWS_SECRET = "aws-access-secret"
OSS_SECRET = "oss-access-secret"
_CREDENTIALS: dict[str, list[tuple[str, str, str]]] = {
    # source kind -> [(env name, secret name, key)]
    "huggingface": [
        ("HUGGING_FACE_HUB_TOKEN", MODELHUB_SECRET, "HF_TOKEN"),
        ("HF_TOKEN", MODELHUB_SECRET, "HF_TOKEN"),
    ],
    "modelscope": [("MODELSCOPE_API_TOKEN", MODELHUB_SECRET, "MODELSCOPE_API_TOKEN")],
    "s3": [
        ("AWS_ACCESS_KEY_ID", AWS_SECRET, "AWS_ACCESS_KEY_ID"),
        ("AWS_SECRET_ACCESS_KEY", AWS_SECRET, "AWS_SECRET_ACCESS_KEY"),
    ],
    "oss": [
        ("OSS_ACCESS_KEY_ID", OSS_SECRET, "OSS_ACCESS_KEY_ID"),
        ("OSS_ACCESS_KEY_SECRET", OSS_SECRET, "OSS_ACCESS_KEY_SECRET"),
    ],
    "gcs": [],  # Application Default Credentials: workload identity, no secret
}
_CREDENTIAL_NAMES = {name for entries in _CREDENTIALS.values() for name, _, _ in entries}
_PROBE_DEFAULTS = {
    "initialDelaySeconds": 0,
    "timeoutSeconds": 1,
    "periodSeconds": 10,
    "successThreshold": 1,
    "failureThreshold": 3,
}

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


@dataclass(frozen=True)
class KubeOptions:
    """Cluster-wide choices (Helm values of the operator)."""

    image: str = DEFAULT_IMAGE  # the llmplane image, used by the model-loader init containers
    use_leader_worker_set: bool = True  # False: apps/v1 Deployments (single-host only)
    image_pull_policy: str | None = None  # for the loader containers


# Model locations ----------------------------------------------------------------------------


def skips_loader(model: OpenModel) -> bool:
    """``llmaz.io/skip-model-loader: "true"`` on the OpenModel: the engine fetches the model."""
    return (model.metadata.annotations or {}).get(SKIP_LOADER_ANNOTATION) == "true"


def source_kind(model: OpenModel) -> str:
    """huggingface, modelscope, s3, oss, gcs, host or ollama (``package://`` is embedded-only)."""
    source = model.spec.source
    if source.model_hub is not None:
        return "huggingface" if source.model_hub.name == "Huggingface" else "modelscope"
    assert source.uri is not None
    proto, _ = split_uri(source.uri)
    if proto == "package":
        raise PlanningError(
            f"OpenModel/{model.name}: package:// models exist only on the embedded substrate "
            "(llmplane up); on Kubernetes use a hub, an object store or host://",
            reason="AbortProcessing",
        )
    return proto


def pod_model_path(model: OpenModel) -> str:
    """``{{ .ModelPath }}`` inside the pod: the loader's layout under ``/workspace/models``.

    With the skip-model-loader annotation, the engine loads by itself: the hub model id, or the
    object store URI (as llmaz). ``host://p`` is ``p``; ``ollama://tag`` the tag.
    """
    kind = source_kind(model)
    source = model.spec.source
    _, address = split_uri(source.uri) if source.uri else ("", "")
    if kind in ("host", "ollama"):
        return address
    if skips_loader(model):
        if source.model_hub is not None:
            return source.model_hub.model_id
        return source.uri or ""
    return str(locate(source, MODELS_ROOT).path)


# Playground -> Service + HPA ----------------------------------------------------------------


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
        runner = _runner(worker["spec"])
        leader_command, leader_args, worker_command = _multi_host_commands(
            backend, list(runner.get("args") or []), params
        )
        leader = copy.deepcopy(worker)
        leader_runner = _runner(leader["spec"])
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
    return Service.model_validate(data)


def _runner(pod_spec: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec["containers"]
    return next((c for c in containers if c.get("name") == CONTAINER_NAME), containers[0])


def owner_reference(owner: Resource | dict[str, Any]) -> dict[str, Any] | None:
    """A controller owner reference (None while the owner has no uid, as in ``render``)."""
    data = dump_resource(owner) if isinstance(owner, Resource) else owner
    meta = data["metadata"]
    if not meta.get("uid"):
        return None
    return {
        "apiVersion": data["apiVersion"],
        "kind": data["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(
    name: str,
    namespace: str | None,
    owner: Resource | dict[str, Any],
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace or "default"}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    ref = owner_reference(owner)
    if ref:
        meta["ownerReferences"] = [ref]
    return meta


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


def hpa_for_playground(
    pg: Playground, backend: BackendRuntime, models: dict[str, OpenModel] | None = None
) -> dict[str, Any] | None:
    """autoscaling/v2 HPA on the Playground's scale subresource, as llmaz builds it.

    Only with ``elasticConfig`` and a scale trigger: the Playground's, else the one of the
    recommended config in use. ``maxReplicas`` defaults to 99999 (llmaz; the HPA requires one).
    """
    elastic = pg.spec.elastic_config
    if elastic is None:
        return None
    trigger = elastic.scale_trigger
    if trigger is None:
        cfg = planning.chosen_config_name(planning.Inputs(pg, models or {}, backend))
        for config in backend.spec.recommended_configs or []:
            if config.name == cfg and config.scale_trigger is not None:
                trigger = config.scale_trigger
    if trigger is None:
        return None
    spec: dict[str, Any] = {
        "scaleTargetRef": {
            "apiVersion": pg.api_version,
            "kind": "Playground",
            "name": pg.name,
        },
        "minReplicas": elastic.min_replicas,
        "maxReplicas": elastic.max_replicas if elastic.max_replicas is not None else 99999,
    }
    if trigger.hpa.metrics:
        spec["metrics"] = [m.to_dict() for m in trigger.hpa.metrics]
    if trigger.hpa.behavior:
        spec["behavior"] = trigger.hpa.behavior.to_dict()
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(pg.name, pg.namespace, pg),
        "spec": spec,
    }


def playground_objects(
    pg: Playground, models: dict[str, OpenModel], backend: BackendRuntime
) -> tuple[Service, list[dict[str, Any]]]:
    """(the Service model, [Service object, HPA object if any]) for one Playground."""
    service = service_for_playground(pg, models, backend)
    objects = [service_object(service)]
    hpa = hpa_for_playground(pg, backend, models)
    if hpa is not None:
        objects.append(hpa)
    return service, objects


# Service -> LeaderWorkerSet / Deployment + load-balancing Service ---------------------------


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {
        "name": name,
        "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}},
    }


def _credential_env(kind: str) -> list[dict[str, Any]]:
    return [_secret_env(n, s, k) for n, s, k in _CREDENTIALS.get(kind, [])]


def loader_args(model: OpenModel) -> list[str]:
    """``llmplane load-model`` arguments for a model (the source as flags)."""
    source = model.spec.source
    args = ["load-model"]
    if source.model_hub is not None:
        hub = source.model_hub
        args += ["--hub", hub.name, "--model-id", hub.model_id, "--revision", hub.revision]
        if hub.filename:
            args += ["--filename", hub.filename]
        for pattern in hub.allow_patterns or []:
            args += ["--allow-pattern", pattern]
        for pattern in hub.ignore_patterns or []:
            args += ["--ignore-pattern", pattern]
    else:
        assert source.uri is not None
        args += ["--uri", source.uri]
    return [*args, "--cache-dir", MODELS_ROOT]


def _loader_container(
    index: int, model: OpenModel, runner_env: list[dict[str, Any]], options: KubeOptions
) -> dict[str, Any]:
    env = [e for e in runner_env if e.get("name") not in _CREDENTIAL_NAMES]
    env += _credential_env(source_kind(model))
    container: dict[str, Any] = {
        "name": LOADER_NAME if index == 0 else f"{LOADER_NAME}-{index}",
        "image": options.image,
        "command": ["llmplane"],
        "args": loader_args(model),
        "volumeMounts": [{"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT_PATH}],
    }
    if env:
        container["env"] = env
    if options.image_pull_policy:
        container["imagePullPolicy"] = options.image_pull_policy
    return container


def _strip_probe_defaults(container: dict[str, Any]) -> None:
    for key in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = container.get(key)
        if isinstance(probe, dict):
            for field, default in _PROBE_DEFAULTS.items():
                if probe.get(field) == default:
                    del probe[field]


def _node_affinity(selectors: list[dict[str, str]]) -> dict[str, Any] | None:
    """Flavors' nodeSelectors: required = any flavor (OR of terms); preferred = listed order.

    A flavor without a nodeSelector fits any node, so then nothing is required.
    """
    terms = [
        {
            "matchExpressions": [
                {"key": k, "operator": "In", "values": [str(v)]} for k, v in sorted(sel.items())
            ]
        }
        for sel in selectors
    ]
    if not any(selectors):
        return None
    affinity: dict[str, Any] = {}
    if all(selectors):
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    if len(selectors) > 1:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": max(1, 100 - 10 * i), "preference": copy.deepcopy(term)}
            for i, (term, sel) in enumerate(zip(terms, selectors, strict=True))
            if sel
        ]
    return {"nodeAffinity": affinity}


def _inject(
    template: dict[str, Any],
    plan: WorkloadPlan,
    models: list[OpenModel],
    options: KubeOptions,
    serving: bool,
) -> dict[str, Any]:
    """Model loaders, volumes, credentials and flavor scheduling for one pod template."""
    template = copy.deepcopy(template)
    spec = template.setdefault("spec", {})
    runner = _runner(spec)
    runner_env = list(runner.get("env") or [])
    init = list(spec.get("initContainers") or [])
    volumes = list(spec.get("volumes") or [])
    mounts = list(runner.get("volumeMounts") or [])
    loads = False
    for index, model in enumerate(models):
        kind = source_kind(model)
        if kind == "host":
            path = split_uri(model.spec.source.uri or "")[1]
            name = "model-host" if index == 0 else f"model-host-{index}"
            volumes.append({"name": name, "hostPath": {"path": path}})
            mounts.append({"name": name, "mountPath": path, "readOnly": True})
        elif kind == "ollama":
            continue
        elif skips_loader(model):
            have = {e.get("name") for e in runner_env}
            runner_env += [e for e in _credential_env(kind) if e["name"] not in have]
        else:
            loads = True
            init.append(_loader_container(index, model, runner.get("env") or [], options))
    if loads:
        volumes.append({"name": MODEL_VOLUME, "emptyDir": {}})
        mounts.append({"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT_PATH, "readOnly": True})
    if runner_env:
        runner["env"] = runner_env
    if init:
        spec["initContainers"] = init
    if volumes:
        spec["volumes"] = volumes
    if mounts:
        runner["volumeMounts"] = mounts
    affinity = _node_affinity(plan.node_selectors)
    if affinity is not None:
        spec.setdefault("affinity", {}).update(affinity)
    for container in spec["containers"]:
        _strip_probe_defaults(container)
    if not serving:
        meta = template.get("metadata") or {}
        labels = meta.get("labels") or {}
        for key in (MODEL_NAME_LABEL, MODEL_FAMILY_LABEL):
            labels.pop(key, None)
    return template


def plan_for(
    service: Service, models: dict[str, OpenModel], backend: BackendRuntime | None
) -> WorkloadPlan:
    """The substrate-neutral plan of a Service with pod paths under ``/workspace/models``."""
    return planning.plan_service(service, models, backend, locate=pod_model_path)


def lb_service(service: Service, leader_selector: dict[str, str]) -> dict[str, Any]:
    """ClusterIP ``<name>-lb`` on 8080 in front of the serving (leader) pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service.name + LB_SUFFIX, service.namespace, service),
        "spec": {
            "type": "ClusterIP",
            "selector": leader_selector,
            "ports": [
                {
                    "name": "http",
                    "protocol": "TCP",
                    "port": CONTAINER_PORT,
                    "targetPort": CONTAINER_PORT,
                }
            ],
        },
    }


def workload_objects(
    service: Service,
    models: dict[str, OpenModel],
    backend: BackendRuntime | None,
    options: KubeOptions | None = None,
) -> list[dict[str, Any]]:
    """[LeaderWorkerSet or Deployment, ``<name>-lb`` Service] for one inference Service."""
    options = options or KubeOptions()
    plan = plan_for(service, models, backend)
    claimed = [models[ref.name] for ref in service.spec.model_claims.models]
    data = dump_resource(service)
    template = data["spec"]["workloadTemplate"]
    size = int(template.get("size") or 1)
    multi = template.get("leaderTemplate") is not None
    worker = _inject(template["workerTemplate"], plan, claimed, options, serving=not multi)
    leader = (
        _inject(template["leaderTemplate"], plan, claimed, options, serving=True) if multi else None
    )
    if not options.use_leader_worker_set:
        if size > 1 or multi:
            raise PlanningError(
                f"Service/{service.name} is multi-host (size {size}): it needs LeaderWorkerSet "
                "(useLeaderWorkerSet: true)"
            )
        selector = {SERVICE_LABEL: service.name}
        worker.setdefault("metadata", {}).setdefault("labels", {}).update(selector)
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _metadata(service.name, service.namespace, service),
            "spec": {
                "replicas": service.spec.replicas,
                "selector": {"matchLabels": selector},
                "template": worker,
            },
        }
        return [deployment, lb_service(service, selector)]
    lwt: dict[str, Any] = {"size": size}
    if leader is not None:
        lwt["leaderTemplate"] = leader
    lwt["workerTemplate"] = worker
    for key in ("restartPolicy",):
        if template.get(key):
            lwt[key] = template[key]
    spec: dict[str, Any] = {
        "replicas": service.spec.replicas,
        "leaderWorkerTemplate": lwt,
        "startupPolicy": "LeaderReady",
    }
    rollout = data["spec"].get("rolloutStrategy")
    if rollout:
        spec["rolloutStrategy"] = rollout
    if template.get("subdomainPolicy"):
        spec["networkConfig"] = {"subdomainPolicy": template["subdomainPolicy"]}
    lws = {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": _metadata(service.name, service.namespace, service),
        "spec": spec,
    }
    leader_selector = {LWS_NAME_LABEL: service.name, LWS_WORKER_INDEX_LABEL: "0"}
    return [lws, lb_service(service, leader_selector)]


# Everything at once (render) ----------------------------------------------------------------


def objects_for(
    resources: Iterable[Resource],
    backends: Iterable[BackendRuntime] = (),
    options: KubeOptions | None = None,
) -> list[dict[str, Any]]:
    """Every object the operator would create for ``resources`` (Playgrounds and Services).

    ``backends`` are fallbacks (the built-ins) for backends ``resources`` do not define.
    Raises PlanningError naming the resource that cannot be planned.
    """
    resources = list(resources)
    models = {r.name: r for r in resources if isinstance(r, OpenModel)}
    by_backend: dict[str, BackendRuntime] = {b.name: b for b in backends}
    by_backend.update({r.name: r for r in resources if isinstance(r, BackendRuntime)})
    out: list[dict[str, Any]] = []
    for pg in (r for r in resources if isinstance(r, Playground)):
        backend_name = pg.spec.backend_runtime_config.backend_name
        backend = by_backend.get(backend_name)
        if backend is None:
            raise PlanningError(f"{pg.ref}: BackendRuntime {backend_name!r} not found")
        try:
            service, objects = playground_objects(pg, models, backend)
            out += objects
            out += workload_objects(service, models, backend, options)
        except PlanningError as err:
            raise PlanningError(f"{pg.ref}: {err}", err.reason) from None
    for service in (r for r in resources if isinstance(r, Service)):
        labels = service.metadata.labels or {}
        backend = by_backend.get(labels.get("inference.llmaz.io/backend-name", ""))
        try:
            out += workload_objects(service, models, backend, options)
        except PlanningError as err:
            raise PlanningError(f"{service.ref}: {err}", err.reason) from None
    return out


__all__ = [
    "KubeOptions",
    "hpa_for_playground",
    "lb_service",
    "objects_for",
    "owner_reference",
    "playground_objects",
    "pod_model_path",
    "service_for_playground",
    "service_object",
    "workload_objects",
]
