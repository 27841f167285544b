"""ModelRoute ``rateLimit`` -> ``RouteLimit`` (tokens per period, per direction), and how many
output tokens a request reserves."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from llmplane.api.kthena import UNIT_SECONDS, RateLimit

log = logging.getLogger("llmplane.gateway")

INPUT = "input"
OUTPUT = "output"


@dataclass(frozen=True)
class RouteLimit:
    """A ModelRoute's rateLimit: tokens per ``period`` seconds in each limited direction."""

    ref: str  # ModelRoute/namespace/name (what Decision.route starts with)
    key: str  # namespace/name
    tokens: tuple[tuple[str, int], ...]  # (direction, tokens per unit), limited ones only
    unit: str
    period: float
    redis: str | None = None  # host:port of global.redis

    def limit(self, direction: str) -> int | None:
        for d, n in self.tokens:
            if d == direction:
                return n
        return None


def route_limits(objects: Iterable[dict[str, Any]]) -> dict[str, RouteLimit]:
    """ModelRoute ref -> its limit, for the routes in ``objects`` with a valid rateLimit."""
    limits: dict[str, RouteLimit] = {}
    for obj in objects:
        if obj.get("kind") != "ModelRoute":
            continue
        spec = obj.get("spec") or {}
        raw = spec.get("rateLimit") if isinstance(spec, dict) else None
        if not raw:
            continue
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        key = f"{namespace}/{meta.get('name')}"
        try:
            rl = RateLimit.model_validate(raw)
        except Exception as err:
            log.warning("rate limits: ModelRoute/%s: invalid rateLimit ignored: %s", key, err)
            continue
        tokens = tuple(
            (d, n)
            for d, n in ((INPUT, rl.input_tokens_per_unit), (OUTPUT, rl.output_tokens_per_unit))
            if n
        )
        if not tokens:
            continue
        redis = rl.global_.redis.address if rl.global_ and rl.global_.redis else None
        limits[f"ModelRoute/{key}"] = RouteLimit(
            ref=f"ModelRoute/{key}",
            key=key,
            tokens=tokens,
            unit=rl.unit,
            period=float(UNIT_SECONDS[rl.unit]),
            redis=redis,
        )
    return limits


def output_reservation(doc: dict[str, Any], default: int, burst: int) -> int:
    """``max_completion_tokens`` (else ``max_tokens``) times ``n``; without either the default,
    capped at the bucket (the actual output is settled afterwards anyway)."""
    n = doc.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1
    for key in ("max_completion_tokens", "max_tokens"):
        value = doc.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value * choices
    return min(default * choices, burst)
