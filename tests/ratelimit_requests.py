"""Requests as the rate limiter's hooks see them (unit tests and the Redis tests): the hook's
``RequestContext``, a routing decision, a chat request, a ModelRoute and a Tenant with limits, a
settable clock."""

from __future__ import annotations

import orjson

from llmplane.gateway.auth import TenantAccess
from llmplane.gateway.context import RequestContext
from llmplane.gateway.request import InferenceRequest

KTHENA = "networking.serving.volcano.sh/v1alpha1"


def route(name, rate_limit, namespace="default"):
    return {
        "apiVersion": KTHENA,
        "kind": "ModelRoute",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "modelName": name,
            "rules": [{"targetModels": [{"modelServerName": "s"}]}],
            "rateLimit": rate_limit,
        },
    }


def hook_ctx(inference, decision, status=200):
    """The ``RequestContext`` a request hook receives: the parsed request, ``decision`` (its
    route and model) and its tenant (``decision.tenant``, where a test's decision has one)."""
    ctx = RequestContext(None)  # type: ignore[arg-type]  # (hooks read no HTTP request)
    ctx.inference = inference
    ctx.decision = decision
    name = getattr(decision, "tenant", None)
    ctx.tenant = TenantAccess(name, ("*",), "Default") if name is not None else None
    ctx.status = status
    return ctx


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def chat(text, **extra):
    doc = {"model": "m", "messages": [{"role": "user", "content": text}], **extra}
    return InferenceRequest("/v1/chat/completions", {}, orjson.dumps(doc))


def tenant(name: str, rate_limit: dict | None, namespace: str = "default") -> dict:
    spec: dict = {"models": ["*"]}
    if rate_limit is not None:
        spec["rateLimit"] = rate_limit
    return {
        "apiVersion": "llmplane.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


class TenantDecision:
    """What a hook reads of a routing decision: its route, model and tenant."""

    def __init__(self, tenant=None, route="Model/m", model="m"):
        self.route = route
        self.model = model
        self.tenant = tenant
