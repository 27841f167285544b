"""The Grafana dashboard's JSON is importable as it is: a data-source input and variable every
panel uses, unique panel ids, a layout inside Grafana's 24 columns without overlaps, and every
metric it names exported by the gateway (the queries themselves run against a real Prometheus
in tests/integration/test_dashboards.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import Endpoint
from llmplane.gateway.flowcontrol.controller import FlowControl
from llmplane.gateway.observability import GatewayMetrics
from llmplane.gateway.ratelimit import RateLimiter
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.tenant_usage import TenantUsage

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "llmplane-gateway.json"


def test_dashboard_is_importable() -> None:
    d = json.loads(DASHBOARD.read_text())
    assert d["__inputs"][0]["type"] == "datasource"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["model"]["allValue"] == ".*"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["targets"], p["title"]


def test_every_metric_named_is_exported() -> None:
    named = set(re.findall(r"\b(llmplane_[a-z_]+)", DASHBOARD.read_text()))
    state = EndpointState(Endpoint("127.0.0.1:1", model_name="m"))
    state.prefix_queries = 10.0
    metrics = GatewayMetrics(lambda: [state])
    metrics.add(RateLimiter(GatewayConfig()).metrics())
    # As the Gateway wires them: flow control's and the tenants' usage metrics.
    flow = FlowControl(None)  # type: ignore[arg-type]  # (its metrics only)
    metrics.registry.register(flow.metrics)  # type: ignore[arg-type]
    metrics.add(TenantUsage(None).metrics())
    exported = {family.name for family in metrics.registry.collect()}
    suffixes = ("_bucket", "_total")
    for name in named:
        base = next((name[: -len(s)] for s in suffixes if name.endswith(s)), name)
        assert base in exported, f"{name} is not exported by the gateway"
