"""``llm-d.ai/v1alpha2``: InferenceObjective and InferenceModelRewrite (llm-d's router).

Both moved here from the Inference Extension's ``inference.networking.x-k8s.io/v1alpha2``; that
apiVersion is still accepted (same schema) and stored as ``llm-d.ai/v1alpha2``, as llm-d's
router still reads the old group.

- InferenceObjective: a request names one with the header ``x-llm-d-inference-objective``
  (or the older ``x-gateway-inference-objective``); its integer ``priority`` (unset = 0,
  higher is served first, negative is sheddable) ranks it in flow control.
- InferenceModelRewrite: rewrites the request's ``model`` for a pool, picking among weighted
  ``targets``. Precedence: a rule with an ``Exact`` match over one without ``matches``
  (which applies to requests no exact rule takes), then the oldest resource, then rule order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, Literal

from pydantic import Field

from llmplane.api.base import ApiModel, Condition, Resource, Violation, join_path
from llmplane.api.gie import MAX_WEIGHT, Group, Kind, ObjectName

GROUP = "llm-d.ai"
VERSION = "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"
# The Inference Extension's group for these kinds before they moved (same schema).
LEGACY_API_VERSION = "inference.networking.x-k8s.io/v1alpha2"
POOL_GROUP = "inference.networking.k8s.io"
OBJECTIVE_HEADERS = ("x-llm-d-inference-objective", "x-gateway-inference-objective")
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1


class PoolObjectReference(ApiModel):
    """An InferencePool in the namespace of the referring object."""

    group: Group = POOL_GROUP
    kind: Kind = "InferencePool"
    name: ObjectName


class ObjectiveStatus(ApiModel):
    """Condition ``Accepted``."""

    conditions: list[Condition] | None = Field(default=None, max_length=8)


class InferenceObjectiveSpec(ApiModel):
    # Unset means 0 to whoever reads it; higher first, negative allowed (int32).
    priority: int | None = Field(default=None, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    pool_ref: PoolObjectReference

    @property
    def effective_priority(self) -> int:
        return self.priority or 0


class InferenceObjective(Resource):
    group: ClassVar[str] = GROUP
    version: ClassVar[str] = VERSION
    plural: ClassVar[str] = "inferenceobjectives"
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("INFERENCE POOL", "string", ".spec.poolRef.name"),
        ("PRIORITY", "string", ".spec.priority"),
    )

    api_version: Literal["llm-d.ai/v1alpha2"] = API_VERSION
    kind: Literal["InferenceObjective"] = "InferenceObjective"
    spec: InferenceObjectiveSpec
    status: ObjectiveStatus | None = None


class ModelMatch(ApiModel):
    type: Literal["Exact"] = "Exact"
    value: str = Field(min_length=1)


class Match(ApiModel):
    model: ModelMatch


class RewriteTarget(ApiModel):
    """A model name to send instead, and its share (weight / sum; all weights or none)."""

    weight: int | None = Field(default=None, ge=1, le=MAX_WEIGHT)
    model_rewrite: str = Field(min_length=1)


class InferenceModelRewriteRule(ApiModel):
    # Any match suffices (OR); none: the rule applies to requests no exact rule takes.
    matches: list[Match] | None = None
    targets: list[RewriteTarget] | None = Field(default=None, min_length=1)

    def check(self, path: str) -> Iterator[Violation]:
        targets = self.targets or []
        weighted = [t.weight is not None for t in targets]
        if any(weighted) and not all(weighted):
            for i, target in enumerate(targets):
                if target.weight is None:
                    yield Violation(
                        join_path(join_path(join_path(path, "targets"), i), "weight"),
                        "must be set because other targets set a weight "
                        "(set weights on all targets or on none)",
                    )

    def shares(self) -> list[tuple[str, float]]:
        """``(model name, weight)`` of each target; equal weights when none is set."""
        return [(t.model_rewrite, float(t.weight or 1)) for t in self.targets or []]


class InferenceModelRewriteSpec(ApiModel):
    pool_ref: PoolObjectReference
    rules: list[InferenceModelRewriteRule]


class InferenceModelRewrite(Resource):
    group: ClassVar[str] = GROUP
    version: ClassVar[str] = VERSION
    plural: ClassVar[str] = "inferencemodelrewrites"
    printer_columns: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("INFERENCE POOL", "string", ".spec.poolRef.name"),
    )

    api_version: Literal["llm-d.ai/v1alpha2"] = API_VERSION
    kind: Literal["InferenceModelRewrite"] = "InferenceModelRewrite"
    spec: InferenceModelRewriteSpec
    status: ObjectiveStatus | None = None
