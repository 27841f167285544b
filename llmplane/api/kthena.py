"""``networking.serving.volcano.sh/v1alpha1``: Kthena's ModelRoute and ModelServer.

Every enum, bound and default of the Kthena API reference, plus the rules a user expects the
router to enforce up front (one StringMatch kind, regexes that compile, Redis ``host:port``,
complete PD groups, label syntax, positive timeouts) instead of failing at request time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import ClassVar, Literal

from pydantic import Field

from llmplane.api.base import (
    DNS1123_LABEL,
    ApiModel,
    ConditionedStatus,
    Resource,
    Violation,
    check_labels,
    join_path,
)
from llmplane.api.gie import Group, Kind, ObjectName, PortNumber
from llmplane.api.units import Duration, parse_duration

KTHENA_GROUP = "networking.serving.volcano.sh"
KTHENA_VERSION = "v1alpha1"
_API_VERSION = "networking.serving.volcano.sh/v1alpha1"

MAX_LORA_ADAPTERS = 10
MAX_RULES = 16
MAX_TARGET_MODELS = 16
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1

RateLimitUnit = Literal["second", "minute", "hour", "day", "month"]
# Seconds per rate-limit unit; a month is 30 days, as in Kthena's limiter.
UNIT_SECONDS: dict[str, int] = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86400,
    "month": 30 * 86400,
}

# RFC 9110 token: what an HTTP header name may contain.
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def _duration_seconds(value: str | None) -> float | None:
    return None if value is None else parse_duration(value)


# ModelRoute ----------------------------------------------------------------------------------


class StringMatch(ApiModel):
    """Exactly one of ``exact``, ``prefix`` or ``regex`` (Python ``re`` syntax)."""

    exact: str | None = None
    prefix: str | None = None
    regex: str | None = None

    def check(self, path: str) -> Iterator[Violation]:
        given = [n for n in ("exact", "prefix", "regex") if getattr(self, n) is not None]
        if len(given) != 1:
            got = f"got {', '.join(given)}" if given else "got none"
            yield Violation(path, f"exactly one of exact, prefix or regex must be set ({got})")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except (re.error, OverflowError, RecursionError) as err:
                yield Violation(
                    join_path(path, "regex"),
                    f"is not a valid regular expression (Python re syntax): {err}",
                )


class BodyMatch(ApiModel):
    model: str | None = None


class ModelMatch(ApiModel):
    """Conditions ANDed together; an empty match matches every request."""

    headers: dict[str, StringMatch] | None = None
    uri: StringMatch | None = None
    body: BodyMatch | None = None

    def check(self, path: str) -> Iterator[Violation]:
        for name in self.headers or {}:
            if not _HEADER_NAME.match(name):
                yield Violation(
                    join_path(join_path(path, "headers"), name),
                    "is not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~)",
                )
        if self.uri is not None:
            for kind in ("exact", "prefix"):
                value = getattr(self.uri, kind)
                if value is not None and not value.startswith("/"):
                    yield Violation(
                        join_path(join_path(path, "uri"), kind),
                        f"must start with '/' (a request path such as /v1/chat/completions), got {value!r}",
                    )


class RouteTargetModel(ApiModel):
    """A ModelServer in the route's namespace and its weight (0..100, default 100)."""

    model_server_name: str
    weight: int = Field(default=100, ge=0, le=100)

    def check(self, path: str) -> Iterator[Violation]:
        name = self.model_server_name
        if not name or len(name) > 63 or not DNS1123_LABEL.match(name):
            yield Violation(
                join_path(path, "modelServerName"),
                f"{name!r} must be the name of a ModelServer: a DNS-1123 label (at most 63 "
                "lowercase alphanumeric characters or '-', starting and ending with an "
                "alphanumeric character)",
            )


class Rule(ApiModel):
    name: str | None = None
    model_match: ModelMatch | None = None
    target_models: list[RouteTargetModel] = Field(min_length=1, max_length=MAX_TARGET_MODELS)


class RedisConfig(ApiModel):
    address: str

    def check(self, path: str) -> Iterator[Violation]:
        try:
            split_host_port(self.address)
        except ValueError as err:
            yield Violation(join_path(path, "address"), str(err))


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` (``[ipv6]:port`` too) as ``(host, port)``; ValueError names the rule."""
    example = "must be host:port such as redis.default.svc:6379"
    if "://" in address:
        raise ValueError(f"{address!r} {example}, without a scheme")
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{address!r} {example} (write IPv6 hosts in brackets: [::1]:6379)")
    if not sep or not host or any(c.isspace() for c in host):
        raise ValueError(f"{address!r} {example}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{address!r} {example}; the port must be a number from 1 to 65535")
    return host, int(port)


class GlobalRateLimit(ApiModel):
    redis: RedisConfig | None = None

    def check(self, path: str) -> Iterator[Violation]:
        if self.redis is None:
            yield Violation(
                join_path(path, "redis"),
                "is required for a global rate limit (remove global for per-gateway limits)",
            )


class RateLimit(ApiModel):
    input_tokens_per_unit: int | None = Field(default=None, ge=1, le=UINT32_MAX)
    output_tokens_per_unit: int | None = Field(default=None, ge=1, le=UINT32_MAX)
    unit: RateLimitUnit = "second"
    global_: GlobalRateLimit | None = Field(default=None, alias="global")

    def check(self, path: str) -> Iterator[Violation]:
        if self.input_tokens_per_unit is None and self.output_tokens_per_unit is None:
            yield Violation(
                path,
                "set inputTokensPerUnit or outputTokensPerUnit (or remove rateLimit): "
                "without either nothing is limited",
            )

    @property
    def unit_seconds(self) -> int:
        return UNIT_SECONDS[self.unit]


class ParentReference(ApiModel):
    """Gateway API ParentReference: the Gateway a route attaches to (upstream ``parentRefs``)."""

    group: Group = "gateway.networking.k8s.io"
    kind: Kind = "Gateway"
    namespace: str | None = None
    name: ObjectName
    section_name: str | None = None
    port: PortNumber | None = None


class ModelRouteSpec(ApiModel):
    model_name: str | None = None
    lora_adapters: list[str] | None = Field(default=None, max_length=MAX_LORA_ADAPTERS)
    parent_refs: list[ParentReference] | None = None
    rules: list[Rule] = Field(min_length=1, max_length=MAX_RULES)
    rate_limit: RateLimit | None = None

    def check(self, path: str) -> Iterator[Violation]:
        if not self.model_name and not self.lora_adapters:
            yield Violation(path, "modelName and loraAdapters cannot both be empty")
        for i, adapter in enumerate(self.lora_adapters or []):
            if not adapter:
                yield Violation(
                    join_path(join_path(path, "loraAdapters"), i),
                    "must not be empty (a LoRA adapter name as requests send it in model)",
                )


class ModelRoute(Resource):
    group: ClassVar[str] = KTHENA_GROUP
    version: ClassVar[str] = KTHENA_VERSION
    plural: ClassVar[str] = "modelroutes"
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("MODEL", "string", ".spec.modelName"),
        ("LORA-ADAPTERS", "string", ".spec.loraAdapters"),
    )

    api_version: Literal["networking.serving.volcano.sh/v1alpha1"] = _API_VERSION
    kind: Literal["ModelRoute"] = "ModelRoute"
    spec: ModelRouteSpec
    status: ConditionedStatus | None = None


# ModelServer ---------------------------------------------------------------------------------


class PDGroup(ApiModel):
    """Prefill/decode pods pair up when their ``groupKey`` label has the same value."""

    group_key: str
    prefill_labels: dict[str, str]
    decode_labels: dict[str, str]

    def check(self, path: str) -> Iterator[Violation]:
        key_path = join_path(path, "groupKey")
        if not self.group_key:
            yield Violation(
                key_path,
                "must not be empty (a pod label key such as leaderworkerset.sigs.k8s.io/group-index)",
            )
        else:
            yield from (
                Violation(key_path, v.message) for v in check_labels({self.group_key: ""}, key_path)
            )
        for name, labels in (
            ("prefillLabels", self.prefill_labels),
            ("decodeLabels", self.decode_labels),
        ):
            if not labels:
                yield Violation(join_path(path, name), "must have at least one label")
            yield from check_labels(labels, join_path(path, name))
        if self.prefill_labels and self.prefill_labels == self.decode_labels:
            yield Violation(
                join_path(path, "decodeLabels"),
                "must differ from prefillLabels (otherwise every pod is both prefill and decode)",
            )


class WorkloadSelector(ApiModel):
    match_labels: dict[str, str] | None = None
    pd_group: PDGroup | None = None

    def check(self, path: str) -> Iterator[Violation]:
        if not self.match_labels and self.pd_group is None:
            yield Violation(
                path,
                "set matchLabels or pdGroup: an empty selector matches every pod in the namespace",
            )
        yield from check_labels(self.match_labels, join_path(path, "matchLabels"))


class WorkloadPort(ApiModel):
    port: int = Field(ge=1, le=65535)
    protocol: Literal["http", "https"] = "http"


class Retry(ApiModel):
    attempts: int = Field(default=0, ge=0, le=INT32_MAX)
    retry_interval: Duration = "100ms"

    def check(self, path: str) -> Iterator[Violation]:
        if parse_duration(self.retry_interval) < 0:
            yield Violation(join_path(path, "retryInterval"), "must not be negative")

    @property
    def retry_interval_seconds(self) -> float:
        return parse_duration(self.retry_interval)


class TrafficPolicy(ApiModel):
    timeout: Duration | None = None
    retry: Retry | None = None

    def check(self, path: str) -> Iterator[Violation]:
        if self.timeout is not None and parse_duration(self.timeout) <= 0:
            yield Violation(
                join_path(path, "timeout"),
                "must be positive (leave timeout out for no timeout)",
            )

    @property
    def timeout_seconds(self) -> float | None:
        """The request timeout in seconds; None means no timeout."""
        return _duration_seconds(self.timeout)


class KVConnectorSpec(ApiModel):
    type: Literal["http", "lmcache", "nixl", "mooncake"] = "http"


class ModelServerSpec(ApiModel):
    model: str | None = Field(default=None, max_length=256)
    inference_engine: Literal["vLLM", "SGLang"]
    workload_selector: WorkloadSelector
    workload_port: WorkloadPort | None = None
    traffic_policy: TrafficPolicy | None = None
    kv_connector: KVConnectorSpec | None = None


class ModelServer(Resource):
    group: ClassVar[str] = KTHENA_GROUP
    version: ClassVar[str] = KTHENA_VERSION
    plural: ClassVar[str] = "modelservers"
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("MODEL", "string", ".spec.model"),
        ("ENGINE", "string", ".spec.inferenceEngine"),
        ("PORT", "integer", ".spec.workloadPort.port"),
        ("PROTOCOL", "string", ".spec.workloadPort.protocol"),
    )

    api_version: Literal["networking.serving.volcano.sh/v1alpha1"] = _API_VERSION
    kind: Literal["ModelServer"] = "ModelServer"
    spec: ModelServerSpec
    status: ConditionedStatus | None = None
