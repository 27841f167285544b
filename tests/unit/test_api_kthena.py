"""ModelRoute and ModelServer (networking.serving.volcano.sh/v1alpha1).

Every validation rule has a test here that fails without it, asserting the exact field path.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from llmplane.api.documents import dump_resource, parse_document, parse_text
from llmplane.api.kthena import ModelRoute, ModelServer, split_host_port
from llmplane.api.registry import KINDS, resolve_kind
from llmplane.printing import jsonpath
from tests.unit.apihelpers import errors_of

DELETE = object()
API = "networking.serving.volcano.sh/v1alpha1"


def route(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "modelName": "llama",
        "rules": [{"name": "all", "targetModels": [{"modelServerName": "llama-server"}]}],
    }
    base.update(spec)
    return {"apiVersion": API, "kind": "ModelRoute", "metadata": {"name": "r"}, "spec": base}


def server(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "inferenceEngine": "vLLM",
        "workloadSelector": {"matchLabels": {"app": "llama"}},
    }
    base.update(spec)
    return {"apiVersion": API, "kind": "ModelServer", "metadata": {"name": "s"}, "spec": base}


def rule(match: dict[str, Any] | None = None, *targets: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"targetModels": list(targets) or [{"modelServerName": "a"}]}
    if match is not None:
        out["modelMatch"] = match
    return out


def rate(**fields: Any) -> dict[str, Any]:
    return route(rateLimit={"inputTokensPerUnit": 10, **fields})


def pd(**fields: Any) -> dict[str, Any]:
    group = {
        "groupKey": "group",
        "prefillLabels": {"role": "prefill"},
        "decodeLabels": {"role": "decode"},
    }
    group.update(fields)
    group = {k: v for k, v in group.items() if v is not DELETE}
    return server(workloadSelector={"pdGroup": group})


def with_(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    parent: Any = doc
    for part in path[:-1]:
        parent = parent[part]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def expect(doc: dict[str, Any], path: str, fragment: str) -> None:
    """Rejected with a message ``Kind/name: <path>: ...fragment...``."""
    label = f"{doc['kind']}/{doc['metadata']['name']}"
    messages = errors_of(doc)
    hits = [m for m in messages if m.startswith(f"{label}: {path}: ") and fragment in m]
    assert hits, f"expected {label}: {path}: ...{fragment}..., got {messages}"


def valid(doc: dict[str, Any]) -> Any:
    assert errors_of(doc) == []
    return parse_document(doc)[0]


T = "spec.rules[0].targetModels"
M = "spec.rules[0].modelMatch"

# --- registration and printing -----------------------------------------------------------------


def test_kinds_are_registered() -> None:
    for cls, plural in ((ModelRoute, "modelroutes"), (ModelServer, "modelservers")):
        assert KINDS[cls.__name__] is cls
        assert cls.api_version_string() == API
        assert cls.plural == plural
        assert cls.namespaced
        assert cls.short_names == ()
        assert resolve_kind(plural) is cls
        assert resolve_kind(f"{plural}.networking.serving.volcano.sh") is cls


def test_printer_columns_resolve_on_the_wire_form() -> None:
    mr = dump_resource(valid(route(loraAdapters=["sql"])))
    cols = {n: jsonpath(mr, p) for n, _, p in ModelRoute.printer_columns}
    assert cols == {"MODEL": "llama", "LORA-ADAPTERS": ["sql"]}
    ms = dump_resource(valid(server(model="meta/llama", workloadPort={"port": 8000})))
    cols = {n: jsonpath(ms, p) for n, _, p in ModelServer.printer_columns}
    assert cols == {"MODEL": "meta/llama", "ENGINE": "vLLM", "PORT": 8000, "PROTOCOL": "http"}


# --- defaults ----------------------------------------------------------------------------------


def test_model_route_defaults_visible_after_dump() -> None:
    data = dump_resource(
        valid(
            route(
                rateLimit={"outputTokensPerUnit": 5},
                parentRefs=[{"name": "gw"}],
            )
        )
    )
    assert data["metadata"]["namespace"] == "default"
    assert data["spec"]["rules"][0]["targetModels"] == [
        {"modelServerName": "llama-server", "weight": 100}
    ]
    assert data["spec"]["rateLimit"] == {"outputTokensPerUnit": 5, "unit": "second"}
    assert data["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"}
    ]


def test_model_server_defaults_visible_after_dump() -> None:
    doc = server(workloadPort={"port": 8000}, trafficPolicy={"retry": {}}, kvConnector={})
    spec = dump_resource(valid(doc))["spec"]
    assert spec["workloadPort"] == {"port": 8000, "protocol": "http"}
    assert spec["trafficPolicy"] == {"retry": {"attempts": 0, "retryInterval": "100ms"}}
    assert spec["kvConnector"] == {"type": "http"}


def test_durations_in_seconds() -> None:
    doc = server(trafficPolicy={"timeout": "1m30s", "retry": {"attempts": 2}})
    policy = valid(doc).spec.traffic_policy
    assert policy.timeout_seconds == 90.0
    assert policy.retry.retry_interval_seconds == pytest.approx(0.1)
    assert valid(server(trafficPolicy={})).spec.traffic_policy.timeout_seconds is None
    # The user's spelling is kept on the wire.
    assert dump_resource(valid(doc))["spec"]["trafficPolicy"]["timeout"] == "1m30s"


@pytest.mark.parametrize(("unit", "seconds"), [("second", 1), ("minute", 60), ("month", 2592000)])
def test_rate_limit_unit_seconds(unit: str, seconds: int) -> None:
    assert valid(rate(unit=unit)).spec.rate_limit.unit_seconds == seconds


# --- ModelRoute rules --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "path", "fragment"),
    [
        # modelName / loraAdapters
        (route(modelName=None), "spec", "modelName and loraAdapters cannot both be empty"),
        (route(modelName="", loraAdapters=[]), "spec", "cannot both be empty"),
        (route(loraAdapters=[f"l{i}" for i in range(11)]), "spec.loraAdapters", "at most 10 items"),
        (route(loraAdapters=["a", ""]), "spec.loraAdapters[1]", "must not be empty"),
        # rules
        (with_(route(), ("spec", "rules"), DELETE), "spec.rules", "required"),
        (route(rules=[]), "spec.rules", "at least 1 item"),
        (route(rules=[rule()] * 17), "spec.rules", "at most 16 items"),
        (route(rules=[{"name": "x"}]), T, "required"),
        (route(rules=[{"targetModels": []}]), T, "at least 1 item"),
        (route(rules=[rule(None, *[{"modelServerName": "a"}] * 17)]), T, "at most 16 items"),
        (route(rules=[rule(None, {"weight": 1})]), f"{T}[0].modelServerName", "required"),
        (
            route(rules=[rule(None, {"modelServerName": "Llama_7B"})]),
            f"{T}[0].modelServerName",
            "DNS-1123 label",
        ),
        (
            route(rules=[rule(None, {"modelServerName": ""})]),
            f"{T}[0].modelServerName",
            "DNS-1123 label",
        ),
        (
            route(rules=[rule(None, {"modelServerName": "a" * 64})]),
            f"{T}[0].modelServerName",
            "DNS-1123 label",
        ),
        (
            route(rules=[rule(None, {"modelServerName": "a", "weight": -1})]),
            f"{T}[0].weight",
            "greater than or equal to 0",
        ),
        (
            route(rules=[rule(None, {"modelServerName": "a", "weight": 101})]),
            f"{T}[0].weight",
            "less than or equal to 100",
        ),
        (
            route(
                rules=[
                    rule(None, {"modelServerName": "a"}, {"modelServerName": "b", "weight": 200})
                ]
            ),
            f"{T}[1].weight",
            "less than or equal to 100",
        ),
        # StringMatch
        (
            route(rules=[rule({"uri": {}})]),
            f"{M}.uri",
            "exactly one of exact, prefix or regex must be set (got none)",
        ),
        (
            route(rules=[rule({"uri": {"exact": "/a", "prefix": "/b"}})]),
            f"{M}.uri",
            "(got exact, prefix)",
        ),
        (
            route(rules=[rule({"headers": {"x-tier": {"exact": "a", "regex": "b"}}})]),
            f"{M}.headers['x-tier']",
            "exactly one",
        ),
        (
            route(rules=[rule({"headers": {"x-tier": {"regex": "(unclosed"}}})]),
            f"{M}.headers['x-tier'].regex",
            "not a valid regular expression (Python re syntax)",
        ),
        (route(rules=[rule({"uri": {"regex": "*bad"}})]), f"{M}.uri.regex", "Python re syntax"),
        (
            route(rules=[rule({"headers": {"x tier": {"exact": "a"}}})]),
            f"{M}.headers['x tier']",
            "not a valid HTTP header name",
        ),
        (
            route(rules=[rule({"headers": {"x-tier": None}})]),
            f"{M}.headers['x-tier']",
            "valid dictionary",
        ),
        (
            route(rules=[rule({"uri": {"prefix": "v1/chat"}})]),
            f"{M}.uri.prefix",
            "must start with '/'",
        ),
        (route(rules=[rule({"uri": {"exact": "v1"}})]), f"{M}.uri.exact", "must start with '/'"),
        (route(rules=[rule({"uri": {"glob": "/v1/*"}})]), f"{M}.uri.glob", "unknown field"),
        (
            route(rules=[rule({"body": {"models": "x"}})]),
            f"{M}.body.models",
            "did you mean 'model'?",
        ),
        # rateLimit
        (route(rateLimit={}), "spec.rateLimit", "set inputTokensPerUnit or outputTokensPerUnit"),
        (
            rate(inputTokensPerUnit=0),
            "spec.rateLimit.inputTokensPerUnit",
            "greater than or equal to 1",
        ),
        (
            rate(outputTokensPerUnit=0),
            "spec.rateLimit.outputTokensPerUnit",
            "greater than or equal to 1",
        ),
        (
            rate(inputTokensPerUnit=2**32),
            "spec.rateLimit.inputTokensPerUnit",
            "less than or equal to 4294967295",
        ),
        (
            rate(outputTokensPerUnit=2**32),
            "spec.rateLimit.outputTokensPerUnit",
            "less than or equal to 4294967295",
        ),
        (rate(unit="week"), "spec.rateLimit.unit", "'second', 'minute', 'hour', 'day' or 'month'"),
        (rate(unit="Minute"), "spec.rateLimit.unit", "'minute'"),
        (rate(**{"global": {}}), "spec.rateLimit.global.redis", "required for a global rate limit"),
        (rate(**{"global": {"redis": {}}}), "spec.rateLimit.global.redis.address", "required"),
        (
            rate(**{"global": {"redis": {"address": "redis"}}}),
            "spec.rateLimit.global.redis.address",
            "host:port",
        ),
        (
            rate(**{"global": {"redis": {"address": ":6379"}}}),
            "spec.rateLimit.global.redis.address",
            "host:port",
        ),
        (
            rate(**{"global": {"redis": {"address": "redis:0"}}}),
            "spec.rateLimit.global.redis.address",
            "from 1 to 65535",
        ),
        (
            rate(**{"global": {"redis": {"address": "redis:65536"}}}),
            "spec.rateLimit.global.redis.address",
            "from 1 to 65535",
        ),
        (
            rate(**{"global": {"redis": {"address": "redis:port"}}}),
            "spec.rateLimit.global.redis.address",
            "from 1 to 65535",
        ),
        (
            rate(**{"global": {"redis": {"address": "redis://r:6379"}}}),
            "spec.rateLimit.global.redis.address",
            "without a scheme",
        ),
        (
            rate(**{"global": {"redis": {"address": "::1:6379"}}}),
            "spec.rateLimit.global.redis.address",
            "brackets",
        ),
        # parentRefs
        (route(parentRefs=[{}]), "spec.parentRefs[0].name", "required"),
        (
            route(parentRefs=[{"name": "gw", "port": 0}]),
            "spec.parentRefs[0].port",
            "greater than or equal to 1",
        ),
        (
            route(parentRefs=[{"name": "gw", "kind": "a/b"}]),
            "spec.parentRefs[0].kind",
            "start with a letter",
        ),
        # unknown fields
        (route(modelname="x"), "spec.modelname", "did you mean 'modelName'?"),
        (
            route(rules=[{"targetModel": [{"modelServerName": "a"}]}]),
            "spec.rules[0].targetModel",
            "did you mean 'targetModels'?",
        ),
    ],
)
def test_model_route_rules(doc: dict[str, Any], path: str, fragment: str) -> None:
    expect(doc, path, fragment)


@pytest.mark.parametrize(
    "spec",
    [
        {"modelName": None, "loraAdapters": ["sql-lora"]},
        {"loraAdapters": [f"l{i}" for i in range(10)]},
        {"rules": [rule()] * 16},
        {"rules": [rule(None, *[{"modelServerName": "a", "weight": 0}] * 16)]},
        {"rules": [rule(None, {"modelServerName": "a" * 63, "weight": 100})]},
        {"rules": [rule({})]},
        {"rules": [rule({"headers": {"X-User_Tier.v2": {"prefix": "gold"}}})]},
        {"rules": [rule({"uri": {"regex": r"^/v1/(chat/)?completions$"}})]},
        {"rules": [rule({"uri": {"exact": "/v1/completions"}, "body": {"model": "m"}})]},
        {"rateLimit": {"inputTokensPerUnit": 1, "outputTokensPerUnit": 2**32 - 1, "unit": "month"}},
        {"rateLimit": {"outputTokensPerUnit": 1, "global": {"redis": {"address": "10.0.0.1:1"}}}},
        {"rateLimit": {"outputTokensPerUnit": 1, "global": {"redis": {"address": "[::1]:65535"}}}},
    ],
)
def test_model_route_boundaries_are_accepted(spec: dict[str, Any]) -> None:
    valid(route(**spec))


def test_split_host_port() -> None:
    assert split_host_port("redis.default.svc:6379") == ("redis.default.svc", 6379)
    assert split_host_port("[fd00::1]:6380") == ("fd00::1", 6380)
    with pytest.raises(ValueError, match="host:port"):
        split_host_port("redis")


# --- ModelServer rules -------------------------------------------------------------------------

P = "spec.workloadSelector.pdGroup"


@pytest.mark.parametrize(
    ("doc", "path", "fragment"),
    [
        (server(model="m" * 257), "spec.model", "at most 256 characters"),
        (with_(server(), ("spec", "inferenceEngine"), DELETE), "spec.inferenceEngine", "required"),
        (
            server(inferenceEngine="vllm"),
            "spec.inferenceEngine",
            "be 'vLLM' or 'SGLang'",
        ),
        (server(inferenceEngine="sglang"), "spec.inferenceEngine", "'SGLang'"),
        (server(inferenceEngine="TGI"), "spec.inferenceEngine", "'vLLM' or 'SGLang'"),
        # workloadSelector
        (
            with_(server(), ("spec", "workloadSelector"), DELETE),
            "spec.workloadSelector",
            "required",
        ),
        (server(workloadSelector={}), "spec.workloadSelector", "set matchLabels or pdGroup"),
        (
            server(workloadSelector={"matchLabels": {}}),
            "spec.workloadSelector",
            "set matchLabels or pdGroup",
        ),
        (
            server(workloadSelector={"matchLabels": {"app": "a b"}}),
            "spec.workloadSelector.matchLabels.app",
            "label value",
        ),
        (
            server(workloadSelector={"matchLabels": {"a/b/c": "x"}}),
            "spec.workloadSelector.matchLabels['a/b/c']",
            "label key",
        ),
        # pdGroup
        (pd(groupKey=DELETE), f"{P}.groupKey", "required"),
        (pd(prefillLabels=DELETE), f"{P}.prefillLabels", "required"),
        (pd(decodeLabels=DELETE), f"{P}.decodeLabels", "required"),
        (pd(groupKey=""), f"{P}.groupKey", "must not be empty"),
        (pd(groupKey="bad key"), f"{P}.groupKey", "label key name"),
        (pd(prefillLabels={}), f"{P}.prefillLabels", "at least one label"),
        (pd(decodeLabels={}), f"{P}.decodeLabels", "at least one label"),
        (pd(decodeLabels={"role": "-x"}), f"{P}.decodeLabels.role", "label value"),
        (
            pd(decodeLabels={"role": "prefill"}),
            f"{P}.decodeLabels",
            "must differ from prefillLabels",
        ),
        # workloadPort
        (server(workloadPort={}), "spec.workloadPort.port", "required"),
        (server(workloadPort={"port": 0}), "spec.workloadPort.port", "greater than or equal to 1"),
        (
            server(workloadPort={"port": 65536}),
            "spec.workloadPort.port",
            "less than or equal to 65535",
        ),
        (
            server(workloadPort={"port": 80, "protocol": "grpc"}),
            "spec.workloadPort.protocol",
            "'http' or 'https'",
        ),
        (
            server(workloadPort={"port": 80, "protocol": "HTTP"}),
            "spec.workloadPort.protocol",
            "'http' or 'https'",
        ),
        # trafficPolicy
        (server(trafficPolicy={"timeout": "30"}), "spec.trafficPolicy.timeout", "not a duration"),
        (server(trafficPolicy={"timeout": 30}), "spec.trafficPolicy.timeout", "duration string"),
        (server(trafficPolicy={"timeout": "0s"}), "spec.trafficPolicy.timeout", "must be positive"),
        (
            server(trafficPolicy={"timeout": "-5s"}),
            "spec.trafficPolicy.timeout",
            "must be positive",
        ),
        (
            server(trafficPolicy={"retry": {"attempts": -1}}),
            "spec.trafficPolicy.retry.attempts",
            "greater than or equal to 0",
        ),
        (
            server(trafficPolicy={"retry": {"attempts": 2**31}}),
            "spec.trafficPolicy.retry.attempts",
            "less than or equal to 2147483647",
        ),
        (
            server(trafficPolicy={"retry": {"retryInterval": "1 second"}}),
            "spec.trafficPolicy.retry.retryInterval",
            "not a duration",
        ),
        (
            server(trafficPolicy={"retry": {"retryInterval": "-1s"}}),
            "spec.trafficPolicy.retry.retryInterval",
            "must not be negative",
        ),
        (
            server(trafficPolicy={"retries": {}}),
            "spec.trafficPolicy.retries",
            "did you mean 'retry'?",
        ),
        # kvConnector
        (
            server(kvConnector={"type": "NIXL"}),
            "spec.kvConnector.type",
            "'http', 'lmcache', 'nixl' or 'mooncake'",
        ),
        (server(kvconnector={"type": "nixl"}), "spec.kvconnector", "did you mean 'kvConnector'?"),
    ],
)
def test_model_server_rules(doc: dict[str, Any], path: str, fragment: str) -> None:
    expect(doc, path, fragment)


@pytest.mark.parametrize(
    "spec",
    [
        {"model": "m" * 256},
        {"inferenceEngine": "SGLang"},
        {
            "workloadSelector": {
                "pdGroup": {
                    "groupKey": "g",
                    "prefillLabels": {"r": "p"},
                    "decodeLabels": {"r": "d"},
                }
            }
        },
        {"workloadPort": {"port": 1, "protocol": "https"}},
        {"workloadPort": {"port": 65535}},
        {"trafficPolicy": {"timeout": "100ms", "retry": {"attempts": 0, "retryInterval": "0"}}},
        {"trafficPolicy": {"timeout": "1h2m3.5s"}},
        *({"kvConnector": {"type": t}} for t in ("http", "lmcache", "nixl", "mooncake")),
    ],
)
def test_model_server_boundaries_are_accepted(spec: dict[str, Any]) -> None:
    valid(server(**spec))


# --- whole documents ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "doc",
    [
        route(
            loraAdapters=["a"],
            rules=[rule({"headers": {"x": {"regex": "^a+$"}}, "uri": {"prefix": "/v1"}})],
            rateLimit={"inputTokensPerUnit": 5, "global": {"redis": {"address": "r:6379"}}},
        ),
        server(
            model="m",
            workloadSelector={
                "matchLabels": {"app": "x"},
                "pdGroup": {
                    "groupKey": "g",
                    "prefillLabels": {"r": "p"},
                    "decodeLabels": {"r": "d"},
                },
            },
            workloadPort={"port": 8000},
            trafficPolicy={"timeout": "2m", "retry": {"attempts": 3}},
            kvConnector={"type": "mooncake"},
        ),
    ],
)
def test_round_trip_load_dump_load(doc: dict[str, Any]) -> None:
    first = valid(doc)
    dumped = dump_resource(first)
    second = valid(yaml.safe_load(yaml.safe_dump(dumped)))
    assert second == first
    assert dump_resource(second) == dumped


def test_examples_parse_and_round_trip(examples_dir: Any) -> None:
    kinds = set()
    for name in ("modelroute.yaml", "modelserver.yaml"):
        parsed = parse_text((examples_dir / name).read_text(), name)
        for resource in parsed.resources:
            kinds.add(resource.kind)
            again = parse_document(yaml.safe_load(yaml.safe_dump(dump_resource(resource))))[0]
            assert again == resource
    assert kinds == {"ModelRoute", "ModelServer"}


def test_example_route_targets_exist_as_example_servers(examples_dir: Any) -> None:
    servers = {
        r.name for r in parse_text((examples_dir / "modelserver.yaml").read_text()).resources
    }
    routes = parse_text((examples_dir / "modelroute.yaml").read_text()).resources
    for r in routes:
        for rl in r.spec.rules:
            for t in rl.target_models:
                assert t.model_server_name in servers


def test_every_mistake_in_one_document_is_reported() -> None:
    doc = route(
        modelName="",
        rules=[
            {
                "modelMatch": {"uri": {"exact": "/a", "prefix": "/b"}},
                "targetModels": [{"modelServerName": "a", "weight": 150}],
            }
        ],
        rateLimit={"unit": "week", "inputTokensPerUnit": 10},
        modelname="typo",
    )
    messages = errors_of(doc)
    paths = sorted(m.split(": ")[1] for m in messages)
    assert paths == [
        "spec",  # modelName and loraAdapters both empty (a rule, despite the structural errors)
        "spec.modelname",
        "spec.rateLimit.unit",
        f"{M}.uri",
        f"{T}[0].weight",
    ]


def test_lowercase_engine_names_the_right_spelling() -> None:
    (message,) = errors_of(server(inferenceEngine="vllm"))
    # pydantic's literal error ("Input should be ..."), possibly reworded to "must be ...".
    assert re.fullmatch(
        r"ModelServer/s: spec\.inferenceEngine: (Input should|must) be 'vLLM' or 'SGLang'", message
    ), message
