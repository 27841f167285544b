"""The Helm chart (deploy/helm/llmplane) renders to valid, least-privilege objects.

Helm is not installable here (no apt package, no PyPI wheel), so the chart is rendered by
``tests/unit/helm_chart.py`` (the small Go-template subset the templates keep to). When a
``helm`` binary is on PATH the same checks also run on ``helm template`` output.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmplane.render import chart_backends_template
from tests.unit.helm_chart import CHART, render_chart, render_template
from tests.unit.kube_schemas import ROOT, validate


def _named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)}"
    return found[0]


# -------------------------------------------------------------------------------------------


def test_renderer_handles_the_subset() -> None:
    scope = {"Values": {"a": {"b": 3, "on": True, "m": {"x": 1}}}, "Release": {"Name": "r"}}
    text = (
        "x: {{ .Values.a.b }}\ny: {{ .Values.a.b | quote }}\n{{- if not .Values.a.on }}\nz: 1\n"
        "{{- else }}\nz: 2\n{{- end }}\nm:\n  {{- toYaml .Values.a.m | nindent 2 }}\n"
        "t: '{{ \"{{\" }} .ModelPath }}'\n"
    )
    assert yaml.safe_load(render_template(text, scope)) == {
        "x": 3,
        "y": "3",
        "z": 2,
        "m": {"x": 1},
        "t": "{{ .ModelPath }}",
    }


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"useLeaderWorkerSet": False},
        {"gateway": {"enabled": False}, "installBuiltinBackends": False},
        {"gateway": {"service": {"type": "LoadBalancer"}, "replicas": 5}},
        {"gateway": {"endpointPicker": {"enabled": True}}},
    ],
    ids=["defaults", "deployments", "operator-only", "loadbalancer", "endpoint-picker"],
)
def test_chart_renders_valid_objects(values: dict[str, Any]) -> None:
    docs = render_chart(values)
    assert docs
    for doc in docs:
        validate(doc)


def test_gateway_scraping_is_opt_in() -> None:
    """Off by default; podAnnotations annotates the gateway pods (valid Deployment); the
    ServiceMonitor selects the gateway Service's labels and its named port."""
    default = render_chart()
    pod = _named(default, "Deployment", "llmplane-gateway")["spec"]["template"]["metadata"]
    assert "annotations" not in pod
    assert not [d for d in default if d["kind"] == "ServiceMonitor"]

    docs = render_chart(
        {"gateway": {"metrics": {"podAnnotations": True, "serviceMonitor": {"enabled": True}}}}
    )
    deployment = _named(docs, "Deployment", "llmplane-gateway")
    validate(deployment)
    assert deployment["spec"]["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }
    monitor = _named(docs, "ServiceMonitor", "llmplane-gateway")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = _named(docs, "Service", "llmplane-gateway")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["http"] and "http" in ports
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_default_chart_objects() -> None:
    docs = render_chart()
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == [
        "BackendRuntime",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
        "ServiceAccount",
    ]
    operator = _named(docs, "Deployment", "llmplane-operator")
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/llmplane/llmplane:0.1.0"
    assert container["args"][:2] == ["operator", "--all-namespaces"]
    assert "--deployment" not in container["args"]
    assert operator["spec"]["template"]["spec"]["serviceAccountName"] == "llmplane-operator"
    gateway = _named(docs, "Deployment", "llmplane-gateway")
    assert gateway["spec"]["replicas"] == 2
    gw = gateway["spec"]["template"]["spec"]["containers"][0]
    assert gw["args"][:2] == ["gateway", "--kubernetes"]
    service = _named(docs, "Service", "llmplane-gateway")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"][0]["port"] == 80
    backends = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "BackendRuntime")
    assert "vllm" in backends and "sglang" in backends and "llamacpp" in backends
    vllm = _named(docs, "BackendRuntime", "vllm")
    assert "{{ .ModelPath }}" in vllm["spec"]["recommendedConfigs"][0]["args"]


def test_values_switch_workloads_and_gateway() -> None:
    docs = render_chart({"useLeaderWorkerSet": False})
    container = _named(docs, "Deployment", "llmplane-operator")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["args"][-1] == "--deployment"
    docs = render_chart({"gateway": {"enabled": False}, "installBuiltinBackends": False})
    assert not [d for d in docs if "gateway" in d["metadata"]["name"]]
    assert not [d for d in docs if d["kind"] == "BackendRuntime"]


def test_gateway_as_endpoint_picker() -> None:
    docs = render_chart({"gateway": {"endpointPicker": {"enabled": True}}})
    gw = _named(docs, "Deployment", "llmplane-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert gw["args"][:2] == ["epp", "--kubernetes"]
    assert gw["args"][gw["args"].index("--port") + 1] == "9002"
    assert {p["name"]: p["containerPort"] for p in gw["ports"]} == {"grpc": 9002, "metrics": 9090}
    assert gw["readinessProbe"]["grpc"] == {"port": 9002, "service": "readiness"}
    assert gw["livenessProbe"]["grpc"] == {"port": 9002, "service": "liveness"}
    service = _named(docs, "Service", "llmplane-gateway")
    grpc = service["spec"]["ports"][0]
    assert (grpc["port"], grpc["appProtocol"]) == (9002, "kubernetes.io/h2c")


def _rules(docs: list[dict[str, Any]], name: str) -> set[tuple[str, str, str]]:
    role = _named(docs, "ClusterRole", name)
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_gateway_only_reads_but_scales_from_zero() -> None:
    rules = _rules(render_chart(), "llmplane-gateway")
    writes = {r for r in rules if r[2] not in ("get", "list", "watch")}
    # Its one write: the activator asks for a Playground's first replica.
    assert writes == {("inference.llmaz.io", "playgrounds/scale", "patch")}
    assert ("", "pods", "list") in rules
    assert ("discovery.k8s.io", "endpointslices", "watch") in rules
    assert not [r for r in rules if r[1] == "secrets"]


def test_key_secrets_opt_in_grants_reading_secrets_and_passes_the_flag() -> None:
    for endpoint_picker in (False, True):
        values = {"gateway": {"keySecrets": True, "endpointPicker": {"enabled": endpoint_picker}}}
        docs = render_chart(values)
        rules = _rules(docs, "llmplane-gateway")
        assert {r for r in rules if r[1] == "secrets"} == {
            ("", "secrets", verb) for verb in ("get", "list", "watch")
        }
        [deployment] = [
            d
            for d in docs
            if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("gateway")
        ]
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[:3] == [
            ("epp" if endpoint_picker else "gateway"),
            "--kubernetes",
            "--key-secrets",
        ]


def test_operator_autoscaler_reads_the_charts_gateway_pods() -> None:
    """The operator's autoscaler finds the gateways by ``--gateway-selector`` and asks them on
    ``--gateway-port``: the selector must select the gateway Deployment's pods (only them) and
    the port be the one they serve HTTP on, or in-cluster autoscaling silently does nothing."""
    docs = render_chart({"gateway": {"port": 8123}})
    operator = _named(docs, "Deployment", "llmplane-operator")
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    selector = dict(
        term.split("=", 1) for term in args[args.index("--gateway-selector") + 1].split(",")
    )
    port = int(args[args.index("--gateway-port") + 1])
    selected = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "Deployment"
        and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert selected == ["llmplane-gateway"]
    gateway = _named(docs, "Deployment", "llmplane-gateway")["spec"]["template"]["spec"]
    assert {"name": "http", "containerPort": port} in gateway["containers"][0]["ports"]
    assert port == 8123


def test_operator_autoscaler_reads_the_endpoint_pickers_http_port() -> None:
    """In endpoint-picker mode the gateway pods serve HTTP only on the picker's metrics port
    (which also serves the autoscaling signals): the operator must ask there, not on
    ``gateway.port`` where nothing listens."""
    docs = render_chart({"gateway": {"endpointPicker": {"enabled": True, "metricsPort": 9191}}})
    args = _named(docs, "Deployment", "llmplane-operator")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    port = int(args[args.index("--gateway-port") + 1])
    gateway = _named(docs, "Deployment", "llmplane-gateway")["spec"]["template"]["spec"]
    assert {"name": "metrics", "containerPort": port} in gateway["containers"][0]["ports"]
    assert port == 9191


def test_operator_rbac_is_least_privilege() -> None:
    rules = _rules(render_chart(), "llmplane-operator")
    wildcard = [r for r in rules if "*" in r]
    assert not wildcard
    assert not [r for r in rules if r[1] in ("secrets", "configmaps", "nodes")]
    # Inputs are never deleted or created by the operator.
    for group, resource in (
        ("llmaz.io", "openmodels"),
        ("inference.llmaz.io", "playgrounds"),
        ("inference.llmaz.io", "backendruntimes"),
    ):
        assert (group, resource, "delete") not in rules
        assert (group, resource, "create") not in rules
    # What it owns and writes.
    for group, resource in (
        ("leaderworkerset.x-k8s.io", "leaderworkersets"),
        ("apps", "deployments"),
        ("", "services"),
        ("autoscaling", "horizontalpodautoscalers"),
        ("inference.llmaz.io", "services"),
    ):
        for verb in ("get", "list", "watch", "create", "patch", "delete"):
            assert (group, resource, verb) in rules, (group, resource, verb)
    for status in ("playgrounds/status", "services/status"):
        assert ("inference.llmaz.io", status, "patch") in rules
    assert ("", "pods", "patch") not in rules
    assert ("", "events", "create") in rules


def test_operator_rbac_covers_what_the_operator_uses() -> None:
    from llmplane.operator.resources import WATCHES, WRITES

    rules = _rules(render_chart(), "llmplane-operator")
    for group, resource in WATCHES:
        for verb in ("get", "list", "watch"):
            assert (group, resource, verb) in rules, (group, resource, verb)
    for group, resource in WRITES:
        assert (group, resource, "patch") in rules, (group, resource)


def test_chart_crds_are_the_generated_ones() -> None:
    # A symlink, so regenerating deploy/crds updates the chart (Helm reads crds/*.yaml only,
    # so the README beside them is ignored).
    link = CHART / "crds"
    assert link.is_symlink()
    assert link.resolve() == (ROOT / "deploy" / "crds").resolve()
    paths = sorted(link.glob("*.yaml"))
    assert len(paths) >= 8
    for path in paths:
        validate(yaml.safe_load(path.read_text()))


def test_chart_backends_are_the_builtins() -> None:
    assert (
        CHART / "templates" / "backendruntimes.yaml"
    ).read_text() == chart_backends_template(), (
        "stale: llmplane render --chart-backends > deploy/helm/llmplane/templates/backendruntimes.yaml"
    )


def test_dockerfile_installs_the_kubernetes_extra_and_runs_llmplane() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert text.count("FROM python:3.11-slim") == 2
    assert "[kubernetes," in text
    assert 'ENTRYPOINT ["llmplane"]' in text
    assert "USER 10001" in text  # the chart's runAsUser


@pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not installed")
def test_helm_template_agrees(tmp_path: Path) -> None:  # pragma: no cover - needs helm
    out = subprocess.run(
        ["helm", "template", "llmplane", str(CHART), "--namespace", "llmplane-system"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    for doc in docs:
        validate(doc)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in render_chart()
    )
