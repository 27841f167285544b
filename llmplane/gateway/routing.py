"""The routing table: which endpoints may serve a request, and under which model name.

Built from store objects and the endpoint list by a pure function (``build_table``); the
gateway swaps the reference atomically on every change, so a request resolves against one
consistent table from start to end and in-flight requests never see a half-applied change.

Resolution order for the request's ``model``:

1. Kthena ``ModelRoute`` whose ``modelName`` equals it (routes with the same name oldest
   first), else one listing it in ``loraAdapters``; the first rule whose ``modelMatch`` holds
   (headers AND uri AND body.model; exact / prefix / regex, regex unanchored as Go's
   ``MatchString``; an empty match matches all) picks a ``targetModels`` entry at random by
   weight; ``model`` is rewritten to ``ModelServer.spec.model`` unless it names a LoRA
   adapter. No rule matches: 404.
2. Inference Extension ``InferenceModel`` with that ``modelName``: a ``targetModels`` entry at
   random by share (weight / sum) is sent as ``model``; endpoints from its ``InferencePool``.
   An ``InferenceModelRewrite`` (llm-d.ai) rule with an ``Exact`` match on it (the oldest
   rewrite first, then rule order): a ``targets`` entry at random by weight is sent as
   ``model``, to the replicas of the rewrite's InferencePool.
3. Without extra YAML: endpoints serving it (label ``llmaz.io/model-name`` from a Playground,
   or the endpoint's own served model name); a Playground's claimed model with no ready
   endpoint yet gives 503, not 404.
4. A model nothing above knows, or a request without a model: an InferenceModelRewrite rule
   without ``matches`` (oldest first; its target becomes the body's ``model``, none: the
   engine's own default), else 404 (400 without a model).

InferencePools of both versions (v1 ``inference.networking.k8s.io``, v1alpha2
``inference.networking.x-k8s.io``) are read as v1 (``api/gie_v1.py``). A request to a pool
that names an ``InferenceObjective`` of that pool in ``x-llm-d-inference-objective`` (or
``x-gateway-inference-objective``) gets the objective's integer priority (``RouteDecision.priority``)
for flow control.

Over 500 lines on purpose: ``build_table`` and the lookups it serves share one set of route and
backend types; Playground helpers and LoRA adapters already live in playgrounds.py / adapters.py.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llmplane.api.gie import InferenceModel
from llmplane.api.gie_v1 import H2C, pool_v1
from llmplane.api.kthena import ModelRoute, ModelServer, StringMatch
from llmplane.api.llmd import OBJECTIVE_HEADERS, InferenceModelRewrite, InferenceObjective
from llmplane.gateway.clip import shown
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.disaggregated import GROUP_KEY, pd_pairs
from llmplane.gateway.errors import (
    ErrorCode,
    GatewayError,
    ModelNotFound,
    NotReady,
    missing_model,
)
from llmplane.gateway.playgrounds import (
    DeclaredAdapter,
    activatable_routes,
    declared_adapters,
    failing_reason,
    playground_models,
    reported_adapters,
)
from llmplane.gateway.registry import EndpointState

log = logging.getLogger("llmplane.gateway")

PROFILE_ANNOTATION = "llmplane.io/scheduling-profile"
# Seconds, on a ModelServer, InferencePool or Playground: see GatewayConfig.default_timeout
# and stream_stall_timeout (a ModelServer's trafficPolicy.timeout wins over the first).
TIMEOUT_ANNOTATION = "llmplane.io/upstream-timeout"
STALL_ANNOTATION = "llmplane.io/stream-stall-timeout"
# How many times a lost stream may move to another replica (0: never); see gateway/migration.py.
MIGRATION_ANNOTATION = "llmplane.io/migration-limit"
ROUTE_KINDS = (
    "ModelRoute",
    "ModelServer",
    "InferencePool",
    "InferenceModel",
    "InferenceObjective",
    "InferenceModelRewrite",
    "Playground",
)
POOL_GROUPS = ("inference.networking.k8s.io", "inference.networking.x-k8s.io")
SGLANG = "sglang"  # the prefill/decode mode of SGLang engines (paired by bootstrap room)


@dataclass(frozen=True)
class PDBackend:
    """The prefill side of a disaggregated ModelServer (the decode replicas are the
    backend's candidates); ``pd.py`` serves requests on it."""

    group_key: str
    prefill: tuple[EndpointState, ...]
    mode: str  # http | lmcache | nixl | mooncake | sglang

    def group_of(self, state: EndpointState) -> str | None:
        return state.endpoint.labels.get(self.group_key) or None


def mode_of(engine: str, connector: str | None) -> str:
    """SGLang engines pair by bootstrap room; vLLM ones by their KV connector (default http)."""
    if engine == "SGLang":
        return SGLANG
    return connector or "http"


@dataclass(frozen=True)
class Backend:
    """A set of candidate endpoints and how to talk to them."""

    ref: str  # e.g. ModelServer/default/llama
    candidates: tuple[EndpointState, ...]
    port: int | None = None
    model: str | None = None  # rewrite target; None keeps the request's model
    timeout: float | None = None
    stall_timeout: float | None = None  # seconds without a stream byte before it is ended
    migration_limit: int = 3  # times a lost stream may continue on another replica
    retry_attempts: int = 2
    retry_interval: float = 0.0
    profile: str | None = None
    pd: PDBackend | None = None  # prefill/decode disaggregation: candidates are the decoders

    def address(self, state: EndpointState) -> str:
        return state.endpoint.with_port(self.port)


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """What the routing table decided for one request; never changed afterwards (what a later
    stage adds, the request's ``RequestContext`` holds)."""

    route: str  # what matched, for metrics and logs
    backend: Backend
    model: str  # the model name sent upstream
    # The route's criticality (an InferenceModel that names one); None when the route does
    # not say (the request then takes its tenant's, else Default: ``RequestContext.level``).
    criticality: str | None = None
    lora: bool = False
    load: DeclaredAdapter | None = None  # a declared adapter no replica holds: load it first
    # The InferenceObjective's priority the request named (higher first); None: its
    # criticality's (flowcontrol/queue.py PRIORITY).
    priority: int | None = None


# --- matching -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Match:
    exact: str | None = None
    prefix: str | None = None
    regex: re.Pattern[str] | None = None

    @classmethod
    def of(cls, m: StringMatch) -> _Match:
        return cls(m.exact, m.prefix, re.compile(m.regex) if m.regex is not None else None)

    def __call__(self, value: str | None) -> bool:
        if value is None:
            return False
        if self.exact is not None:
            return value == self.exact
        if self.prefix is not None:
            return value.startswith(self.prefix)
        if self.regex is not None:
            return self.regex.search(value) is not None
        return True


@dataclass(frozen=True)
class _Target:
    server: str  # ModelServer name (same namespace as the route)
    weight: int


@dataclass(frozen=True)
class _Rule:
    name: str
    headers: tuple[tuple[str, _Match], ...]
    uri: _Match | None
    body_model: str | None
    targets: tuple[_Target, ...]

    def matches(self, model: str, path: str, headers: Mapping[str, str]) -> bool:
        if self.body_model is not None and model != self.body_model:
            return False
        if self.uri is not None and not self.uri(path):
            return False
        return all(match(headers.get(name)) for name, match in self.headers)


@dataclass(frozen=True)
class _Route:
    ref: str
    namespace: str
    model_name: str | None
    lora_adapters: frozenset[str]
    rules: tuple[_Rule, ...]
    order: tuple[str, str, str]


@dataclass(frozen=True)
class _Rewrite:
    """One InferenceModelRewrite rule: the names to send (by weight; none: the request's)
    and its pool's backend (None: ``problem`` says why there is none)."""

    ref: str
    targets: tuple[tuple[str, float], ...]
    backend: Backend | None
    problem: str


def _pick_weighted(items: list[Any], weights: list[float]) -> Any:
    total = sum(weights)
    if total <= 0:
        return None
    return random.choices(items, weights)[0]


# --- the table --------------------------------------------------------------------------------


@dataclass
class RoutingTable:
    routes_by_model: dict[str, list[_Route]] = field(default_factory=dict)
    routes_by_lora: dict[str, list[_Route]] = field(default_factory=dict)
    servers: dict[tuple[str, str], Backend] = field(default_factory=dict)  # (ns, name)
    inference_models: dict[
        str, list[tuple[str, str, list[tuple[str, float]], Backend | None, str]]
    ] = field(default_factory=dict)
    defaults: dict[str, Backend] = field(default_factory=dict)
    # Each default's decision, made once by ``build_table`` rather than per request.
    decisions: dict[str, RouteDecision] = field(default_factory=dict)
    placeholders: set[str] = field(default_factory=set)  # Playground models without endpoints
    failing: dict[str, str] = field(default_factory=dict)  # placeholder -> why its engine fails
    adapters: set[str] = field(default_factory=set)  # LoRA adapters among ``defaults``
    declared: dict[str, tuple[DeclaredAdapter, Backend]] = field(default_factory=dict)
    # Placeholders whose requests the activator may hold -> their workload (namespace/name).
    activatable: dict[str, str] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # ref -> why it is ignored
    # InferenceModelRewrite rules by exact model name, and those without matches; each in
    # precedence order (oldest rewrite, then rule order).
    rewrites: dict[str, list[_Rewrite]] = field(default_factory=dict)
    fallbacks: list[_Rewrite] = field(default_factory=list)
    # (pool ref, InferenceObjective name) -> its priority.
    objectives: dict[tuple[str, str], int] = field(default_factory=dict)

    def model_names(self) -> list[str]:
        names = set(self.routes_by_model) | set(self.routes_by_lora)
        names |= set(self.inference_models) | set(self.defaults) | self.placeholders
        names |= set(self.declared) | set(self.rewrites)
        return sorted(names)

    def _objective(self, decision: RouteDecision, headers: Mapping[str, str]) -> RouteDecision:
        """``decision`` with the priority of the InferenceObjective the request names, when
        it is one of the decision's pool."""
        if self.objectives:
            for header in OBJECTIVE_HEADERS:
                name = headers.get(header)
                if name:
                    priority = self.objectives.get((decision.backend.ref, name))
                    return replace(decision, priority=priority)
        return decision

    def _rewrite(self, model: str, rule: _Rewrite) -> RouteDecision:
        if rule.backend is None:
            raise GatewayError(503, f"model {model!r}: {rule.problem}", ErrorCode.NO_BACKEND)
        if not rule.targets:
            return RouteDecision(rule.ref, rule.backend, model)
        target = _pick_weighted([n for n, _ in rule.targets], [w for _, w in rule.targets])
        return RouteDecision(rule.ref, rule.backend, target)

    def resolve(self, model: str, path: str, headers: Mapping[str, str]) -> RouteDecision:
        if not model:  # a request without a model: only a catch-all rewrite takes it
            if self.fallbacks:
                return self._objective(self._rewrite(model, self.fallbacks[0]), headers)
            raise missing_model()
        routes = self.routes_by_model.get(model)
        lora = False
        if routes is None:
            routes = self.routes_by_lora.get(model)
            lora = routes is not None
        if routes is not None:
            return self._resolve_route(routes, model, lora, path, headers)
        candidates = self.inference_models.get(model)
        if candidates:
            ref, criticality, shares, backend, problem = candidates[0]
            if backend is None:
                raise GatewayError(503, f"model {model!r}: {problem}", ErrorCode.NO_BACKEND)
            names = [n for n, _ in shares]
            target = _pick_weighted(names, [s for _, s in shares])
            if target is None:
                raise GatewayError(
                    503,
                    f"model {model!r}: every target model of {ref} has weight 0",
                    ErrorCode.NO_BACKEND,
                )
            return self._objective(RouteDecision(ref, backend, target, criticality), headers)
        rewrites = self.rewrites.get(model)
        if rewrites:
            return self._objective(self._rewrite(model, rewrites[0]), headers)
        decision = self.decisions.get(model)
        if decision is not None:
            return decision
        declared = self.declared.get(model)
        if declared is not None:
            adapter, backend = declared
            return RouteDecision(backend.ref, backend, model, lora=True, load=adapter)
        if model in self.placeholders:
            failing = self.failing.get(model)
            raise NotReady(
                f"model {model!r} has no ready endpoint: {failing}"
                if failing
                else f"model {model!r} has no ready endpoint yet (its Playground is starting or "
                "scaled to zero)"
            )
        if self.fallbacks:
            return self._objective(self._rewrite(model, self.fallbacks[0]), headers)
        raise model_not_found(model, self.model_names())

    def _resolve_route(
        self, routes: list[_Route], model: str, lora: bool, path: str, headers: Mapping[str, str]
    ) -> RouteDecision:
        for route in routes:
            for rule in route.rules:
                if not rule.matches(model, path, headers):
                    continue
                target = _pick_weighted(list(rule.targets), [t.weight for t in rule.targets])
                ref = f"{route.ref}#{rule.name}"
                if target is None:
                    raise GatewayError(
                        503,
                        f"model {model!r}: every target of {ref} has weight 0",
                        ErrorCode.NO_BACKEND,
                    )
                backend = self.servers.get((route.namespace, target.server))
                if backend is None:
                    raise GatewayError(
                        503,
                        f"model {model!r}: {ref} targets ModelServer {target.server!r}, "
                        f"which does not exist in namespace {route.namespace!r}",
                        ErrorCode.NO_BACKEND,
                    )
                sent = model if lora or backend.model is None else backend.model
                return RouteDecision(ref, backend, sent, lora=lora)
        raise GatewayError(
            404,
            f"no ModelRoute rule for model {model!r} matches this request "
            f"({', '.join(r.ref for r in routes)})",
            ErrorCode.NO_MATCHING_ROUTE,
        )


def model_not_found(model: str, known: Sequence[str]) -> ModelNotFound:
    """The 404 for a name nothing routes, naming up to 20 of ``known``: the names the caller
    may use (a tenant's key sees only its own, ``Gateway.route``)."""
    hint = f"; available: {', '.join(known[:20])}" if known else "; no model is routable yet"
    return ModelNotFound(f"the model {shown(model)} does not exist{hint}")


# --- building ----------------------------------------------------------------------------------


def _selects(selector: Mapping[str, str] | None, labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def _ref(kind: str, meta: Mapping[str, Any]) -> str:
    return f"{kind}/{meta.get('namespace') or 'default'}/{meta['name']}"


def _criticality(im: InferenceModel) -> str | None:
    """The InferenceModel's criticality when it names one; else the tenant's applies."""
    return im.spec.criticality if "criticality" in im.spec.model_fields_set else None


def _profile(meta: Mapping[str, Any]) -> str | None:
    return (meta.get("annotations") or {}).get(PROFILE_ANNOTATION)


def _seconds(meta: Mapping[str, Any], annotation: str, default: float | None) -> float | None:
    """A positive number of seconds from an annotation ("0" or "none": no limit), else
    ``default``; a value that is not a number is logged and ignored."""
    value = (meta.get("annotations") or {}).get(annotation)
    if value is None:
        return default
    text = str(value).strip().lower().removesuffix("s")
    if text in ("0", "none", "off"):
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        log.warning(
            "ignoring %s=%r on %s: not a number of seconds", annotation, value, meta.get("name")
        )
        return default
    return seconds


def _count(meta: Mapping[str, Any], annotation: str, default: int) -> int:
    """A whole number >= 0 from an annotation, else ``default`` (a bad value is logged)."""
    value = (meta.get("annotations") or {}).get(annotation)
    if value is None:
        return default
    text = str(value).strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 6):
        log.warning("ignoring %s=%r on %s: not a count", annotation, value, meta.get("name"))
        return default
    return int(text)


def _limits(meta: Mapping[str, Any], config: GatewayConfig) -> dict[str, Any]:
    """The Backend fields an object's annotations set: timeout, stall_timeout and
    migration_limit."""
    return {
        "timeout": _seconds(meta, TIMEOUT_ANNOTATION, config.default_timeout),
        "stall_timeout": _seconds(meta, STALL_ANNOTATION, config.stream_stall_timeout),
        "migration_limit": _count(meta, MIGRATION_ANNOTATION, config.migration_limit),
    }


def _valid(
    table: RoutingTable, by_kind: dict[str, list[dict[str, Any]]], kind: str, model: Any
) -> Iterator[tuple[dict[str, Any], str, str, Any]]:
    """(metadata, ref, namespace, parsed) of each ``kind`` object that validates against
    ``model`` (a model class, or a function from the object to one); the others become the
    table's problems."""
    parse = getattr(model, "model_validate", model)
    for obj in by_kind[kind]:
        meta = obj["metadata"]
        ref = _ref(kind, meta)
        try:
            parsed = parse(obj)
        except Exception as err:
            table.problems[ref] = f"invalid: {err}"
            continue
        yield meta, ref, meta.get("namespace") or "default", parsed


def _adapter_routes(
    table: RoutingTable,
    states: Iterable[EndpointState],
    playgrounds: list[dict[str, Any]],
    by_name: Mapping[str, list[EndpointState]],
    fields: Callable[[str], dict[str, Any]],
) -> None:
    """LoRA adapters need no YAML: those a replica reports route to the replicas holding them;
    those declared on a Playground and held by none route to its replicas, marked for loading
    (``gateway/adapters.py``). ``fields(base_model)``: the base model's Backend settings."""
    for name, members in reported_adapters(states).items():
        if name not in table.defaults:  # a model of that name is served: the name means it
            base = members[0].endpoint.model_name
            table.defaults[name] = Backend(f"LoRA/{name}", tuple(members), **fields(base))
            table.adapters.add(name)
    for adapter in declared_adapters(playgrounds):
        if adapter.name not in table.defaults and adapter.name not in table.declared:
            candidates = tuple(by_name.get(adapter.base, ()))
            backend = Backend(f"LoRA/{adapter.name}", candidates, **fields(adapter.base))
            table.declared[adapter.name] = (adapter, backend)


def build_table(
    objects: Iterable[dict[str, Any]],
    states: Iterable[EndpointState],
    config: GatewayConfig | None = None,
) -> RoutingTable:
    """A new routing table from store objects (any kinds; others are ignored) and endpoints."""
    config = config or GatewayConfig()
    states = list(states)
    by_kind: dict[str, list[dict[str, Any]]] = {k: [] for k in ROUTE_KINDS}
    for obj in objects:
        if obj.get("kind") in by_kind:
            by_kind[obj["kind"]].append(obj)
    table = RoutingTable()
    default_retry = (config.default_retry_attempts, config.default_retry_interval)
    # What a backend without a trafficPolicy of its own gets.
    defaults: dict[str, Any] = {  # timeouts come from _limits (annotations, else config)
        "retry_attempts": default_retry[0],
        "retry_interval": default_retry[1],
    }

    def in_namespace(namespace: str) -> list[EndpointState]:
        return [s for s in states if s.endpoint.namespace == namespace]

    # What each ModelServer / InferencePool selects (by ref), to trace an empty one to a Playground.
    selectors: dict[str, tuple[str, dict[str, str]]] = {}

    # ModelServers
    for meta, ref, namespace, server in _valid(table, by_kind, "ModelServer", ModelServer):
        spec = server.spec
        selector = dict(spec.workload_selector.match_labels or {})
        group = spec.workload_selector.pd_group
        pd = None
        if group is not None:
            # Candidates are the decode replicas; pd.py pairs each with a prefill replica.
            prefill = {**selector, **group.prefill_labels}
            pd = PDBackend(
                group.group_key,
                tuple(s for s in in_namespace(namespace) if _selects(prefill, s.endpoint.labels)),
                mode_of(spec.inference_engine, spec.kv_connector and spec.kv_connector.type),
            )
            selector.update(group.decode_labels)
        candidates = tuple(
            s for s in in_namespace(namespace) if _selects(selector, s.endpoint.labels)
        )
        policy = spec.traffic_policy
        retry = default_retry
        if policy is not None and policy.retry is not None:
            retry = (policy.retry.attempts, policy.retry.retry_interval_seconds)
        timeout = policy.timeout_seconds if policy is not None else None
        limits = _limits(meta, config)
        if pd is None:
            selectors[ref] = (namespace, selector)
        table.servers[(namespace, meta["name"])] = Backend(
            ref=ref,
            candidates=candidates,
            port=spec.workload_port.port if spec.workload_port else None,
            model=spec.model or None,
            timeout=timeout if timeout is not None else limits["timeout"],
            stall_timeout=limits["stall_timeout"],
            migration_limit=limits["migration_limit"],
            retry_attempts=retry[0],
            retry_interval=retry[1],
            profile=_profile(meta),
            pd=pd,
        )

    # ModelRoutes, oldest first within a name
    routes: list[_Route] = []
    for meta, ref, namespace, route in _valid(table, by_kind, "ModelRoute", ModelRoute):
        rules = []
        for i, rule in enumerate(route.spec.rules):
            match = rule.model_match
            rules.append(
                _Rule(
                    name=rule.name or str(i),
                    headers=tuple(
                        (name.lower(), _Match.of(m))
                        for name, m in ((match and match.headers) or {}).items()
                    ),
                    uri=_Match.of(match.uri) if match and match.uri else None,
                    body_model=match.body.model if match and match.body else None,
                    targets=tuple(
                        _Target(t.model_server_name, t.weight) for t in rule.target_models
                    ),
                )
            )
        routes.append(
            _Route(
                ref=ref,
                namespace=namespace,
                model_name=route.spec.model_name,
                lora_adapters=frozenset(route.spec.lora_adapters or ()),
                rules=tuple(rules),
                order=(meta.get("creationTimestamp") or "", namespace, meta["name"]),
            )
        )
    routes.sort(key=lambda r: r.order)
    for route in routes:
        if route.model_name:
            table.routes_by_model.setdefault(route.model_name, []).append(route)
        for adapter in route.lora_adapters:
            table.routes_by_lora.setdefault(adapter, []).append(route)

    # InferencePools and InferenceModels
    pools: dict[tuple[str, str], Backend] = {}
    missing: dict[tuple[str, str], str] = {}  # pools that route nothing, and why
    for meta, ref, namespace, pool in _valid(table, by_kind, "InferencePool", pool_v1):
        selector = pool.spec.selector.match_labels
        if pool.spec.app_protocol == H2C:
            missing[(namespace, meta["name"])] = table.problems[ref] = (
                f"{ref} has appProtocol {H2C}: the gateway speaks HTTP/1.1 to model servers"
            )
            continue
        selectors[ref] = (namespace, dict(selector))
        pools[(namespace, meta["name"])] = Backend(
            ref=ref,
            candidates=tuple(
                s for s in in_namespace(namespace) if _selects(selector, s.endpoint.labels)
            ),
            # Every port of a v1 pool is an endpoint of its own to an endpoint picker; this
            # gateway sends to the first (docs/gateway.md).
            port=pool.spec.target_ports[0].number,
            **_limits(meta, config),
            profile=_profile(meta),
            **defaults,
        )

    def pool_of(namespace: str, ref: str, pool_ref: Any) -> tuple[Backend | None, str]:
        if pool_ref.kind != "InferencePool" or pool_ref.group not in POOL_GROUPS:
            return None, f"{ref} names a {pool_ref.kind} of group {pool_ref.group!r}, not a pool"
        key = (namespace, pool_ref.name)
        problem = missing.get(key) or (
            f"{ref} names InferencePool {pool_ref.name!r}, which does not exist"
        )
        return pools.get(key), problem

    models = []
    for meta, ref, namespace, im in _valid(table, by_kind, "InferenceModel", InferenceModel):
        backend, problem = pool_of(namespace, ref, im.spec.pool_ref)
        models.append(
            (
                (meta.get("creationTimestamp") or "", namespace, meta["name"]),
                im.spec.model_name,
                (ref, _criticality(im), im.spec.target_shares(), backend, problem),
            )
        )
    models.sort(key=lambda m: m[0])
    for _, name, entry in models:
        table.inference_models.setdefault(name, []).append(entry)

    # InferenceObjectives (priorities) and InferenceModelRewrites (llm-d.ai)
    for _, ref, namespace, objective in _valid(
        table, by_kind, "InferenceObjective", InferenceObjective
    ):
        backend, problem = pool_of(namespace, ref, objective.spec.pool_ref)
        if backend is None:
            table.problems[ref] = problem
            continue
        name = ref.rsplit("/", 1)[1]
        table.objectives[(backend.ref, name)] = objective.spec.effective_priority
    rewrites: list[tuple[tuple[str, str, str], int, str | None, _Rewrite]] = []
    for meta, ref, namespace, rewrite in _valid(
        table, by_kind, "InferenceModelRewrite", InferenceModelRewrite
    ):
        backend, problem = pool_of(namespace, ref, rewrite.spec.pool_ref)
        order = (meta.get("creationTimestamp") or "", namespace, meta["name"])
        for i, rule in enumerate(rewrite.spec.rules):
            entry = _Rewrite(f"{ref}#{i}", tuple(rule.shares()), backend, problem)
            for match in rule.matches or ():
                rewrites.append((order, i, match.model.value, entry))
            if not rule.matches:
                rewrites.append((order, i, None, entry))
    rewrites.sort(key=lambda r: (r[0], r[1]))
    for _, _, exact, entry in rewrites:
        if exact is None:
            table.fallbacks.append(entry)
        else:
            table.rewrites.setdefault(exact, []).append(entry)

    # Playgrounds and plain endpoints: routable by the served model name.
    by_name: dict[str, list[EndpointState]] = {}
    for state in states:
        for name in state.endpoint.served_names():
            by_name.setdefault(name, []).append(state)
    profiles: dict[str, str | None] = {}
    limits: dict[str, dict[str, float | None]] = {}
    for obj in by_kind["Playground"]:
        failing = failing_reason(obj)
        for name in playground_models(obj.get("spec") or {}):
            table.placeholders.add(name)
            profiles.setdefault(name, _profile(obj["metadata"]))
            limits.setdefault(name, _limits(obj["metadata"], config))
            if failing:
                table.failing.setdefault(name, failing)
            else:
                meta = obj["metadata"]
                workload = f"{meta.get('namespace') or 'default'}/{meta['name']}"
                table.activatable.setdefault(name, workload)
    for name, members in by_name.items():
        served = {s.endpoint.model_name for s in members if s.endpoint.model_name}
        rewrite = served.pop() if len(served) == 1 else None
        table.defaults[name] = Backend(
            ref=f"Model/{name}",
            candidates=tuple(members),
            model=rewrite if rewrite != name else None,
            **(limits.get(name) or _limits({}, config)),
            profile=profiles.get(name),
            **defaults,
        )
    for name, decodes, prefill, mode in pd_pairs(by_kind["Playground"], states):
        default = table.defaults.get(name)
        if default is not None and not (decodes and prefill):
            del table.defaults[name]  # no pair yet: activatable (held until both roles are up)
        elif default is not None:  # decode replicas, each paired with a prefill one (pd.py)
            pd = PDBackend(GROUP_KEY, prefill, mode)
            table.defaults[name] = replace(default, candidates=decodes, pd=pd)
    _adapter_routes(
        table,
        states,
        by_kind["Playground"],
        by_name,
        lambda base: {
            **(limits.get(base) or _limits({}, config)),
            "profile": profiles.get(base),
            **defaults,
        },
    )
    table.decisions = {
        name: RouteDecision(
            backend.ref, backend, backend.model or name, lora=name in table.adapters
        )
        for name, backend in table.defaults.items()
    }
    table.placeholders -= set(table.defaults)
    for name in set(table.activatable) - table.placeholders:
        del table.activatable[name]
    for name in table.failing:  # one failing Playground for the name: say so, do not hold
        table.activatable.pop(name, None)
    activatable_routes(table, selectors, by_kind["Playground"])
    for ref, problem in table.problems.items():
        log.warning("routing ignores %s: %s", ref, problem)
    return table
