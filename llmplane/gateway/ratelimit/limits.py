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


@dataclass(frozen=True)
class RouteLimit:
    """A ModelRoute's or a Tenant's rateLimit: amounts per ``unit`` in each limited direction
    (a Tenant's budget per ``budget_unit``)."""

    ref: str  # ModelRoute/namespace/name (what RouteDecision.route starts with) or Tenant/name
    key: str  # the buckets' key: namespace/name (routes), tenant/namespace/name (tenants)
    tokens: dict[str, int]  # direction -> amount per unit, limited directions only
    unit: str
    redis: str | None = None  # host:port of global.redis
    budget_unit: str = "day"

    @property
    def period(self) -> float:
        return float(UNIT_SECONDS[self.unit])

    def limit(self, direction: str) -> int | None:
        return self.tokens.get(direction)

    def unit_of(self, direction: str) -> str:
        return self.budget_unit if direction == BUDGET else self.unit

    def rate(self, direction: str) -> float:
        """Tokens a second the bucket of ``direction`` refills at."""
        return (self.tokens.get(direction) or 0) / UNIT_SECONDS[self.unit_of(direction)]


def _limits(objects: Iterable[dict[str, Any]], kind: str) -> Iterator[tuple[str, RouteLimit]]:
    """(namespace/name, its limit) of every ``kind`` object with a valid rateLimit that limits
    something (an invalid one is logged and ignored)."""
    model = TenantRateLimit if kind == "Tenant" else RateLimit
    for obj in objects:
        spec = obj.get("spec") if obj.get("kind") == kind else None
        raw = spec.get("rateLimit") if isinstance(spec, dict) else None
        if not raw:
            continue
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        shown = key.removeprefix("default/") if kind == "Tenant" else key
        try:
            rl = model.model_validate(raw)
        except Exception as err:
            log.warning("rate limits: %s/%s: invalid rateLimit ignored: %s", kind, shown, err)
            continue
        budget = getattr(rl, "budget", None)
        directions = (
            (REQUESTS, getattr(rl, "requests_per_unit", None)),
            (INPUT, rl.input_tokens_per_unit),
            (OUTPUT, rl.output_tokens_per_unit),
            (BUDGET, budget.tokens if budget is not None else None),
        )
        tokens = {d: n for d, n in directions if n}
        if tokens:
            yield (
                key,
                RouteLimit(
                    ref=f"{kind}/{shown}",
                    key=f"tenant/{key}" if kind == "Tenant" else key,
                    tokens=tokens,
                    unit=rl.unit,
                    redis=rl.global_.redis.address if rl.global_ and rl.global_.redis else None,
                    budget_unit=budget.unit if budget is not None else "day",
                ),
            )


def route_limits(objects: Iterable[dict[str, Any]]) -> dict[str, RouteLimit]:
    """ModelRoute ref -> its limit."""
    return {limit.ref: limit for _, limit in _limits(objects, "ModelRoute")}


def tenant_limits(objects: Iterable[dict[str, Any]]) -> dict[str, RouteLimit]:
    """Tenant name (as ``gateway/auth.py`` names it: ``name`` in namespace default, else
    ``namespace/name``) -> its limit."""
    return {key.removeprefix("default/"): limit for key, limit in _limits(objects, "Tenant")}


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
