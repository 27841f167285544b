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
``x-gateway-inference-objective``) gets the objective's integer priority
(``RouteDecision.priority``) for flow control.

``RoutingTable.resolve`` follows that order; ``build_table`` reads each kind in one method of
``_Builder``.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

from llmplane.api.gie import InferenceModel
from llmplane.api.gie_v1 import H2C, pool_v1
from llmplane.api.kthena import ModelRoute, ModelServer, StringMatch
from llmplane.api.llmd import OBJECTIVE_HEADERS, InferenceModelRewrite, InferenceObjective
from llmplane.gateway.clip import shown
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.disaggregated import GROUP_KEY, pd_pairs
from llmplane.gateway.errors import ErrorCode, GatewayError, ModelNotFound, NotReady, missing_model
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
    return SGLANG if engine == "SGLang" else connector or "http"


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
    # criticality's (Critical 1, Default 0, Sheddable -1: flowcontrol/queue.py).
    priority: int | None = None


# --- routes ------------------------------------------------------------------------------------

T = TypeVar("T")


def _pick_weighted(targets: Sequence[tuple[T, float]]) -> T | None:
    """One of ``targets`` (target, weight) at random by weight; None when every weight is 0."""
    weights = [w for _, w in targets]
    return random.choices([t for t, _ in targets], weights)[0] if sum(weights) > 0 else None


def _no_backend(model: str, why: str) -> GatewayError:
    return GatewayError(503, f"model {model!r}: {why}", ErrorCode.NO_BACKEND)


@dataclass(frozen=True)
class _Match:
    """A Kthena ``StringMatch``: exact, prefix or (unanchored) regex; empty matches all."""

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


class _Target(NamedTuple):
    server: str  # ModelServer name (same namespace as the route)
    weight: int


@dataclass(frozen=True)
class _Rule:
    """One ModelRoute rule: its ``modelMatch`` and the ModelServers it sends to."""

    name: str
    headers: tuple[tuple[str, _Match], ...]
    uri: _Match | None
    body_model: str | None
    targets: tuple[_Target, ...]

    @classmethod
    def of(cls, rule: Any, index: int) -> _Rule:
        match = rule.model_match
        headers = (match and match.headers) or {}
        return cls(
            name=rule.name or str(index),
            headers=tuple((name.lower(), _Match.of(m)) for name, m in headers.items()),
            uri=_Match.of(match.uri) if match and match.uri else None,
            body_model=match.body.model if match and match.body else None,
            targets=tuple(_Target(t.model_server_name, t.weight) for t in rule.target_models),
        )

    def matches(self, model: str, path: str, headers: Mapping[str, str]) -> bool:
        if self.body_model is not None and model != self.body_model:
            return False
        if self.uri is not None and not self.uri(path):
            return False
        return all(match(headers.get(name)) for name, match in self.headers)


@dataclass(frozen=True)
class _Route:
    """A Kthena ModelRoute."""

    ref: str
    namespace: str
    rules: tuple[_Rule, ...]


@dataclass(frozen=True)
class _PoolRoute:
    """An InferenceModel or one InferenceModelRewrite rule: the names to send (by weight;
    none: the request's) to its pool's backend (None: ``problem`` says why there is none)."""

    ref: str
    targets: tuple[tuple[str, float], ...]
    backend: Backend | None
    problem: str
    criticality: str | None = None

    def decide(self, model: str) -> RouteDecision:
        if self.backend is None:
            raise _no_backend(model, self.problem)
        if not self.targets:
            return RouteDecision(self.ref, self.backend, model)
        target = _pick_weighted(self.targets)
        if target is None:
            raise _no_backend(model, f"every target model of {self.ref} has weight 0")
        return RouteDecision(self.ref, self.backend, target, self.criticality)


# --- the table ---------------------------------------------------------------------------------


@dataclass
class RoutingTable:
    """Every name the gateway routes, by the kind that routes it (``resolve``: in which order)."""

    routes_by_model: dict[str, list[_Route]] = field(default_factory=dict)
    routes_by_lora: dict[str, list[_Route]] = field(default_factory=dict)
    servers: dict[tuple[str, str], Backend] = field(default_factory=dict)  # (ns, name)
    inference_models: dict[str, list[_PoolRoute]] = field(default_factory=dict)
    # InferenceModelRewrite rules by exact model name, and those without matches; each in
    # precedence order (oldest rewrite, then rule order).
    rewrites: dict[str, list[_PoolRoute]] = field(default_factory=dict)
    fallbacks: list[_PoolRoute] = field(default_factory=list)
    # Names routed without extra YAML (served names, LoRA adapters), decided once per table.
    decisions: dict[str, RouteDecision] = field(default_factory=dict)
    # Playground models without endpoints -> why their engine fails (None: it is starting).
    placeholders: dict[str, str | None] = field(default_factory=dict)
    # Placeholders whose requests the activator may hold -> their workload (namespace/name).
    activatable: dict[str, str] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # ref -> why it is ignored
    # (pool ref, InferenceObjective name) -> its priority.
    objectives: dict[tuple[str, str], int] = field(default_factory=dict)

    def targets(self) -> Iterator[tuple[str, list[Backend | None]]]:
        """Each name a route, InferenceModel or rewrite serves, with the backends its targets
        resolve to (None: a ModelServer that does not exist)."""
        for name, routes in self.routes_by_model.items():
            servers = [
                (r.namespace, t.server) for r in routes for rule in r.rules for t in rule.targets
            ]
            yield name, [self.servers.get(server) for server in servers]
        for name, entries in self.inference_models.items():
            yield name, [entry.backend for entry in entries]
        for name, rewrites in self.rewrites.items():
            yield name, [rewrites[0].backend]

    def model_names(self) -> list[str]:
        names = set(self.routes_by_model) | set(self.routes_by_lora) | set(self.inference_models)
        return sorted(names | set(self.rewrites) | set(self.decisions) | set(self.placeholders))

    def resolve(self, model: str, path: str, headers: Mapping[str, str]) -> RouteDecision:
        """The decision for ``model``, with the priority of the InferenceObjective the request
        names when it is one of the decision's pool."""
        decision = self._decide(model, path, headers)
        if self.objectives:
            for header in OBJECTIVE_HEADERS:
                if name := headers.get(header):
                    priority = self.objectives.get((decision.backend.ref, name))
                    return decision if priority is None else replace(decision, priority=priority)
        return decision

    def _decide(self, model: str, path: str, headers: Mapping[str, str]) -> RouteDecision:
        if model:
            if (routes := self.routes_by_model.get(model)) is not None:
                return self._model_route(routes, model, False, path, headers)
            if (routes := self.routes_by_lora.get(model)) is not None:
                return self._model_route(routes, model, True, path, headers)
            if pool_routes := self.inference_models.get(model) or self.rewrites.get(model):
                return pool_routes[0].decide(model)
            if (decision := self.decisions.get(model)) is not None:
                return decision
            if model in self.placeholders:
                failing = self.placeholders[model]
                raise NotReady(
                    f"model {model!r} has no ready endpoint: {failing}"
                    if failing
                    else f"model {model!r} has no ready endpoint yet (its Playground is "
                    "starting or scaled to zero)"
                )
        if self.fallbacks:  # a name nothing above knows, or no model: a catch-all rewrite
            return self.fallbacks[0].decide(model)
        raise model_not_found(model, self.model_names()) if model else missing_model()

    def _model_route(
        self, routes: list[_Route], model: str, lora: bool, path: str, headers: Mapping[str, str]
    ) -> RouteDecision:
        for route in routes:
            for rule in route.rules:
                if not rule.matches(model, path, headers):
                    continue
                server = _pick_weighted(rule.targets)
                ref = f"{route.ref}#{rule.name}"
                if server is None:
                    raise _no_backend(model, f"every target of {ref} has weight 0")
                backend = self.servers.get((route.namespace, server))
                if backend is None:
                    raise _no_backend(
                        model,
                        f"{ref} targets ModelServer {server!r}, "
                        f"which does not exist in namespace {route.namespace!r}",
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


def build_table(
    objects: Iterable[dict[str, Any]],
    states: Iterable[EndpointState],
    config: GatewayConfig | None = None,
) -> RoutingTable:
    """A new routing table from store objects (any kinds; others are ignored) and endpoints."""
    build = _Builder(objects, states, config or GatewayConfig())
    build.model_servers()
    build.model_routes()
    build.inference_pools()
    build.inference_models()
    build.objectives()
    build.rewrites()
    build.served_models()
    build.lora_adapters()
    return build.finish()


class _Builder:
    """Fills one RoutingTable from the objects of each kind, in ``build_table``'s order."""

    def __init__(
        self,
        objects: Iterable[dict[str, Any]],
        states: Iterable[EndpointState],
        config: GatewayConfig,
    ) -> None:
        self.table = RoutingTable()
        self.states = list(states)
        self.config = config
        self.by_kind: dict[str, list[dict[str, Any]]] = {k: [] for k in ROUTE_KINDS}
        for obj in objects:
            if obj.get("kind") in self.by_kind:
                self.by_kind[obj["kind"]].append(obj)
        self.playgrounds = self.by_kind["Playground"]
        # What each ModelServer / InferencePool selects (by ref), to trace an empty one to the
        # Playground that would fill it.
        self.selectors: dict[str, tuple[str, dict[str, str]]] = {}
        self.pools: dict[tuple[str, str], Backend] = {}
        self.unusable_pools: dict[tuple[str, str], str] = {}  # (ns, name) -> why
        # Served model name -> its endpoints, and its Playground's Backend settings.
        self.by_name: dict[str, list[EndpointState]] = {}
        for state in self.states:
            for name in state.endpoint.served_names():
                self.by_name.setdefault(name, []).append(state)
        self.named_settings: dict[str | None, dict[str, Any]] = {}

    # Helpers shared by the kinds

    def specs(self, kind: str, model: Any) -> Iterator[tuple[dict[str, Any], str, str, Any]]:
        """(metadata, ref, namespace, parsed spec) of each ``kind`` object, oldest first, that
        validates against ``model`` (a model class, or a function from the object to one);
        the others become the table's problems."""
        parse = getattr(model, "model_validate", model)

        def age(obj: Mapping[str, Any]) -> tuple[str, str, str]:
            meta = obj["metadata"]
            return meta.get("creationTimestamp") or "", _namespace(meta), meta["name"]

        for obj in sorted(self.by_kind[kind], key=age):
            meta = obj["metadata"]
            namespace = _namespace(meta)
            ref = f"{kind}/{namespace}/{meta['name']}"
            try:
                spec = parse(obj).spec
            except Exception as err:
                self.table.problems[ref] = f"invalid: {err}"
                continue
            yield meta, ref, namespace, spec

    def selected(self, namespace: str, selector: Mapping[str, str]) -> tuple[EndpointState, ...]:
        labels = selector.items()
        return tuple(
            s
            for s in self.states
            if s.endpoint.namespace == namespace
            and all(s.endpoint.labels.get(k) == v for k, v in labels)
        )

    def settings(self, meta: Mapping[str, Any]) -> dict[str, Any]:
        """The Backend fields an object's annotations set, else the config's defaults."""
        c = self.config
        return {
            "timeout": _annotation(meta, TIMEOUT_ANNOTATION, _seconds, c.default_timeout),
            "stall_timeout": _annotation(meta, STALL_ANNOTATION, _seconds, c.stream_stall_timeout),
            "migration_limit": _annotation(meta, MIGRATION_ANNOTATION, _count, c.migration_limit),
            "retry_attempts": c.default_retry_attempts,
            "retry_interval": c.default_retry_interval,
            "profile": (meta.get("annotations") or {}).get(PROFILE_ANNOTATION),
        }

    def pool_of(self, namespace: str, ref: str, pool_ref: Any) -> tuple[Backend | None, str]:
        """The InferencePool backend ``ref`` names, else None and why there is none."""
        if pool_ref.kind != "InferencePool" or pool_ref.group not in POOL_GROUPS:
            return None, f"{ref} names a {pool_ref.kind} of group {pool_ref.group!r}, not a pool"
        key = (namespace, pool_ref.name)
        problem = self.unusable_pools.get(key) or (
            f"{ref} names InferencePool {pool_ref.name!r}, which does not exist"
        )
        return self.pools.get(key), problem

    # One method per source kind

    def model_servers(self) -> None:
        """Kthena ModelServers: the backends ModelRoutes send to, by (namespace, name)."""
        for meta, ref, namespace, spec in self.specs("ModelServer", ModelServer):
            selector = dict(spec.workload_selector.match_labels or {})
            group, pd = spec.workload_selector.pd_group, None
            if group is None:
                self.selectors[ref] = (namespace, selector)
            else:  # candidates are the decode replicas; pd.py pairs each with a prefill one
                prefill = self.selected(namespace, {**selector, **group.prefill_labels})
                connector = spec.kv_connector and spec.kv_connector.type
                pd = PDBackend(group.group_key, prefill, mode_of(spec.inference_engine, connector))
                selector.update(group.decode_labels)
            settings = self.settings(meta)
            policy = spec.traffic_policy
            if policy is not None and policy.timeout_seconds is not None:
                settings["timeout"] = policy.timeout_seconds
            if policy is not None and policy.retry is not None:
                settings["retry_attempts"] = policy.retry.attempts
                settings["retry_interval"] = policy.retry.retry_interval_seconds
            port = spec.workload_port.port if spec.workload_port else None
            candidates = self.selected(namespace, selector)
            backend = Backend(ref, candidates, port, spec.model or None, pd=pd, **settings)
            self.table.servers[(namespace, meta["name"])] = backend

    def model_routes(self) -> None:
        """Kthena ModelRoutes, by model name and by LoRA adapter, oldest first."""
        for _, ref, namespace, spec in self.specs("ModelRoute", ModelRoute):
            rules = tuple(_Rule.of(rule, i) for i, rule in enumerate(spec.rules))
            entry = _Route(ref, namespace, rules)
            if spec.model_name:
                self.table.routes_by_model.setdefault(spec.model_name, []).append(entry)
            for adapter in set(spec.lora_adapters or ()):
                self.table.routes_by_lora.setdefault(adapter, []).append(entry)

    def inference_pools(self) -> None:
        """InferencePools: the backends the llm-d and Inference Extension kinds name."""
        for meta, ref, namespace, spec in self.specs("InferencePool", pool_v1):
            key = (namespace, meta["name"])
            if spec.app_protocol == H2C:
                self.unusable_pools[key] = self.table.problems[ref] = (
                    f"{ref} has appProtocol {H2C}: the gateway speaks HTTP/1.1 to model servers"
                )
                continue
            selector = spec.selector.match_labels
            self.selectors[ref] = (namespace, dict(selector))
            # Every port of a v1 pool is an endpoint of its own to an endpoint picker; this
            # gateway sends to the first (docs/gateway.md).
            port = spec.target_ports[0].number
            self.pools[key] = Backend(
                ref, self.selected(namespace, selector), port, **self.settings(meta)
            )

    def inference_models(self) -> None:
        for _, ref, namespace, spec in self.specs("InferenceModel", InferenceModel):
            backend, problem = self.pool_of(namespace, ref, spec.pool_ref)
            # Its criticality when it names one; else (None) the tenant's applies.
            criticality = spec.criticality if "criticality" in spec.model_fields_set else None
            entry = _PoolRoute(ref, tuple(spec.target_shares()), backend, problem, criticality)
            self.table.inference_models.setdefault(spec.model_name, []).append(entry)

    def objectives(self) -> None:
        for meta, ref, namespace, spec in self.specs("InferenceObjective", InferenceObjective):
            backend, problem = self.pool_of(namespace, ref, spec.pool_ref)
            if backend is None:
                self.table.problems[ref] = problem
            else:
                self.table.objectives[(backend.ref, meta["name"])] = spec.effective_priority

    def rewrites(self) -> None:
        for _, ref, namespace, spec in self.specs("InferenceModelRewrite", InferenceModelRewrite):
            backend, problem = self.pool_of(namespace, ref, spec.pool_ref)
            for i, rule in enumerate(spec.rules):
                entry = _PoolRoute(f"{ref}#{i}", tuple(rule.shares()), backend, problem)
                for match in rule.matches or ():
                    self.table.rewrites.setdefault(match.model.value, []).append(entry)
                if not rule.matches:
                    self.table.fallbacks.append(entry)

    def served_models(self) -> None:
        """Playgrounds and plain endpoints: routable by the served model name; a Playground's
        name with no endpoint yet is a placeholder (503, maybe held for the activator)."""
        table = self.table
        for obj in self.playgrounds:
            meta, failing = obj["metadata"], failing_reason(obj)
            settings, workload = self.settings(meta), f"{_namespace(meta)}/{meta['name']}"
            for name in playground_models(obj.get("spec") or {}):
                self.named_settings.setdefault(name, settings)
                if not table.placeholders.get(name):  # the first failing Playground says why
                    table.placeholders[name] = failing
                if not failing:
                    table.activatable.setdefault(name, workload)
        defaults = {}
        for name, members in self.by_name.items():
            served = {s.endpoint.model_name for s in members if s.endpoint.model_name}
            model = served.pop() if len(served) == 1 else None
            defaults[name] = Backend(
                f"Model/{name}",
                tuple(members),
                model=model if model != name else None,
                **self.settings_of(name),
            )
        for name, decodes, prefill, mode in pd_pairs(self.playgrounds, self.states):
            if name in defaults and not (decodes and prefill):
                del defaults[name]  # no pair yet: activatable (held until both roles are up)
            elif name in defaults:  # decode replicas, each paired with a prefill one (pd.py)
                pd = PDBackend(GROUP_KEY, prefill, mode)
                defaults[name] = replace(defaults[name], candidates=decodes, pd=pd)
        for name, backend in defaults.items():
            self.route(name, backend)

    def lora_adapters(self) -> None:
        """LoRA adapters need no YAML: those a replica reports route to the replicas holding
        them; those declared on a Playground and held by none route to its replicas, marked
        for loading (``gateway/adapters.py``). A model of the adapter's name wins."""
        decisions = self.table.decisions
        for name, members in reported_adapters(self.states).items():
            if name not in decisions:
                settings = self.settings_of(members[0].endpoint.model_name)
                self.route(name, Backend(f"LoRA/{name}", tuple(members), **settings), lora=True)
        for adapter in declared_adapters(self.playgrounds):
            if (name := adapter.name) not in decisions:
                candidates = tuple(self.by_name.get(adapter.base, ()))
                backend = Backend(f"LoRA/{name}", candidates, **self.settings_of(adapter.base))
                decisions[name] = RouteDecision(backend.ref, backend, name, lora=True, load=adapter)

    def settings_of(self, name: str | None) -> dict[str, Any]:
        """The Backend settings of the Playground serving ``name``, else the defaults."""
        return self.named_settings.get(name) or self.settings({})

    def route(self, name: str, backend: Backend, lora: bool = False) -> None:
        """Route ``name`` to ``backend`` without extra YAML (decided once per table): it is no
        placeholder any more."""
        decision = RouteDecision(backend.ref, backend, backend.model or name, lora=lora)
        self.table.decisions[name] = decision
        self.table.placeholders.pop(name, None)

    def finish(self) -> RoutingTable:
        table = self.table
        table.activatable = {  # only for a placeholder no Playground of the name fails
            name: workload
            for name, workload in table.activatable.items()
            if name in table.placeholders and not table.placeholders[name]
        }
        held = activatable_routes(
            table.targets(), table.activatable, self.selectors, self.playgrounds
        )
        table.activatable = held | table.activatable
        for ref, problem in table.problems.items():
            log.warning("routing ignores %s: %s", ref, problem)
        return table


def _namespace(meta: Mapping[str, Any]) -> str:
    return meta.get("namespace") or "default"


def _annotation(
    meta: Mapping[str, Any], annotation: str, parse: Callable[[str], T], default: T
) -> T:
    """``parse`` of an annotation's value, else ``default`` (a bad value is logged)."""
    value = (meta.get("annotations") or {}).get(annotation)
    if value is None:
        return default
    try:
        return parse(str(value).strip())
    except ValueError as err:
        log.warning("ignoring %s=%r on %s: %s", annotation, value, meta.get("name"), err)
        return default


def _seconds(text: str) -> float | None:
    """A positive number of seconds ("0", "none" or "off": no limit)."""
    text = text.lower().removesuffix("s")
    if text in ("0", "none", "off"):
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError("not a number of seconds")
    return seconds


def _count(text: str) -> int:
    """A whole number >= 0 (at most six digits)."""
    if not (text.isascii() and text.isdigit() and len(text) <= 6):
        raise ValueError("not a count")
    return int(text)
