"""The shipped Grafana dashboard against a real Prometheus (Debian's ``prometheus``) scraping a
real ``llmplane up`` under load: every query of every panel returns data through Prometheus's
HTTP API, with the shipped scrape configuration (its target pointed at the test's gateway).

The load covers what the panels show: streaming and whole chat completions on a two-replica
sim Playground (TTFT, TPOT, tokens, KV, prefix cache), an unknown model (errors), a ModelRoute
with a tiny token rate limit (rate-limit rejections) and a Sheddable InferenceModel on a gateway
that calls every scraped endpoint saturated (shed requests).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmplane.runtime.launch import free_port
from llmplane.testing import Up, wait_for
from tests.integration.upcli import cli, http, sim_fleet, status

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "llmplane-gateway.json"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

ROUTING = """
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferencePool
metadata: {name: tiny-pool}
spec:
  targetPortNumber: 8000
  selector: {llmaz.io/model-name: tiny}
  extensionRef: {name: tiny-epp}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModel
metadata: {name: tiny-batch}
spec:
  modelName: tiny-batch
  criticality: Sheddable
  poolRef: {name: tiny-pool}
  targetModels: [{name: tiny, weight: 1}]
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {name: tiny-servers}
spec:
  model: tiny
  inferenceEngine: vLLM
  workloadSelector:
    matchLabels: {llmaz.io/model-name: tiny}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {name: tiny-limited}
spec:
  modelName: tiny-limited
  rules:
    - targetModels: [{modelServerName: tiny-servers}]
  rateLimit: {outputTokensPerUnit: 20, unit: minute}
"""
# Every endpoint with KV metrics counts as saturated (any use, even 0, is over -1), so every
# Sheddable request is shed once the replicas have been scraped. (With 0.0, a shed needed both
# replicas' last readings to show KV in use at that moment: about one run in ten saw none.)
# Flow control off: with it every request would wait in the gateway instead.
GATEWAY_CONFIG = "gateway:\n  saturationKv: -1\n  flowControl: false\n"


TENANT_ROW = "Tenants and flow control"


def panel_queries(rows: Callable[[str], bool] = lambda row: True) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel under a row ``rows`` accepts,
    Grafana's variables given the values a dashboard user gets by default (all models, a
    1-minute rate window)."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    row = ""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        if not rows(row):
            continue
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m").replace("$model", ".*")
            assert "$" not in expr, f"{panel['title']}: unknown variable in {expr}"
            out.append((panel["title"], expr))
    return out


def wait_for_every_query(prometheus: Prometheus, queries: list[tuple[str, str]]) -> None:
    """Until every query returns a finite value through Prometheus's HTTP API (90 s)."""
    missing: list[str] = []

    def all_answer() -> bool:
        missing.clear()
        for title, expr in queries:
            data = prometheus.get("/api/v1/query", query=expr)
            assert data["status"] == "success", (title, expr, data)
            values = [float(r["value"][1]) for r in data["data"]["result"]]
            if not any(math.isfinite(v) for v in values):
                missing.append(f"{title}: {expr} -> {values}")
        return not missing

    try:
        wait_for(all_answer, timeout=90, every=1.0, what="every panel query")
    except AssertionError:
        raise AssertionError("panels without data:\n" + "\n".join(missing)) from None


class Prometheus:
    def __init__(self, tmp: Path, target: str) -> None:
        config = yaml.safe_load(SCRAPE_CONFIG.read_text())
        config["global"]["scrape_interval"] = "1s"
        config["global"]["evaluation_interval"] = "1s"
        jobs = [j for j in config["scrape_configs"] if j["job_name"] == "llmplane-gateway"]
        assert jobs, "the shipped config has no llmplane-gateway job"
        jobs[0]["static_configs"] = [{"targets": [target]}]
        path = tmp / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={path}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())

    def ready(self) -> bool:
        assert self.proc.poll() is None, "prometheus exited; see prometheus.log"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet("tiny", 2, time_scale="1") + "---" + ROUTING)
    config = tmp_path / "gateway.yaml"
    config.write_text(GATEWAY_CONFIG)
    up = Up(tmp_path / "state", str(fleet), args=("--gateway-config", str(config))).start()
    try:
        wait_for(
            lambda: status(up.state_dir, "Playground", "tiny").get("readyReplicas") == 2,
            what="Playground tiny ready",
        )
        yield up
    finally:
        up.kill_everything()


@pytest.fixture
def prometheus(tmp_path: Path, up: Up) -> Iterator[Prometheus]:
    assert Path(PROMETHEUS).exists(), "prometheus is missing: apt-get install prometheus"
    prom = Prometheus(tmp_path, f"127.0.0.1:{up.port}")
    try:
        wait_for(prom.ready, timeout=60, what="prometheus ready")
        yield prom
    finally:
        prom.stop()


def chat(up: Up, model: str, stream: bool, tokens: int = 24, key: str | None = None) -> int:
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a terse assistant who shares this prefix."},
            {"role": "user", "content": "Say something."},
        ],
        "max_tokens": tokens,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    request = urllib.request.Request(
        f"{up.url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"}
        | ({"authorization": f"Bearer {key}"} if key else {}),
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as err:
        err.read()
        return err.code


def test_every_dashboard_query_returns_data(up: Up, prometheus: Prometheus) -> None:
    queries = panel_queries(lambda row: row != TENANT_ROW)
    assert len(queries) >= 20, queries
    stop = threading.Event()
    seen: dict[str, set[int]] = {}

    errors: list[str] = []

    def load(model: str, stream: bool) -> None:
        while not stop.is_set():
            try:
                seen.setdefault(model, set()).add(chat(up, model, stream))
            except Exception as err:  # said in the failure message instead of lost in the pool
                errors.append(f"{model}: {err!r}")
                return

    with ThreadPoolExecutor(8) as pool:
        for model, stream in [("tiny", True)] * 4 + [
            ("tiny", False),
            ("tiny-batch", True),
            ("tiny-limited", False),
            ("no-such-model", False),
        ]:
            pool.submit(load, model, stream)
        try:
            try:
                wait_for(
                    lambda: (
                        429 in seen.get("tiny-batch", set())
                        and 429 in seen.get("tiny-limited", set())
                    ),
                    timeout=60,
                    what="a shed and a rate-limited request",
                )
            except AssertionError as err:
                raise AssertionError(f"{err} (seen: {seen}, errors: {errors})") from None
            wait_for_every_query(prometheus, queries)
        finally:
            stop.set()

    # The dashboard's model picker lists the models that were asked for.
    models = prometheus.get(
        "/api/v1/label/model/values", **{"match[]": "llmplane_gateway_requests_total"}
    )["data"]
    assert {"tiny", "tiny-batch", "tiny-limited"} <= set(models), models
    assert seen["tiny"] == {200}, seen
    assert http(f"{up.url}/health")[0] == 200


TENANT = """
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {name: team}
spec: {criticality: Default}
"""
# One request at a time per replica and a short TTL: with eight clients some requests wait in
# flow control and are dispatched (wait times), some wait out the TTL (refusals), and at any
# scrape a few are queued (the queue gauge).
FLOW_CONFIG = "gateway:\n  saturationMaxInflight: 1\n  flowControlTtl: 0.5\n"


def test_tenant_and_flow_control_panels_return_data(tmp_path: Path) -> None:
    queries = panel_queries(lambda row: row == TENANT_ROW)
    assert len(queries) >= 5, queries
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet("tiny", 2, time_scale="1") + "---" + TENANT)
    config = tmp_path / "gateway.yaml"
    config.write_text(FLOW_CONFIG)
    up = Up(tmp_path / "state", str(fleet), args=("--gateway-config", str(config))).start()
    prom = None
    stop = threading.Event()
    try:
        wait_for(
            lambda: status(up.state_dir, "Playground", "tiny").get("readyReplicas") == 2,
            what="Playground tiny ready",
        )
        key = cli("keys", "create", "team", state_dir=up.state_dir).stdout.strip().splitlines()[-1]
        wait_for(lambda: chat(up, "tiny", False, 1, key) == 200, what="served with the key")
        prom = Prometheus(tmp_path, f"127.0.0.1:{up.port}")
        wait_for(prom.ready, timeout=60, what="prometheus ready")
        seen: set[int] = set()

        def load() -> None:
            while not stop.is_set():
                seen.add(chat(up, "tiny", True, 100, key))  # about 0.7 s each

        with ThreadPoolExecutor(8) as pool:
            for _ in range(8):
                pool.submit(load)
            try:
                try:
                    wait_for(lambda: {200, 429} <= seen, timeout=60, what="served and refused")
                except AssertionError as err:
                    raise AssertionError(f"{err} (seen: {seen})") from None
                wait_for_every_query(prom, queries)
            finally:
                stop.set()
    finally:
        stop.set()
        if prom is not None:
            prom.stop()
        up.kill_everything()
