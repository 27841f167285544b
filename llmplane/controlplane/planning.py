"""Pure planning: Playground + OpenModels + BackendRuntime -> Service -> WorkloadPlan.

No I/O and no substrate knowledge: where model files live is passed in as ``locate``, so the
embedded controller (local cache paths) and the Kubernetes operator (``/workspace/models``)
share every rule here. Semantics follow llmaz (see ANCHORS.md); each function says where.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llmplane.api.base import ObjectMeta, OwnerReference
from llmplane.api.core import Probe
from llmplane.api.inference import BackendRuntime, Playground, Service
from llmplane.api.llmaz import ModelClaims, ModelRef, OpenModel, split_uri
from llmplane.controlplane.plan import (
    BACKEND_LABEL,
    FLAVORS_ANNOTATION,
    MODEL_FAMILY_LABEL,
    MODEL_NAME_LABEL,
    PLAYGROUND_LABEL,
    SERVICE_LABEL,
    HttpProbe,
    LocalLaunch,
    ModelFiles,
    WorkloadPlan,
)

CONTAINER_NAME = "model-runner"
CONTAINER_PORT = 8080
DEFAULT_CONFIG = "default"
DEFAULT_TERMINATION_GRACE = 30  # seconds a drained replica keeps its requests (Kubernetes')
SPECULATIVE_CONFIG = "speculative-decoding"
PARALLEL_CONFIG = "model-parallelism"
_VARIABLE = re.compile(r"\{\{\s*\.(\w+)\s*\}\}")

# Where a model's files are for the engine: (model, role) -> path rendered into {{ .ModelPath }}.
Locator = Callable[[OpenModel], str]


class PlanningError(Exception):
    """The resources are valid on their own but cannot be combined; shown on the status.

    ``reason`` becomes the condition reason (llmaz uses AbortProcessing for these).
    """

    def __init__(self, message: str, reason: str = "AbortProcessing"):
        super().__init__(message)
        self.reason = reason


def claims_of(playground: Playground) -> ModelClaims:
    """A modelClaim is shorthand for modelClaims with one main model."""
    spec = playground.spec
    if spec.model_claims is not None:
        return spec.model_claims
    assert spec.model_claim is not None  # validation guarantees exactly one
    return ModelClaims(
        models=[ModelRef(name=spec.model_claim.model_name, role="main")],
        inference_flavors=spec.model_claim.inference_flavors,
    )


def main_and_draft(claims: ModelClaims) -> tuple[str, str | None]:
    main = next(m.name for m in claims.models if m.role == "main")
    draft = next((m.name for m in claims.models if m.role == "draft"), None)
    return main, draft


def config_name(
    playground: Playground,
    claims: ModelClaims,
    pipeline_parallel: int = 1,
    known: set[str] | None = None,
) -> str:
    """Explicit configName, else speculative-decoding with a draft model, else
    model-parallelism when the first flavor asks for PP > 1 (and the backend has that config,
    as the blog's llama3-405b example needs), else default."""
    explicit = playground.spec.backend_runtime_config.config_name
    if explicit:
        return explicit
    if main_and_draft(claims)[1]:
        return SPECULATIVE_CONFIG
    if pipeline_parallel > 1 and (known is None or PARALLEL_CONFIG in known):
        return PARALLEL_CONFIG
    return DEFAULT_CONFIG


def chosen_config_name(inputs: Inputs) -> str:
    """The recommended config a Playground runs with (see ``config_name``)."""
    pg, backend = inputs.playground, inputs.backend
    claims = claims_of(pg)
    main = inputs.models.get(main_and_draft(claims)[0])
    flavors = select_flavors(main, claims.inference_flavors) if main else []
    params = dict(flavors[0].params or {}) if flavors else {}
    known = {c.name for c in backend.spec.recommended_configs or []}
    return config_name(pg, claims, _int_param(params, "PP"), known)


def served_model_name(model: OpenModel) -> str:
    """The name clients send: the OpenModel name, or the tag for ``ollama://TAG``."""
    uri = model.spec.source.uri
    if uri:
        try:
            proto, address = split_uri(uri)
        except ValueError as err:  # a row stored before the rule existed
            raise PlanningError(f"OpenModel/{model.name}: {err}") from None
        if proto == "ollama":
            return address
    return model.name


_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh"})


def script_index(command: list[str], args: list[str]) -> int | None:
    """Which of ``args`` a shell runs as its script when the command is ``sh -c`` (or bash,
    ...), else None: values rendered into a script must be quoted, everything else is argv."""
    if not command or command[0].rsplit("/", 1)[-1] not in _SHELLS:
        return None
    line = [*command[1:], *args]
    if "-c" not in line:
        return None
    position = line.index("-c") + 1 - (len(command) - 1)
    return position if 0 <= position < len(args) else None


def render(
    args: list[str], variables: dict[str, str], where: str, script: int | None = None
) -> list[str]:
    """Substitute ``{{ .Var }}``; an unknown or empty variable is an error naming it.

    In ``args[script]`` (a shell script) every value is shell-quoted, so nothing a resource
    holds can become shell syntax; elsewhere values stay single argv entries untouched.
    """

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in variables:
            known = ", ".join(sorted(variables))
            raise PlanningError(
                f"{where}: unknown template variable {{{{ .{name} }}}} (known: {known})"
            )
        value = variables[name]
        if value == "":
            raise PlanningError(f"{where}: template variable {{{{ .{name} }}}} is empty")
        return value

    def quoted(match: re.Match[str]) -> str:
        return shlex.quote(substitute(match))

    return [
        _VARIABLE.sub(quoted if index == script else substitute, arg)
        for index, arg in enumerate(args)
    ]


def select_flavors(model: OpenModel, wanted: list[str] | None) -> list[Any]:
    """The model's flavors in preference order, restricted to the claimed ones if any."""
    flavors = (model.spec.inference_config.flavors if model.spec.inference_config else None) or []
    if not wanted:
        return list(flavors)
    by_name = {f.name: f for f in flavors}
    missing = [n for n in wanted if n not in by_name]
    if missing:
        raise PlanningError(
            f"inferenceFlavors {missing} not found in OpenModel/{model.name} "
            f"(it has: {', '.join(by_name) or 'none'})"
        )
    return [by_name[n] for n in wanted]


def _int_param(params: dict[str, str], key: str) -> int:
    try:
        return max(int(params.get(key) or 1), 1)
    except ValueError:
        raise PlanningError(f"flavor param {key}={params[key]!r} must be an integer") from None


def _merge_resources(base: dict[str, Any], override: dict[str, Any] | None) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for section in ("limits", "requests"):
        for key, value in ((override or {}).get(section) or {}).items():
            merged.setdefault(section, {})[key] = value
    return merged


@dataclass(frozen=True)
class Inputs:
    playground: Playground
    models: dict[str, OpenModel]  # every claimed model by name
    backend: BackendRuntime


def missing_inputs(
    pg: Playground,
    models: Mapping[str, OpenModel],
    backend: BackendRuntime | None,
    known_backends: Iterable[str] | None = None,
) -> str | None:
    """Why a Playground cannot be planned yet (llmaz's AbortProcessing message), or None.

    Both substrates ask this before planning: a claimed OpenModel or the BackendRuntime does
    not exist (yet). ``known_backends``, when the caller has them, are named in the message.
    """
    missing = [m.name for m in claims_of(pg).models if m.name not in models]
    if missing:
        return f"Waiting for model creation: OpenModel {', '.join(missing)} not found"
    if backend is None:
        name = pg.spec.backend_runtime_config.backend_name
        known = (
            ""
            if known_backends is None
            else f" (known: {', '.join(sorted(known_backends)) or 'none'})"
        )
        return f"Waiting for BackendRuntime {name}{known}"
    return None


def name_taken(pg: Playground, service: Mapping[str, Any] | None) -> str | None:
    """llmaz's rule on both substrates: a Playground never takes over a Service of its name
    that it does not control (AbortProcessing with this message), else None."""
    if service is None:
        return None
    refs = (service.get("metadata") or {}).get("ownerReferences") or []
    if any(r.get("controller") and r.get("uid") == pg.metadata.uid for r in refs):
        return None
    return "Playground owns the same name with an existing Service"


def service_for_playground(inputs: Inputs, locate: Locator) -> Service:
    """The Service a Playground owns (same name), with llmaz's merge rules applied.

    - recommended config by configName (explicit, else inferred from the claims);
    - Playground args appended to the config's, all rendered;
    - envs: backend's, then the Playground's (same name: the Playground wins);
    - resources and sharedMemorySize: the Playground's overwrite the config's, per key;
    - the first flavor's limits overwrite accelerator resources (limits and requests).
    """
    pg, backend = inputs.playground, inputs.backend
    claims = claims_of(pg)
    main_name, draft_name = main_and_draft(claims)
    missing = [m.name for m in claims.models if m.name not in inputs.models]
    if missing:
        raise PlanningError(f"Waiting for model creation: OpenModel {', '.join(missing)} not found")
    main = inputs.models[main_name]
    flavors = select_flavors(main, claims.inference_flavors)
    params: dict[str, str] = {}
    for flavor in flavors[:1]:
        params.update(flavor.params or {})
    configs = {c.name: c for c in backend.spec.recommended_configs or []}
    cfg_name = chosen_config_name(inputs)
    if cfg_name not in configs:
        raise PlanningError(
            f"BackendRuntime/{backend.name} has no recommendedConfig named {cfg_name!r} "
            f"(it has: {', '.join(configs) or 'none'})"
        )
    config = configs[cfg_name]

    variables = {"ModelPath": locate(main), "ModelName": served_model_name(main)}
    if draft_name:
        variables["DraftModelPath"] = locate(inputs.models[draft_name])
    for key in ("TP", "PP"):
        if key in params:
            variables[key] = params[key]
    runtime_config = pg.spec.backend_runtime_config
    where = f"BackendRuntime/{backend.name} recommendedConfig {cfg_name!r}"
    config_args = list(config.args or [])
    script = script_index(list(backend.spec.command or []), config_args)
    args = render(config_args, variables, where, script)
    # The Playground's args come after the script: a shell's positional parameters, not code.
    args += render(list(runtime_config.args or []), variables, f"Playground/{pg.name} args")

    envs: dict[str, dict[str, Any]] = {}
    for env in [*(backend.spec.envs or []), *(runtime_config.envs or [])]:
        envs[env.name] = env.to_dict()

    resources = _merge_resources(
        config.resources.to_dict() if config.resources else {},
        runtime_config.resources.to_dict() if runtime_config.resources else None,
    )
    for flavor in flavors[:1]:
        for key, value in (flavor.limits or {}).items():
            resources.setdefault("limits", {})[key] = value
            resources.setdefault("requests", {})[key] = value
    shm = runtime_config.shared_memory_size or config.shared_memory_size

    labels = {
        MODEL_NAME_LABEL: main.name,
        MODEL_FAMILY_LABEL: main.spec.family_name,
        SERVICE_LABEL: pg.name,
        PLAYGROUND_LABEL: pg.name,
        BACKEND_LABEL: backend.name,
    }
    annotations = {}
    if flavors:
        annotations[FLAVORS_ANNOTATION] = ",".join(f.name for f in flavors)
    version = runtime_config.version or backend.spec.version
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": f"{backend.spec.image}:{version}",
        "args": args,
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT}],
    }
    if backend.spec.command:
        container["command"] = list(backend.spec.command)
    if envs:
        container["env"] = list(envs.values())
    if resources:
        container["resources"] = resources
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        value = getattr(backend.spec, _snake(probe))
        if value is not None:
            container[probe] = value.to_dict()
    if backend.spec.lifecycle:
        container["lifecycle"] = backend.spec.lifecycle.to_dict()
    pod_spec: dict[str, Any] = {"containers": [container]}
    grace = pg.spec.llmplane.termination_grace_period_seconds if pg.spec.llmplane else None
    if grace is not None:
        pod_spec["terminationGracePeriodSeconds"] = grace
    if shm:
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
        pod_spec["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}]
    size = _int_param(params, "PP")
    template = {
        "size": max(size, 1),
        "workerTemplate": {
            "metadata": {"labels": labels, "annotations": annotations or None},
            "spec": pod_spec,
        },
    }
    if not annotations:
        del template["workerTemplate"]["metadata"]["annotations"]
    owner = OwnerReference(
        api_version=pg.api_version,
        kind="Playground",
        name=pg.name,
        uid=pg.metadata.uid or "",
        controller=True,
        block_owner_deletion=True,
    )
    return Service.model_validate(
        {
            "apiVersion": "inference.llmaz.io/v1alpha1",
            "kind": "Service",
            "metadata": ObjectMeta(
                name=pg.name,
                namespace=pg.namespace,
                labels={**labels},
                annotations=annotations or None,
                owner_references=[owner],
            ).to_dict(),
            "spec": {
                "modelClaims": claims.to_dict(),
                "replicas": pg.spec.replicas,
                "workloadTemplate": template,
            },
        }
    )


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _http_probe(probe: Probe | None, health_path: str | None) -> HttpProbe | None:
    if probe is None or probe.http_get is None:
        return None
    return HttpProbe(
        path=health_path or probe.http_get.path or "/",
        port=probe.http_get.port,
        initial_delay_seconds=probe.initial_delay_seconds,
        period_seconds=probe.period_seconds,
        timeout_seconds=probe.timeout_seconds,
        success_threshold=probe.success_threshold,
        failure_threshold=probe.failure_threshold,
    )


def plan_service(
    service: Service,
    models: dict[str, OpenModel],
    backend: BackendRuntime | None,
    locate: Locator,
    local_command: list[str] | None = None,
) -> WorkloadPlan:
    """The workload a Service describes. ``local_command`` replaces the container command
    on the embedded runtime (resolved from the backend's ``local`` section by the caller)."""
    template = service.spec.workload_template
    pod = template.worker_template
    container = next(
        (c for c in pod.spec.containers if c.name == CONTAINER_NAME), pod.spec.containers[0]
    )
    labels = dict(pod.metadata.labels or {}) if pod.metadata else {}
    annotations = dict(pod.metadata.annotations or {}) if pod.metadata else {}
    main_name = main_and_draft(service.spec.model_claims)[0]
    model_files = []
    for ref in service.spec.model_claims.models:
        model = models.get(ref.name)
        if model is None:
            raise PlanningError(f"Waiting for model creation: OpenModel {ref.name} not found")
        model_files.append(
            ModelFiles(
                name=ref.name, role=ref.role, source=model.spec.source.to_dict(), path=locate(model)
            )
        )
    main = models[main_name]
    env = {e.name: e.value for e in container.env or [] if e.value is not None}
    env_from = [e.to_dict() for e in container.env or [] if e.value_from is not None]
    args = list(container.args or [])
    health_path = backend.spec.local.health_path if backend and backend.spec.local else None
    install_hint = backend.spec.local.install_hint if backend and backend.spec.local else None
    if local_command is None and container.command:
        local_command = list(container.command)
    local = (
        LocalLaunch(
            argv=[*local_command, *args], install_hint=install_hint, health_path=health_path
        )
        if local_command
        else None
    )
    flavor_names = [n for n in annotations.get(FLAVORS_ANNOTATION, "").split(",") if n]
    flavors = {f.name: f for f in select_flavors(main, None)}
    node_selectors = [dict(flavors[n].node_selector or {}) for n in flavor_names if n in flavors]
    flavor_limits = (
        dict(flavors[flavor_names[0]].limits or {})
        if flavor_names and flavor_names[0] in flavors
        else {}
    )
    volumes = pod.spec.volumes or []
    shm = next(
        (v.get("emptyDir", {}).get("sizeLimit") for v in volumes if v.get("name") == "dshm"),
        None,
    )
    multi = backend.spec.multi_host_commands if backend else None
    return WorkloadPlan(
        namespace=service.namespace or "default",
        name=service.name,
        replicas=service.spec.replicas,
        model_name=served_model_name(main),
        backend=backend.name if backend else labels.get(BACKEND_LABEL, "custom"),
        image=container.image or "",
        command=list(container.command or []),
        args=args,
        env=env,
        env_from=env_from,
        resources=container.resources.to_dict() if container.resources else {},
        shared_memory_size=str(shm) if shm is not None else None,
        labels=labels,
        annotations=annotations,
        models=model_files,
        startup_probe=_http_probe(container.startup_probe, health_path),
        readiness_probe=_http_probe(container.readiness_probe, health_path),
        liveness_probe=_http_probe(container.liveness_probe, health_path),
        lifecycle=container.lifecycle.to_dict() if container.lifecycle else None,
        size=template.size,
        leader_command=list(multi.leader) if multi and multi.leader else None,
        worker_command=list(multi.worker) if multi and multi.worker else None,
        node_selectors=node_selectors,
        flavor_limits=flavor_limits,
        flavor_options=[
            {"name": n, "limits": dict(flavors[n].limits or {})}
            for n in flavor_names
            if n in flavors
        ],
        local=local,
        termination_grace_seconds=(
            pod.spec.termination_grace_period_seconds
            if pod.spec.termination_grace_period_seconds is not None
            else DEFAULT_TERMINATION_GRACE
        ),
    )


__all__ = [
    "Inputs",
    "PlanningError",
    "claims_of",
    "config_name",
    "plan_service",
    "render",
    "served_model_name",
    "service_for_playground",
]
