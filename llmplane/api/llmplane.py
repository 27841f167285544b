"""``llmplane.io/v1alpha1``: llmplane's own kinds.

``Endpoint`` registers a model server llmplane did not start (a vLLM already running
elsewhere) so ModelServers and InferencePools can select it by label, like a pod.

``Tenant`` is a caller of the gateway: its API keys (salted hashes only, see
``llmplane/gateway/apikeys.py``), the models it may use, the criticality its requests get and
its limits: ``rateLimit`` has the shape of ``ModelRoute.spec.rateLimit`` (so one shape is
learnt) plus ``requestsPerUnit`` and an optional token ``budget``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from llmplane.api.base import (
    DNS1123_SUBDOMAIN,
    ApiModel,
    ApiOwned,
    ConditionedStatus,
    Resource,
    Violation,
    check_labels,
    join_path,
)
from llmplane.api.gie import Criticality
from llmplane.api.kthena import UINT32_MAX, RateLimit, RateLimitUnit
from llmplane.runtime.endpoint import valid_events_address

LLMPLANE_GROUP = "llmplane.io"
_ADDRESS = re.compile(
    r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?)(:(\d{1,5}))?$"
)


class EndpointSpec(ApiModel):
    address: str = Field(min_length=1)
    model_name: str = Field(min_length=1)
    engine: Literal["vllm", "sim", "sglang", "llamacpp", "tgi", "openai"] = "vllm"
    labels: dict[str, str] | None = None
    fixed_port: bool = True
    # Its --max-num-seqs, if known: the gateway's queue estimate starts from it (else learned).
    max_num_seqs: int | None = Field(default=None, ge=1, le=1 << 20)
    # Its --scheduling-policy (vLLM's): with "priority" the gateway sends each request's
    # priority (its band, then its tenant's fair share); never to an fcfs engine.
    scheduling_policy: Literal["fcfs", "priority"] | None = None
    # Where it publishes its KV-cache events (vLLM's --kv-events-config endpoint, as the
    # gateway reaches it) and its replay endpoint: the gateway then routes by the blocks it
    # really holds (docs/gateway.md, precise prefix routing).
    kv_events: str | None = None
    kv_events_replay: str | None = None

    def check(self, path: str) -> Iterator[Violation]:
        address = self.address.removeprefix("http://").rstrip("/")
        match = _ADDRESS.match(address)
        if not match:
            yield Violation(
                join_path(path, "address"), "must be host:port or host (e.g. 10.0.0.5:8000)"
            )
        elif match.group(4) and not 1 <= int(match.group(4)) <= 65535:
            yield Violation(join_path(path, "address"), "port must be between 1 and 65535")
        yield from check_labels(self.labels, join_path(path, "labels"))
        for name, value in (
            ("kvEvents", self.kv_events),
            ("kvEventsReplay", self.kv_events_replay),
        ):
            if value is not None and not valid_events_address(value):
                yield Violation(
                    join_path(path, name),
                    "must be tcp://host:port or ipc:///path (where the engine publishes)",
                )


class Endpoint(Resource):
    group: ClassVar[str] = LLMPLANE_GROUP
    version: ClassVar[str] = "v1alpha1"
    plural: ClassVar[str] = "endpoints"
    short_names: ClassVar[tuple[str, ...]] = ("ep",)
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("ADDRESS", "string", ".spec.address"),
        ("MODEL", "string", ".spec.modelName"),
        ("ENGINE", "string", ".spec.engine"),
    )

    api_version: Literal["llmplane.io/v1alpha1"] = "llmplane.io/v1alpha1"
    kind: Literal["Endpoint"] = "Endpoint"
    spec: EndpointSpec
    status: ConditionedStatus | None = None


# Tenant -----------------------------------------------------------------------------------------

KEY_ID = re.compile(r"^[a-z0-9]{12}$")
_HEX = re.compile(r"^[0-9a-f]+$")
_MODEL_PATTERN = re.compile(r"^[\x21-\x7e]{1,256}$")  # printable, no spaces
API_KEY_SECRET_LABEL = "llmplane.io/api-key"


class SecretReference(ApiModel):
    """A Secret in the Tenant's namespace holding a key's ``salt`` and ``hash`` (the CRD path:
    the hash lives in a Secret, not in the Tenant). The Secret must carry the label
    ``llmplane.io/api-key`` (any value): the gateway watches only Secrets with it."""

    name: str = Field(min_length=1, max_length=253)

    def check(self, path: str) -> Iterator[Violation]:
        if not DNS1123_SUBDOMAIN.match(self.name):
            yield Violation(
                join_path(path, "name"),
                "must be a Secret name (lowercase letters, digits, '-' and '.')",
            )


class ApiKey(ApiModel):
    """One key of a tenant, as stored: never the key itself, only its salted hash.

    ``id`` is the key's public part (also inside the key, ``llmp-<id>-<secret>``): what
    ``llmplane keys list`` shows and what the gateway indexes keys by. The salt and hash are
    either here or, on Kubernetes, in a Secret named by ``secretRef``.
    """

    id: str
    name: str | None = Field(default=None, max_length=63)
    salt: str | None = Field(default=None, description="hex, 16 random bytes")
    hash: str | None = Field(default=None, description="hex HMAC-SHA256(salt, key)")
    secret_ref: SecretReference | None = None
    created: datetime | None = None
    revoked: bool = False

    def check(self, path: str) -> Iterator[Violation]:
        if not KEY_ID.match(self.id):
            yield Violation(join_path(path, "id"), "must be 12 lowercase letters or digits")
        if self.secret_ref is not None:
            if self.salt is not None or self.hash is not None:
                yield Violation(
                    join_path(path, "secretRef"),
                    "give either salt and hash or secretRef, not both",
                )
            return
        if self.salt is None or self.hash is None:
            yield Violation(path, "needs salt and hash (or secretRef naming a Secret with them)")
            return
        yield from check_salt_hash(self.salt, self.hash, path)


def check_salt_hash(salt: str, hash_: str, path: str) -> Iterator[Violation]:
    if len(salt) != 32 or not _HEX.match(salt):
        yield Violation(join_path(path, "salt"), "must be 32 lowercase hex digits")
    if len(hash_) != 64 or not _HEX.match(hash_):
        yield Violation(join_path(path, "hash"), "must be 64 lowercase hex digits (SHA-256)")


class TokenBudget(ApiModel):
    """At most ``tokens`` (input + output) over any ``unit``-long window: a token bucket of
    ``tokens`` refilled at ``tokens`` per ``unit`` (so unused budget never piles up beyond
    one period, and a spent budget comes back gradually, not all at once at a boundary)."""

    tokens: int = Field(ge=1, le=2**53)
    unit: RateLimitUnit = "day"


class TenantRateLimit(RateLimit):
    """``ModelRoute.spec.rateLimit`` plus requests per unit and a token budget; every limit
    here holds the tenant's requests summed over all its keys and models."""

    requests_per_unit: int | None = Field(default=None, ge=1, le=UINT32_MAX)
    budget: TokenBudget | None = None

    def check(self, path: str) -> Iterator[Violation]:
        if (
            self.requests_per_unit is None
            and self.input_tokens_per_unit is None
            and self.output_tokens_per_unit is None
            and self.budget is None
        ):
            yield Violation(
                path,
                "set requestsPerUnit, inputTokensPerUnit, outputTokensPerUnit or budget (or "
                "remove rateLimit): without any of them nothing is limited",
            )


class TenantSpec(ApiModel):
    # Model names or shell-style patterns (``llama-*``); the default allows every model.
    models: list[str] = Field(default_factory=lambda: ["*"])
    # The criticality of this tenant's requests unless their route says otherwise.
    criticality: Criticality = "Default"
    # This tenant's share of dispatches against other tenants waiting in the same priority
    # band while the gateway queues (flow control): weight / sum of the waiting ones' weights.
    weight: int = Field(default=1, ge=1, le=1000)
    keys: list[ApiKey] = Field(default_factory=list)
    # Limits on this tenant's requests (local, or shared by every gateway through Redis).
    rate_limit: TenantRateLimit | None = None

    def check(self, path: str) -> Iterator[Violation]:
        for i, pattern in enumerate(self.models):
            if not _MODEL_PATTERN.match(pattern):
                yield Violation(
                    join_path(join_path(path, "models"), i),
                    "must be 1-256 printable characters without spaces",
                )
        seen: set[str] = set()
        for i, key in enumerate(self.keys):
            if key.id in seen:
                yield Violation(
                    join_path(join_path(join_path(path, "keys"), i), "id"),
                    f"duplicate key id {key.id!r}",
                )
            seen.add(key.id)


class Tenant(Resource):
    group: ClassVar[str] = LLMPLANE_GROUP
    version: ClassVar[str] = "v1alpha1"
    plural: ClassVar[str] = "tenants"
    short_names: ClassVar[tuple[str, ...]] = ("tn",)
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("CRITICALITY", "string", ".spec.criticality"),
        ("MODELS", "string", ".spec.models"),
    )
    api_owned: ClassVar[tuple[ApiOwned, ...]] = (
        ApiOwned("spec.keys", "llmplane keys", list_key="id"),
    )

    api_version: Literal["llmplane.io/v1alpha1"] = "llmplane.io/v1alpha1"
    kind: Literal["Tenant"] = "Tenant"
    spec: TenantSpec = Field(default_factory=TenantSpec)
    status: ConditionedStatus | None = None
