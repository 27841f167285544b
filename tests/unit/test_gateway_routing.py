"""The routing table as a pure function of store objects and endpoints."""

from __future__ import annotations

import dataclasses

import pytest

from llmplane.controlplane.plan import MODEL_NAME_LABEL
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import Endpoint
from llmplane.gateway.errors import GatewayError
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.routing import build_table

KTHENA = "networking.serving.volcano.sh/v1alpha1"


def ep(port, labels, model="m", namespace="default", fixed=False):
    return EndpointState(
        Endpoint(f"10.0.0.{port}:{port}", labels, model, namespace=namespace, fixed_port=fixed)
    )


def server(name, model, labels, ns="default", **spec):
    return {
        "apiVersion": KTHENA,
        "kind": "ModelServer",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"model": model, "inferenceEngine": "vLLM", "workloadSelector": labels, **spec},
    }


def route(name, spec, created="2024-01-01T00:00:00Z", ns="default"):
    return {
        "apiVersion": KTHENA,
        "kind": "ModelRoute",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
        "spec": spec,
    }


def targets(*names):
    return [{"modelServerName": n} for n in names]


STATES = [ep(1, {"app": "a"}), ep(2, {"app": "b"}), ep(3, {"app": "a"}, namespace="other")]


def test_routes_with_the_same_name_oldest_first():
    objects = [
        server("a", "model-a", {"matchLabels": {"app": "a"}}),
        server("b", "model-b", {"matchLabels": {"app": "b"}}),
        route(
            "newer",
            {"modelName": "x", "rules": [{"targetModels": targets("b")}]},
            "2024-02-01T00:00:00Z",
        ),
        route(
            "older",
            {"modelName": "x", "rules": [{"targetModels": targets("a")}]},
            "2024-01-01T00:00:00Z",
        ),
    ]
    table = build_table(objects, STATES)
    decision = table.resolve("x", "/v1/completions", {})
    assert decision.route == "ModelRoute/default/older#0"
    assert decision.model == "model-a"
    assert [s.address for s in decision.backend.candidates] == ["10.0.0.1:1"]  # not other namespace


def test_exact_model_name_wins_over_lora_and_lora_is_not_rewritten():
    objects = [
        server("a", "model-a", {"matchLabels": {"app": "a"}}),
        server("b", "model-b", {"matchLabels": {"app": "b"}}),
        route("lora", {"loraAdapters": ["x", "sql"], "rules": [{"targetModels": targets("a")}]}),
        route(
            "exact",
            {"modelName": "x", "rules": [{"targetModels": targets("b")}]},
            "2025-01-01T00:00:00Z",
        ),
    ]
    table = build_table(objects, STATES)
    assert table.resolve("x", "/", {}).model == "model-b"
    sql = table.resolve("sql", "/", {})
    assert (sql.model, sql.lora) == ("sql", True)


def test_no_matching_rule_is_404_and_missing_server_503():
    objects = [
        route(
            "r",
            {
                "modelName": "x",
                "rules": [
                    {
                        "modelMatch": {"headers": {"x-tier": {"exact": "gold"}}},
                        "targetModels": targets("gone"),
                    }
                ],
            },
        )
    ]
    table = build_table(objects, STATES)
    with pytest.raises(GatewayError) as err:
        table.resolve("x", "/", {})
    assert err.value.status == 404 and err.value.code == "no_matching_route"
    with pytest.raises(GatewayError) as err:
        table.resolve("x", "/", {"x-tier": "gold"})
    assert err.value.status == 503 and "gone" in err.value.message


def test_weights_zero_never_chosen():
    objects = [
        server("a", "model-a", {"matchLabels": {"app": "a"}}),
        server("b", "model-b", {"matchLabels": {"app": "b"}}),
        route(
            "r",
            {
                "modelName": "x",
                "rules": [
                    {
                        "targetModels": [
                            {"modelServerName": "a", "weight": 0},
                            {"modelServerName": "b", "weight": 5},
                        ]
                    }
                ],
            },
        ),
    ]
    table = build_table(objects, STATES)
    assert {table.resolve("x", "/", {}).model for _ in range(50)} == {"model-b"}


def test_pd_group_serves_on_decode_instances_and_ports():
    states = [
        ep(1, {"app": "pd", "role": "prefill"}),
        ep(2, {"app": "pd", "role": "decode"}),
        ep(3, {"app": "pd", "role": "decode"}, fixed=True),
    ]
    objects = [
        server(
            "pd",
            "model-pd",
            {
                "matchLabels": {"app": "pd"},
                "pdGroup": {
                    "groupKey": "g",
                    "prefillLabels": {"role": "prefill"},
                    "decodeLabels": {"role": "decode"},
                },
            },
            workloadPort={"port": 8000},
            trafficPolicy={"timeout": "30s", "retry": {"attempts": 5, "retryInterval": "200ms"}},
        ),
        route("r", {"modelName": "x", "rules": [{"targetModels": targets("pd")}]}),
    ]
    backend = build_table(objects, states).resolve("x", "/", {}).backend
    assert backend.pd
    assert [backend.address(s) for s in backend.candidates] == ["10.0.0.2:8000", "10.0.0.3:3"]
    assert (backend.timeout, backend.retry_attempts, backend.retry_interval) == (30.0, 5, 0.2)


def test_inference_model_shares_and_criticality():
    objects = [
        {
            "kind": "InferencePool",
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
            "metadata": {"name": "pool", "namespace": "default"},
            "spec": {
                "selector": {"app": "a"},
                "targetPortNumber": 9000,
                "extensionRef": {"name": "epp"},
            },
        },
        {
            "kind": "InferenceModel",
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
            "metadata": {"name": "im", "namespace": "default"},
            "spec": {
                "modelName": "chat",
                "criticality": "Sheddable",
                "poolRef": {"name": "pool"},
                "targetModels": [{"name": "t1", "weight": 1}, {"name": "t2", "weight": 0}],
            },
        },
    ]
    decision = build_table(objects, STATES).resolve("chat", "/", {})
    assert (decision.model, decision.criticality) == ("t1", "Sheddable")
    assert [decision.backend.address(s) for s in decision.backend.candidates] == ["10.0.0.1:9000"]


def test_playground_default_route_and_placeholder():
    states = [ep(1, {MODEL_NAME_LABEL: "llama"}, model="llama", fixed=True)]
    objects = [
        {
            "kind": "Playground",
            "metadata": {"name": "p"},
            "spec": {"modelClaim": {"modelName": "llama"}},
        },
        {
            "kind": "Playground",
            "metadata": {"name": "q"},
            "spec": {
                "modelClaims": {"models": [{"name": "qwen"}, {"name": "draft", "role": "draft"}]}
            },
        },
    ]
    table = build_table(objects, states)
    assert table.resolve("llama", "/", {}).backend.candidates == tuple(states)
    assert table.model_names() == ["llama", "qwen"]
    with pytest.raises(GatewayError) as err:
        table.resolve("qwen", "/", {})
    assert err.value.status == 503
    with pytest.raises(GatewayError) as err:
        table.resolve("draft", "/", {})
    assert err.value.status == 404


def test_a_claimed_name_is_sent_as_the_engine_serves_it():
    # An engine serving "qwen2:0.5b" that a Playground claims as "qwen": both names route to
    # it and the request goes upstream with the engine's own name; a default route's
    # decision is made once per table, not per request.
    states = [ep(1, {MODEL_NAME_LABEL: "qwen"}, model="qwen2:0.5b")]
    table = build_table([], states)
    claimed = table.resolve("qwen", "/", {})
    assert (claimed.model, claimed.route, claimed.lora) == ("qwen2:0.5b", "Model/qwen", False)
    assert table.resolve("qwen2:0.5b", "/", {}).model == "qwen2:0.5b"
    assert table.resolve("qwen", "/", {}) is claimed


def test_a_decision_cannot_be_changed_once_made():
    # A default route's decision is shared by every request on the table: a later stage that
    # changed it would change the next request's too.
    table = build_table([], [ep(1, {MODEL_NAME_LABEL: "qwen"}, model="qwen")])
    decision = table.resolve("qwen", "/", {})
    for name, value in (("model", "other"), ("priority", 9), ("lora", True)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(decision, name, value)
    again = table.resolve("qwen", "/", {})
    assert (again.model, again.priority, again.lora) == ("qwen", None, False)


def test_invalid_objects_are_ignored_not_fatal():
    objects = [route("bad", {"rules": []}), server("s", "m", {"matchLabels": {"app": "a"}})]
    table = build_table(objects, STATES)
    assert "ModelRoute/default/bad" in table.problems


def _playground(name, model, **spec):
    return {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Playground",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"modelClaim": {"modelName": model}, **spec},
    }


def test_reported_and_declared_lora_adapters_need_no_routes():
    holder, other = (
        ep(1, {MODEL_NAME_LABEL: "base"}, "base"),
        ep(2, {MODEL_NAME_LABEL: "base"}, "base"),
    )
    holder.served_models = frozenset({"base", "a1"})
    other.served_models = frozenset({"base"})
    declared = [
        {"name": "a2", "source": {"uri": "host:///adapters/a2"}},
        {"name": "a1", "source": {"uri": "host:///adapters/a1"}},  # already served: not loaded
    ]
    table = build_table([_playground("base", "base", loraAdapters=declared)], [holder, other])
    d = table.resolve("a1", "/v1/completions", {})
    assert d.lora and d.load is None and d.model == "a1"
    assert d.backend.candidates == (holder,)
    d = table.resolve("a2", "/v1/completions", {})
    assert d.lora and d.load is not None
    assert (d.load.name, d.load.path, d.load.base) == ("a2", "/adapters/a2", "base")
    assert set(d.backend.candidates) == {holder, other}
    assert "a2" in table.model_names() and "a1" in table.model_names()
    # The base model stays a plain model.
    assert not table.resolve("base", "/v1/completions", {}).lora
    # The console says what routes each: a declared adapter is not on a replica yet.
    from llmplane.console.api import route_sources

    assert route_sources(table) == [
        {"name": "a1", "via": "served model"},
        {"name": "a2", "via": "no ready endpoint"},
        {"name": "base", "via": "served model"},
    ]


def test_a_failing_playground_says_so_in_its_503():
    pg = _playground("p", "m")
    pg["status"] = {
        "conditions": [
            {
                "type": "Available",
                "status": "False",
                "reason": "CrashLoopBackOff",
                "message": "the engine is failing: exited with code 2; see `llmplane logs pl/p`\n"
                "last lines ...",
            }
        ]
    }
    table = build_table([pg], [])
    with pytest.raises(GatewayError) as err:
        table.resolve("m", "/v1/completions", {})
    assert err.value.status == 503
    assert "its engine is failing (CrashLoopBackOff)" in err.value.message
    assert "llmplane logs pl/p" in err.value.message and "last lines" not in err.value.message

    # Two Playgrounds claim the name, the first one starting: the failing one still speaks,
    # and requests are not held for the starting one.
    table = build_table([_playground("q", "m"), pg], [])
    with pytest.raises(GatewayError) as err:
        table.resolve("m", "/v1/completions", {})
    assert "its engine is failing (CrashLoopBackOff)" in err.value.message
    assert table.activatable == {}
    table = build_table([_playground("q", "m")], [])
    assert table.activatable == {"m": "default/q"}
    with pytest.raises(GatewayError) as err:
        table.resolve("m", "/v1/completions", {})
    assert err.value.status == 503 and "starting or scaled to zero" in err.value.message


def _pool(name, selector):
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"targetPortNumber": 8000, "selector": selector, "extensionRef": {"name": "e"}},
    }


def _inference_model(name, pool, target):
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"modelName": name, "poolRef": {"name": pool}, "targetModels": [{"name": target}]},
    }


def test_routes_to_a_playground_without_replicas_are_activatable():
    """A ModelRoute / InferenceModel / InferenceModelRewrite whose every target selects no
    replica yet, while the Playground whose replicas it would select is activatable, is held
    for that Playground."""
    objects = [
        _playground("p", "m"),
        server("s", "m", {"matchLabels": {MODEL_NAME_LABEL: "m"}}),
        route("chat", {"modelName": "chat", "rules": [{"targetModels": targets("s")}]}),
        _pool("pool", {"inference.llmaz.io/playground-name": "p"}),
        _inference_model("batch", "pool", "m"),
        rewrite("r", "pool", [exact("fast", "m")]),
        # Targets nothing a Playground would fill: not held.
        server("other", "x", {"matchLabels": {"app": "nobody"}}),
        route("lost", {"modelName": "lost", "rules": [{"targetModels": targets("other")}]}),
    ]
    table = build_table(objects, [])
    held = {"m": "default/p", "chat": "default/p", "batch": "default/p", "fast": "default/p"}
    assert table.activatable == held

    # A target with a ready replica: routed as before, nothing held.
    table = build_table(objects, [ep(1, {MODEL_NAME_LABEL: "m"})])
    assert not {"chat", "m", "fast"} & table.activatable.keys()

    # A failing Playground is not waited for: its routes answer at once.
    failing = _playground("p", "m")
    failing["status"] = {
        "conditions": [{"type": "Available", "status": "False", "reason": "CrashLoopBackOff"}]
    }
    table = build_table([failing, *objects[1:]], [])
    assert table.activatable == {}


# --- v1 InferencePools, InferenceModelRewrites, InferenceObjectives --------------------------

LLMD = "llm-d.ai/v1alpha2"


def pool_v1(name, labels, port=8000, **spec):
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": labels}, "targetPorts": [{"number": port}], **spec},
    }


def rewrite(name, pool, rules, created="2024-01-01T00:00:00Z"):
    return {
        "apiVersion": LLMD,
        "kind": "InferenceModelRewrite",
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
        "spec": {"poolRef": {"name": pool}, "rules": rules},
    }


def exact(value, *targets):
    return {
        "matches": [{"model": {"value": value}}],
        "targets": [{"modelRewrite": t} for t in targets],
    }


def test_rewrite_precedence_exact_then_oldest_then_rule_order():
    from llmplane.console.api import route_sources

    objects = [
        pool_v1("a", {"app": "a"}, 9000),
        pool_v1("b", {"app": "b"}),
        rewrite("newer", "b", [exact("x", "from-newer")], "2024-02-01T00:00:00Z"),
        # The older rewrite: a generic rule first, then two exact rules for x.
        rewrite(
            "older",
            "a",
            [
                {"targets": [{"modelRewrite": "fallback"}]},
                exact("x", "first"),
                exact("x", "second"),
            ],
        ),
    ]
    table = build_table(objects, STATES)
    decision = table.resolve("x", "/v1/completions", {})
    assert (decision.model, decision.backend.ref) == ("first", "InferencePool/default/a")
    assert decision.backend.address(STATES[0]) == "10.0.0.1:9000"  # the pool's first port
    assert [s.endpoint.address for s in decision.backend.candidates] == ["10.0.0.1:1"]
    # Exact beats generic even when the generic rule is older or earlier.
    fallback = table.resolve("unknown", "/v1/completions", {})
    assert (fallback.model, fallback.backend.ref) == ("fallback", "InferencePool/default/a")
    # A request without a model: the generic rule too; without one, the 400.
    unnamed = table.resolve("", "/v1/completions", {})
    assert (unnamed.model, unnamed.backend.ref) == ("fallback", "InferencePool/default/a")
    with pytest.raises(GatewayError) as missing:
        build_table(objects[:2], STATES).resolve("", "/v1/completions", {})
    assert (missing.value.status, missing.value.code) == (400, "missing_model")
    sources = route_sources(table)
    assert {"name": "x", "via": "InferenceModelRewrite"} in sources
    assert {"name": "m", "via": "served model"} in sources  # the endpoints' own name


def test_a_rewrite_rule_without_targets_keeps_the_requested_model():
    keep_x = {"matches": [{"model": {"value": "x"}}]}
    objects = [pool_v1("a", {"app": "a"}), rewrite("r", "a", [keep_x, {}])]
    table = build_table(objects, STATES)
    assert (table.resolve("x", "/", {}).model, table.resolve("x", "/", {}).route) == (
        "x",
        "InferenceModelRewrite/default/r#0",
    )
    assert table.resolve("other", "/", {}).model == "other"  # the catch-all rule
    assert table.resolve("", "/", {}).model == ""  # no model: the engine's default


def test_served_names_win_over_generic_rewrites_but_not_exact_ones():
    objects = [
        pool_v1("a", {"app": "a"}),
        rewrite("r", "a", [{"targets": [{"modelRewrite": "z"}]}]),
    ]
    table = build_table(objects, STATES)
    assert table.resolve("m", "/v1/completions", {}).model == "m"  # served by the endpoints
    table = build_table([*objects, rewrite("s", "a", [exact("m", "m-v2")])], STATES)
    assert table.resolve("m", "/v1/completions", {}).model == "m-v2"


def test_objective_priority_only_for_its_own_pool():
    def objective(name, pool, priority=None):
        spec = {"poolRef": {"name": pool}}
        if priority is not None:
            spec["priority"] = priority
        return {
            "apiVersion": LLMD,
            "kind": "InferenceObjective",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        }

    objects = [
        pool_v1("a", {"app": "a"}),
        pool_v1("b", {"app": "b"}),
        rewrite("r", "a", [exact("x", "x")]),
        objective("mine", "a", -4),
        objective("unset", "a"),
        objective("theirs", "b", 9),
    ]
    table = build_table(objects, STATES)

    def priority(name):
        return table.resolve("x", "/", {"x-llm-d-inference-objective": name}).priority

    assert priority("mine") == -4
    assert priority("unset") == 0  # unset means 0
    assert priority("theirs") is None  # an objective of another pool is ignored
    assert table.resolve("x", "/", {}).priority is None


def test_h2c_pool_and_foreign_pool_ref_are_problems():
    objects = [
        pool_v1("h", {"app": "a"}, appProtocol="kubernetes.io/h2c"),
        rewrite("r", "h", [exact("x", "y")]),
        {
            **rewrite("s", "h", [exact("z", "y")]),
            "spec": {
                "poolRef": {"name": "h", "kind": "Service", "group": ""},
                "rules": [exact("z", "y")],
            },
        },
    ]
    table = build_table(objects, STATES)
    assert "h2c" in table.problems["InferencePool/default/h"]
    with pytest.raises(GatewayError) as err:
        table.resolve("x", "/", {})
    assert err.value.status == 503 and "HTTP/1.1" in str(err.value)
    with pytest.raises(GatewayError) as err:
        table.resolve("z", "/", {})
    assert err.value.status == 503 and "not a pool" in str(err.value)


def test_migration_limit_per_route_from_its_annotation():
    plain = server("a", "model-a", {"matchLabels": {"app": "a"}})
    off = server("b", "model-b", {"matchLabels": {"app": "b"}})
    off["metadata"]["annotations"] = {"llmplane.io/migration-limit": "0"}
    bad = server("c", "model-c", {"matchLabels": {"app": "a"}})
    bad["metadata"]["annotations"] = {"llmplane.io/migration-limit": "-1"}
    table = build_table([plain, off, bad], STATES, GatewayConfig(migration_limit=5))
    limits = {name: b.migration_limit for (_, name), b in table.servers.items()}
    assert limits == {"a": 5, "b": 0, "c": 5}  # a bad value keeps the default


def test_timeouts_from_annotations_else_the_config():
    def timeouts(value):
        s = server("a", "model-a", {"matchLabels": {"app": "a"}})
        s["metadata"]["annotations"] = {
            "llmplane.io/upstream-timeout": value,
            "llmplane.io/stream-stall-timeout": value,
        }
        config = GatewayConfig(default_timeout=7.0, stream_stall_timeout=8.0)
        backend = build_table([s], STATES, config).servers[("default", "a")]
        return backend.timeout, backend.stall_timeout

    assert timeouts("30s") == timeouts(" 30 ") == (30.0, 30.0)
    assert timeouts("0.5") == (0.5, 0.5)
    for off in ("0", "none", "Off"):
        assert timeouts(off) == (None, None), off
    for bad in ("-1", "0.0", "abc", "inf", "nan", "", "1e999"):  # logged, the default kept
        assert timeouts(bad) == (7.0, 8.0), bad


def test_a_playgrounds_annotations_set_each_of_its_models_and_a_bad_one_is_logged_once(caplog):
    claims = {"models": [{"name": "m1"}, {"name": "m2"}]}
    pg = _playground("p", None, modelClaims=claims)
    del pg["spec"]["modelClaim"]
    pg["metadata"]["annotations"] = {
        "llmplane.io/upstream-timeout": "30",
        "llmplane.io/stream-stall-timeout": "bad",
    }
    states = [ep(1, {MODEL_NAME_LABEL: "m1"}, "m1"), ep(2, {MODEL_NAME_LABEL: "m2"}, "m2")]
    config = GatewayConfig(stream_stall_timeout=8.0)
    with caplog.at_level("WARNING", logger="llmplane.gateway"):
        table = build_table([pg], states, config)
    for name in ("m1", "m2"):
        backend = table.resolve(name, "/v1/completions", {}).backend
        assert (backend.timeout, backend.stall_timeout) == (30.0, 8.0), name
    bad = [r for r in caplog.records if "stream-stall-timeout" in r.getMessage()]
    assert len(bad) == 1, [r.getMessage() for r in caplog.records]
