"""``llmplane.io/v1alpha1``: llmplane's own kinds.

``Endpoint`` registers a model server llmplane did not start (a vLLM already running
elsewhere) so ModelServers and InferencePools can select it by label, like a pod.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import ClassVar, Literal

from pydantic import Field

from llmplane.api.base import (
    ApiModel,
    ConditionedStatus,
    Resource,
    Violation,
    check_labels,
    join_path,
)

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
