"""Kubernetes core types embedded in llmaz resources, with the fields users write.

Pod specs are large and evolve with Kubernetes; ``PodSpec`` and ``Container`` model what
llmplane reads (containers, env, resources, probes, volumes by name) and keep any other
field verbatim so a valid Kubernetes pod template is never rejected here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import ConfigDict, Field

from llmplane.api.base import ApiModel, Violation, check_labels, join_path
from llmplane.api.units import Quantity, ResourceList, parse_quantity

IntOrString = int | str


class ObjectFieldSelector(ApiModel):
    field_path: str
    api_version: str | None = None


class KeySelector(ApiModel):
    key: str
    name: str | None = None
    optional: bool | None = None


class ResourceFieldSelector(ApiModel):
    resource: str
    container_name: str | None = None
    divisor: Quantity | None = None


class EnvVarSource(ApiModel):
    field_ref: ObjectFieldSelector | None = None
    resource_field_ref: ResourceFieldSelector | None = None
    config_map_key_ref: KeySelector | None = None
    secret_key_ref: KeySelector | None = None


class EnvVar(ApiModel):
    name: str = Field(min_length=1)
    value: str | None = None
    value_from: EnvVarSource | None = None

    def check(self, path: str) -> Iterator[Violation]:
        if self.value is not None and self.value_from is not None:
            yield Violation(path, "may not have both value and valueFrom")


class HTTPHeader(ApiModel):
    name: str
    value: str


class HTTPGetAction(ApiModel):
    path: str | None = None
    port: IntOrString
    host: str | None = None
    scheme: Literal["HTTP", "HTTPS"] | None = None
    http_headers: list[HTTPHeader] | None = None


class ExecAction(ApiModel):
    command: list[str] | None = None


class TCPSocketAction(ApiModel):
    port: IntOrString
    host: str | None = None


class GRPCAction(ApiModel):
    port: int
    service: str | None = None


class Probe(ApiModel):
    """core/v1 Probe; defaults as Kubernetes applies them."""

    http_get: HTTPGetAction | None = None
    exec: ExecAction | None = None
    tcp_socket: TCPSocketAction | None = None
    grpc: GRPCAction | None = None
    initial_delay_seconds: int = Field(default=0, ge=0)
    timeout_seconds: int = Field(default=1, ge=1)
    period_seconds: int = Field(default=10, ge=1)
    success_threshold: int = Field(default=1, ge=1)
    failure_threshold: int = Field(default=3, ge=1)
    termination_grace_period_seconds: int | None = None

    def check(self, path: str) -> Iterator[Violation]:
        handlers = [h for h in (self.http_get, self.exec, self.tcp_socket, self.grpc) if h]
        if len(handlers) != 1:
            yield Violation(path, "must specify exactly one of httpGet, exec, tcpSocket or grpc")


class SleepAction(ApiModel):
    seconds: int = Field(ge=0)


class LifecycleHandler(ApiModel):
    exec: ExecAction | None = None
    http_get: HTTPGetAction | None = None
    tcp_socket: TCPSocketAction | None = None
    sleep: SleepAction | None = None


class Lifecycle(ApiModel):
    post_start: LifecycleHandler | None = None
    pre_stop: LifecycleHandler | None = None


class ResourceRequirements(ApiModel):
    """Requests may not exceed limits (Kubernetes and llmaz both reject it)."""

    limits: ResourceList | None = None
    requests: ResourceList | None = None

    def check(self, path: str) -> Iterator[Violation]:
        for name, request in (self.requests or {}).items():
            limit = (self.limits or {}).get(name)
            if limit is not None and parse_quantity(request) > parse_quantity(limit):
                yield Violation(
                    join_path(join_path(path, "requests"), name),
                    f"must be less than or equal to the limit ({limit})",
                )


class ContainerPort(ApiModel):
    container_port: int = Field(ge=1, le=65535)
    name: str | None = None
    protocol: Literal["TCP", "UDP", "SCTP"] | None = None
    host_port: int | None = None
    host_ip: str | None = Field(default=None, alias="hostIP")


class VolumeMount(ApiModel):
    name: str
    mount_path: str
    read_only: bool | None = None
    sub_path: str | None = None


class Container(ApiModel):
    """A container: the fields llmplane reads are typed; the rest pass through unchanged."""

    model_config = ConfigDict(extra="allow")

    name: str
    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None
    ports: list[ContainerPort] | None = None
    resources: ResourceRequirements | None = None
    volume_mounts: list[VolumeMount] | None = None
    liveness_probe: Probe | None = None
    readiness_probe: Probe | None = None
    startup_probe: Probe | None = None
    lifecycle: Lifecycle | None = None


class PodSpec(ApiModel):
    model_config = ConfigDict(extra="allow")

    containers: list[Container] = Field(min_length=1)
    init_containers: list[Container] | None = None
    volumes: list[dict[str, Any]] | None = None
    node_selector: dict[str, str] | None = None
    termination_grace_period_seconds: int | None = Field(default=None, ge=0, le=86400)


class TemplateMeta(ApiModel):
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None

    def check(self, path: str) -> Iterator[Violation]:
        yield from check_labels(self.labels, join_path(path, "labels"))


class PodTemplateSpec(ApiModel):
    metadata: TemplateMeta | None = None
    spec: PodSpec


class LeaderWorkerTemplate(ApiModel):
    """sigs.k8s.io/lws LeaderWorkerTemplate."""

    leader_template: PodTemplateSpec | None = None
    worker_template: PodTemplateSpec
    size: int = Field(default=1, ge=1)
    restart_policy: Literal["RecreateGroupOnPodRestart", "Default", "None"] | None = None
    subdomain_policy: Literal["Shared", "UniquePerReplica"] | None = None


class RollingUpdateConfiguration(ApiModel):
    partition: int | None = Field(default=None, ge=0)
    max_unavailable: IntOrString = 1
    max_surge: IntOrString = 0


class RolloutStrategy(ApiModel):
    type: Literal["RollingUpdate"] = "RollingUpdate"
    rolling_update_configuration: RollingUpdateConfiguration | None = None


# autoscaling/v2 ---------------------------------------------------------------------------


class MetricTarget(ApiModel):
    type: Literal["Utilization", "Value", "AverageValue"]
    value: Quantity | None = None
    average_value: Quantity | None = None
    average_utilization: int | None = Field(default=None, ge=1)


class LabelSelectorRequirement(ApiModel):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = None


class LabelSelector(ApiModel):
    match_labels: dict[str, str] | None = None
    match_expressions: list[LabelSelectorRequirement] | None = None


class MetricIdentifier(ApiModel):
    name: str
    selector: LabelSelector | None = None


class CrossVersionObjectReference(ApiModel):
    kind: str
    name: str
    api_version: str | None = None


class ResourceMetricSource(ApiModel):
    name: str
    target: MetricTarget


class ContainerResourceMetricSource(ApiModel):
    name: str
    container: str
    target: MetricTarget


class PodsMetricSource(ApiModel):
    metric: MetricIdentifier
    target: MetricTarget


class ObjectMetricSource(ApiModel):
    described_object: CrossVersionObjectReference
    metric: MetricIdentifier
    target: MetricTarget


class ExternalMetricSource(ApiModel):
    metric: MetricIdentifier
    target: MetricTarget


class MetricSpec(ApiModel):
    type: Literal["Object", "Pods", "Resource", "ContainerResource", "External"]
    object: ObjectMetricSource | None = None
    pods: PodsMetricSource | None = None
    resource: ResourceMetricSource | None = None
    container_resource: ContainerResourceMetricSource | None = None
    external: ExternalMetricSource | None = None

    def check(self, path: str) -> Iterator[Violation]:
        member = {
            "Object": self.object,
            "Pods": self.pods,
            "Resource": self.resource,
            "ContainerResource": self.container_resource,
            "External": self.external,
        }[self.type]
        if member is None:
            field = self.type[0].lower() + self.type[1:]
            yield Violation(join_path(path, field), f"must be set when type is {self.type}")


class HPAScalingPolicy(ApiModel):
    type: Literal["Pods", "Percent"]
    value: int = Field(ge=1)
    period_seconds: int = Field(ge=1, le=1800)


class HPAScalingRules(ApiModel):
    stabilization_window_seconds: int | None = Field(default=None, ge=0, le=3600)
    select_policy: Literal["Max", "Min", "Disabled"] | None = None
    policies: list[HPAScalingPolicy] | None = None
    tolerance: Quantity | None = None


class HorizontalPodAutoscalerBehavior(ApiModel):
    scale_up: HPAScalingRules | None = None
    scale_down: HPAScalingRules | None = None
