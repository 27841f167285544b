"""ModelRoute and Tenant ``rateLimit`` -> ``RouteLimit`` (amounts per period, per direction),
and how many output tokens a request reserves."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from llmplane.api.kthena import UNIT_SECONDS, RateLimit
from llmplane.api.llmplane import TenantRateLimit

log = logging.getLogger("llmplane.gateway")

REQUESTS = "requests"  # one per request
INPUT = "input"
OUTPUT = "output"
BUDGET = "budget"  # input + output tokens over the budget's own unit
TOKEN_DIRECTIONS = (INPUT, OUTPUT, BUDGET)


@dataclass(frozen=True)
class RouteLimit:
    """A ModelRoute's or a Tenant's rateLimit: amounts per ``period`` seconds in each limited
    direction (a Tenant's budget per ``budget_period``)."""

    ref: str  # ModelRoute/namespace/name (what RouteDecision.route starts with) or Tenant/name
    key: str  # the buckets' key: namespace/name (routes), tenant/namespace/name (tenants)
    tokens: tuple[tuple[str, int], ...]  # (direction, amount per unit), limited ones only
    unit: str
    period: float
    redis: str | None = None  # host:port of global.redis
    budget_unit: str = "day"
    budget_period: float = 86400.0

    def limit(self, direction: str) -> int | None:
        for d, n in self.tokens:
            if d == direction:
                return n
        return None

    def period_of(self, direction: str) -> float:
        return self.budget_period if direction == BUDGET else self.period

    def rate(self, direction: str) -> float:
        """Tokens a second the bucket of ``direction`` refills at."""
        return (self.limit(direction) or 0) / self.period_of(direction)

    def unit_of(self, direction: str) -> str:
        return self.budget_unit if direction == BUDGET else self.unit


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def _build(
    ref: str, key: str, rl: RateLimit, extra: tuple[tuple[str, int | None], ...] = ()
) -> RouteLimit | None:
    directions = (
        *extra[:1],
        (INPUT, rl.input_tokens_per_unit),
        (OUTPUT, rl.output_tokens_per_unit),
        *extra[1:],
    )
    tokens = tuple((d, n) for d, n in directions if n)
    if not tokens:
        return None
    redis = rl.global_.redis.address if rl.global_ and rl.global_.redis else None
    budget = getattr(rl, "budget", None)
    return RouteLimit(
        ref=ref,
        key=key,
        tokens=tokens,
        unit=rl.unit,
        period=float(UNIT_SECONDS[rl.unit]),
        redis=redis,
        **(
            {"budget_unit": budget.unit, "budget_period": float(UNIT_SECONDS[budget.unit])}
            if budget is not None
            else {}
        ),
    )


def _specs(objects: Iterable[dict[str, Any]], kind: str) -> Iterator[tuple[str, Any]]:
    """(namespace/name, raw rateLimit) of every ``kind`` object in ``objects`` with one."""
    for obj in objects:
        if obj.get("kind") != kind:
            continue
        spec = obj.get("spec") or {}
        raw = spec.get("rateLimit") if isinstance(spec, dict) else None
        if raw:
            yield _key(obj), raw


def route_limits(objects: Iterable[dict[str, Any]]) -> dict[str, RouteLimit]:
    """ModelRoute ref -> its limit, for the routes in ``objects`` with a valid rateLimit."""
    limits: dict[str, RouteLimit] = {}
    for key, raw in _specs(objects, "ModelRoute"):
        try:
            rl = RateLimit.model_validate(raw)
        except Exception as err:
            log.warning("rate limits: ModelRoute/%s: invalid rateLimit ignored: %s", key, err)
            continue
        limit = _build(f"ModelRoute/{key}", key, rl)
        if limit is not None:
            limits[limit.ref] = limit
    return limits


def tenant_limits(objects: Iterable[dict[str, Any]]) -> dict[str, RouteLimit]:
    """Tenant name (as ``gateway/auth.py`` names it: ``name`` in namespace default, else
    ``namespace/name``) -> its limit, for the Tenants in ``objects`` with a valid rateLimit."""
    limits: dict[str, RouteLimit] = {}
    for key, raw in _specs(objects, "Tenant"):
        name = key.removeprefix("default/")
        try:
            rl = TenantRateLimit.model_validate(raw)
        except Exception as err:
            log.warning("rate limits: Tenant/%s: invalid rateLimit ignored: %s", name, err)
            continue
        budget = rl.budget.tokens if rl.budget is not None else None
        extra = ((REQUESTS, rl.requests_per_unit), (BUDGET, budget))
        limit = _build(f"Tenant/{name}", f"tenant/{key}", rl, extra)
        if limit is not None:
            limits[name] = limit
    return limits


def _given(doc: dict[str, Any], key: str) -> int | None:
    value = doc.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _prompts(prompt: Any) -> int:
    """Prompts in a completions ``prompt``: a list of strings or of token-id lists is one
    prompt per item; a string or one token-id list is one."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


def output_reservation(doc: dict[str, Any], default: int, burst: int) -> int:
    """The output tokens the engine may generate for ``doc``: tokens per sequence times
    sequences, where a sequence is one choice (``n``, or ``best_of`` when larger: the engine
    generates them all) of one prompt. Tokens per sequence are the field the engine honours
    on the request's API: chat ``max_completion_tokens``, else ``max_tokens``; completions
    ``max_tokens`` only (an engine ignores ``max_completion_tokens`` there). Without it, the
    default, capped at the bucket (the actual output is settled afterwards). The body alone
    decides, whatever the path: a body with both ``messages`` and ``prompt`` reserves for the
    API that would generate more. More than the bucket: the 429 of a request too large."""
    choices = max(_given(doc, "n") or 1, _given(doc, "best_of") or 1)
    fallback = min(default, burst)
    most = 0
    if "messages" in doc or "prompt" not in doc:  # chat (or a body no API would generate for)
        each = (
            _given(doc, "max_completion_tokens")
            or _given(doc, "max_tokens")
            or _given(doc, "max_output_tokens")  # the Responses API's
            or fallback
        )
        most = each * choices
    if "prompt" in doc:
        each = _given(doc, "max_tokens") or fallback
        most = max(most, each * choices * _prompts(doc["prompt"]))
    return most
