"""What a runtime must realise: the substrate-neutral result of planning a Service.

Planning (``planning.py``) is pure and produces these; ``runtime/local.py`` turns them into
supervised processes and ``runtime/kube.py`` into LeaderWorkerSets. Nothing here knows which.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

# Labels every replica carries; the gateway selects replicas by these.
MODEL_NAME_LABEL = "llmaz.io/model-name"
MODEL_FAMILY_LABEL = "llmaz.io/model-family-name"
SERVICE_LABEL = "inference.llmaz.io/service-name"
PLAYGROUND_LABEL = "inference.llmaz.io/playground-name"
BACKEND_LABEL = "inference.llmaz.io/backend-name"
REPLICA_LABEL = "llmplane.io/replica-index"
# Disaggregated Playgrounds: which role a replica has, and the group the gateway pairs within.
ROLE_LABEL = "llmplane.io/role"
PD_GROUP_LABEL = "llmplane.io/pd-group"
FLAVORS_ANNOTATION = "llmaz.io/inference-service-flavors"
SKIP_LOADER_ANNOTATION = "llmaz.io/skip-model-loader"


@dataclass(frozen=True)
class HttpProbe:
    """An httpGet probe with Kubernetes' timing fields (seconds)."""

    path: str
    port: int | str
    initial_delay_seconds: int = 0
    period_seconds: int = 10
    timeout_seconds: int = 1
    success_threshold: int = 1
    failure_threshold: int = 3


@dataclass(frozen=True)
class ModelFiles:
    """A model a replica needs on disk before it starts."""

    name: str
    role: str  # main | draft
    source: dict[str, Any]  # the OpenModel's spec.source in wire form
    path: str  # where the engine reads it (rendered into {{ .ModelPath }})


@dataclass(frozen=True)
class LocalLaunch:
    """How the embedded runtime starts the engine on this machine."""

    argv: list[str]  # full command line: local command + rendered args
    install_hint: str | None = None
    health_path: str | None = None  # overrides probe paths locally (e.g. llama_cpp.server)


@dataclass(frozen=True)
class WorkloadPlan:
    """One Service: ``replicas`` identical groups of ``size`` hosts running one engine."""

    namespace: str
    name: str
    replicas: int
    model_name: str  # served model name (what clients put in "model")
    backend: str
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    env_from: list[dict[str, Any]] = field(default_factory=list)  # valueFrom entries (Kubernetes)
    resources: dict[str, Any] = field(default_factory=dict)
    shared_memory_size: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    models: list[ModelFiles] = field(default_factory=list)
    startup_probe: HttpProbe | None = None
    readiness_probe: HttpProbe | None = None
    liveness_probe: HttpProbe | None = None
    lifecycle: dict[str, Any] | None = None
    size: int = 1  # hosts per replica (pipeline parallel degree)
    leader_command: list[str] | None = None
    worker_command: list[str] | None = None
    node_selectors: list[dict[str, str]] = field(default_factory=list)  # flavor preference order
    flavor_limits: dict[str, Any] = field(default_factory=dict)
    # Every claimed flavor in priority order: {"name": ..., "limits": {...}} (local GPU placement).
    flavor_options: list[dict[str, Any]] = field(default_factory=list)
    local: LocalLaunch | None = None
    # Draining: seconds for requests to finish, then the gateway hands streams over.
    termination_grace_seconds: int = 30

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def template_hash(self) -> str:
        """Changes when a replica must be restarted (everything but the replica count).

        Computed once per plan (a plan is never changed once built): status reads ask for it
        per replica, and ``asdict`` of a plan costs tens of microseconds."""
        cached = self.__dict__.get("_template_hash")
        if cached is None:
            data = asdict(self)
            data.pop("replicas")
            digest = hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()
            cached = digest[:16]
            object.__setattr__(self, "_template_hash", cached)
        return cached
