"""``inference.llmaz.io/v1alpha1``: Playground, Service and BackendRuntime."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from llmplane.api.base import (
    ApiModel,
    Condition,
    ConditionedStatus,
    Resource,
    Violation,
    join_path,
)
from llmplane.api.core import (
    EnvVar,
    HorizontalPodAutoscalerBehavior,
    LeaderWorkerTemplate,
    Lifecycle,
    MetricSpec,
    Probe,
    ResourceRequirements,
    RolloutStrategy,
)
from llmplane.api.llmaz import ModelClaim, ModelClaims
from llmplane.api.units import Quantity

INFERENCE_GROUP = "inference.llmaz.io"
_API_VERSION = "inference.llmaz.io/v1alpha1"


class HPATrigger(ApiModel):
    metrics: list[MetricSpec] | None = None
    behavior: HorizontalPodAutoscalerBehavior | None = None


class ScaleTrigger(ApiModel):
    hpa: HPATrigger


class ElasticConfig(ApiModel):
    """Replica bounds and the scale trigger, read by llmplane's autoscaler (embedded and in-cluster)."""

    min_replicas: int = Field(
        default=1,
        ge=0,
        description="Fewest replicas the autoscaler keeps. 0 (an llmplane extension) scales to "
        "zero: the last replica stops after scaleToZeroAfterSeconds without a request and the "
        "gateway holds the next request while a replica starts.",
    )
    max_replicas: int | None = Field(default=None, ge=0)
    scale_trigger: ScaleTrigger | None = None
    scale_to_zero_after_seconds: int | None = Field(
        default=None,
        ge=0,
        le=86400,
        description="llmplane extension, with minReplicas 0: seconds without any request before "
        "the last replica stops (default: the scale-down stabilization window, 300).",
    )

    def check(self, path: str) -> Iterator[Violation]:
        if self.scale_to_zero_after_seconds is not None and self.min_replicas > 0:
            yield Violation(
                join_path(path, "scaleToZeroAfterSeconds"),
                "only applies with minReplicas: 0",
            )
        if self.max_replicas is not None and self.min_replicas >= self.max_replicas:
            yield Violation(
                join_path(path, "minReplicas"),
                f"must be less than maxReplicas ({self.max_replicas})",
            )


class BackendRuntimeConfig(ApiModel):
    backend_name: str = Field(default="vllm", min_length=1)
    version: str | None = None
    envs: list[EnvVar] | None = None
    config_name: str | None = None
    args: list[str] | None = None
    resources: ResourceRequirements | None = None
    shared_memory_size: Quantity | None = None


class AdapterSource(ApiModel):
    """Where a LoRA adapter's files are: ``host:///abs/path`` (a directory the engine reads)."""

    uri: str = Field(min_length=1)


class LoraAdapter(ApiModel):
    """llmplane extension (``Playground.spec.loraAdapters``): a LoRA adapter of the Playground's
    model, routable by ``name``. The gateway loads it onto a replica through the engine's runtime
    adapter API the first time a request names it and no replica holds it, and unloads the least
    recently used adapter it loaded when a replica's adapter slots are full (vLLM needs
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and ``--enable-lora``)."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    source: AdapterSource

    def check(self, path: str) -> Iterator[Violation]:
        uri = self.source.uri
        if not uri.startswith("host:///"):
            yield Violation(
                join_path(join_path(path, "source"), "uri"),
                "LoRA adapters load from host:///ABSOLUTE/PATH (a directory on the engine's host)",
            )


ExtraKey = Annotated[str, Field(min_length=1, max_length=128)]
ExtraText = Annotated[str, Field(max_length=4096)]


class KVConnector(ApiModel):
    """How the KV cache of a prompt moves from the prefill replica to the decode replica.

    ``sharedStorage``: vLLM's ExampleConnector through a directory both roles see (one
    machine, or a shared volume); ``nixl``, ``lmcache``, ``mooncake``: vLLM's connectors of
    those names; ``offloading``: vLLM's OffloadingConnector (CPU memory, per replica)."""

    type: Literal["sharedStorage", "nixl", "lmcache", "mooncake", "offloading"] = "sharedStorage"
    extra_config: dict[ExtraKey, ExtraText | int | float | bool] | None = Field(
        default=None,
        max_length=32,
        description="Merged into vLLM's kv_connector_extra_config (e.g. num_cpu_blocks; "
        "shared_storage_path replaces the directory llmplane chooses).",
    )


class DisaggregatedRole(ApiModel):
    """One role (prefill or decode): its own replicas, engine args, envs, resources, flavors
    and bounds; everything else comes from the Playground (model, backendRuntimeConfig)."""

    replicas: int = Field(default=1, ge=0)
    args: list[str] | None = Field(
        default=None, description="Appended to the Playground's backendRuntimeConfig.args."
    )
    envs: list[EnvVar] | None = None
    resources: ResourceRequirements | None = None
    inference_flavors: list[str] | None = None
    elastic_config: ElasticConfig | None = None


class Disaggregation(ApiModel):
    """Prefill/decode disaggregation: two workloads of one model paired by the gateway."""

    kv_connector: KVConnector = Field(default_factory=KVConnector)
    prefill: DisaggregatedRole = Field(default_factory=DisaggregatedRole)
    decode: DisaggregatedRole = Field(default_factory=DisaggregatedRole)

    def check(self, path: str) -> Iterator[Violation]:
        zero = {
            role: bool(cfg.elastic_config and cfg.elastic_config.min_replicas == 0)
            for role, cfg in (("prefill", self.prefill), ("decode", self.decode))
        }
        if zero["prefill"] != zero["decode"]:
            one = "prefill" if zero["prefill"] else "decode"
            yield Violation(
                join_path(join_path(join_path(path, one), "elasticConfig"), "minReplicas"),
                "scale to zero applies to the pair: set minReplicas 0 on both roles or neither",
            )


class LlmplaneExtensions(ApiModel):
    """llmplane's own Playground fields, under one key llmaz will not use (``spec.llmplane``)."""

    disaggregation: Disaggregation | None = None
    # Seconds a replica being drained (scale-down, replacement, ``up`` stopping) keeps its
    # requests before the gateway hands its streams over to other replicas; the replicas'
    # pod template's ``terminationGracePeriodSeconds``. None: 30, as Kubernetes.
    termination_grace_period_seconds: int | None = Field(default=None, ge=0, le=86400)


class PlaygroundSpec(ApiModel):
    replicas: int = Field(default=1, ge=0)
    model_claim: ModelClaim | None = None
    model_claims: ModelClaims | None = None
    backend_runtime_config: BackendRuntimeConfig = Field(default_factory=BackendRuntimeConfig)
    elastic_config: ElasticConfig | None = None
    lora_adapters: list[LoraAdapter] | None = Field(default=None, max_length=256)
    llmplane: LlmplaneExtensions | None = None

    @property
    def disaggregation(self) -> Disaggregation | None:
        return self.llmplane.disaggregation if self.llmplane else None

    def check(self, path: str) -> Iterator[Violation]:
        if (self.model_claim is None) == (self.model_claims is None):
            yield Violation(path, "exactly one of modelClaim or modelClaims must be set")
        if self.disaggregation is not None:
            where = "with llmplane.disaggregation each role has its own"
            if self.replicas != 1:  # written back as 1 when left out: tolerated
                yield Violation(join_path(path, "replicas"), f"{where} replicas; leave it out")
            if self.elastic_config is not None:
                yield Violation(join_path(path, "elasticConfig"), f"{where} elasticConfig")
        names = [a.name for a in self.lora_adapters or []]
        for i, name in enumerate(names):
            if name in names[:i]:
                yield Violation(
                    join_path(join_path(join_path(path, "loraAdapters"), i), "name"),
                    f"adapter {name!r} is declared twice",
                )


class ScaleStatus(ApiModel):
    conditions: list[Condition] | None = None
    replicas: int = 0
    selector: str | None = None
    # llmplane addition: replicas passing their readiness probe (shown by `get`).
    ready_replicas: int | None = None


class Playground(Resource):
    group: ClassVar[str] = INFERENCE_GROUP
    version: ClassVar[str] = "v1alpha1"
    plural: ClassVar[str] = "playgrounds"
    short_names: ClassVar[tuple[str, ...]] = ("pl",)
    scale: ClassVar[tuple[str, str, str] | None] = (
        ".spec.replicas",
        ".status.replicas",
        ".status.selector",
    )
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("READY", "string", '.status.conditions[?(@.type=="Available")].status'),
        ("REPLICAS", "integer", ".status.replicas"),
        ("MODEL", "string", ".spec.modelClaim.modelName"),
        ("BACKEND", "string", ".spec.backendRuntimeConfig.backendName"),
    )
    # `llmplane get` only (a CRD column has one path): MODEL for Playgrounds with modelClaims.
    printer_fallbacks: ClassVar[dict[str, str]] = {
        "MODEL": '.spec.modelClaims.models[?(@.role=="main")].name'
    }

    api_version: Literal["inference.llmaz.io/v1alpha1"] = _API_VERSION
    kind: Literal["Playground"] = "Playground"
    spec: PlaygroundSpec
    status: ScaleStatus | None = None

    def check(self, path: str) -> Iterator[Violation]:
        # Role Services are named <name>-prefill / <name>-decode: still DNS-1123 labels.
        longest = 63 - len("-prefill")
        if self.spec.disaggregation is not None and len(self.name) > longest:
            yield Violation(
                join_path(join_path(path, "metadata"), "name"),
                f"at most {longest} characters with llmplane.disaggregation (its workloads are "
                "named <name>-prefill and <name>-decode)",
            )


class ServiceSpec(ApiModel):
    model_claims: ModelClaims
    replicas: int = Field(default=1, ge=0)
    workload_template: LeaderWorkerTemplate
    rollout_strategy: RolloutStrategy | None = None


class Service(Resource):
    group: ClassVar[str] = INFERENCE_GROUP
    version: ClassVar[str] = "v1alpha1"
    plural: ClassVar[str] = "services"
    short_names: ClassVar[tuple[str, ...]] = ("isvc",)
    scale: ClassVar[tuple[str, str, str] | None] = (
        ".spec.replicas",
        ".status.replicas",
        ".status.selector",
    )
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("REPLICAS", "integer", ".status.replicas"),
        ("READY", "string", '.status.conditions[?(@.type=="Available")].status'),
    )

    api_version: Literal["inference.llmaz.io/v1alpha1"] = _API_VERSION
    kind: Literal["Service"] = "Service"
    spec: ServiceSpec
    status: ScaleStatus | None = None


class RecommendedConfig(ApiModel):
    name: str = Field(min_length=1)
    args: list[str] | None = None
    resources: ResourceRequirements | None = None
    shared_memory_size: Quantity | None = None
    scale_trigger: ScaleTrigger | None = None


class MultiHostCommands(ApiModel):
    """Leader and worker commands for multi-host (LeaderWorkerSet) workloads."""

    leader: list[str] | None = None
    worker: list[str] | None = None


class LocalCommand(ApiModel):
    """llmplane extension: how the embedded runtime starts this engine on the local machine.

    ``command`` replaces the container command locally; ``installHint`` is shown when the
    engine is missing; ``healthPath`` replaces the probes' path when the local server differs
    from the container image (``python -m llama_cpp.server`` has no ``/health``).
    """

    command: list[str] = Field(min_length=1)
    install_hint: str | None = None
    health_path: str | None = None


class BackendRuntimeSpec(ApiModel):
    command: list[str] | None = None
    multi_host_commands: MultiHostCommands | None = None
    image: str = Field(min_length=1)
    version: str = Field(min_length=1)
    envs: list[EnvVar] | None = None
    lifecycle: Lifecycle | None = None
    liveness_probe: Probe | None = None
    readiness_probe: Probe | None = None
    startup_probe: Probe | None = None
    recommended_configs: list[RecommendedConfig] | None = None
    local: LocalCommand | None = None

    def check(self, path: str) -> Iterator[Violation]:
        seen: set[str] = set()
        for i, config in enumerate(self.recommended_configs or []):
            if config.name in seen:
                yield Violation(
                    join_path(join_path(join_path(path, "recommendedConfigs"), i), "name"),
                    f"duplicate recommended config name {config.name!r}",
                )
            seen.add(config.name)


class BackendRuntime(Resource):
    group: ClassVar[str] = INFERENCE_GROUP
    version: ClassVar[str] = "v1alpha1"
    plural: ClassVar[str] = "backendruntimes"
    short_names: ClassVar[tuple[str, ...]] = ("br",)
    namespaced: ClassVar[bool] = False
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("IMAGE", "string", ".spec.image"),
        ("VERSION", "string", ".spec.version"),
    )

    api_version: Literal["inference.llmaz.io/v1alpha1"] = _API_VERSION
    kind: Literal["BackendRuntime"] = "BackendRuntime"
    spec: BackendRuntimeSpec
    status: ConditionedStatus | None = None
