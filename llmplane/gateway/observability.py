"""Prometheus metrics (on the gateway's own registry) and the structured access log.

Every request ends in one ``llmplane.gateway.access`` log line (JSON) with the route, the
endpoint, a summary of the scores and the timings; it costs nothing when that logger is not
enabled for INFO.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

access_log = logging.getLogger("llmplane.gateway.access")

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
SCHED_BUCKETS = (
    0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05,
)  # fmt: skip


class _EndpointCollector:
    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway

    def collect(self) -> Any:
        inflight = GaugeMetricFamily(
            "llmplane_gateway_endpoint_inflight",
            "Requests in flight per endpoint",
            labels=["endpoint"],
        )
        queue = GaugeMetricFamily(
            "llmplane_gateway_endpoint_waiting",
            "Waiting requests per endpoint, as last scraped",
            labels=["endpoint"],
        )
        kv = GaugeMetricFamily(
            "llmplane_gateway_endpoint_kv_usage",
            "KV-cache utilisation per endpoint, as last scraped",
            labels=["endpoint"],
        )
        ejected = GaugeMetricFamily(
            "llmplane_gateway_endpoint_ejected",
            "1 while the endpoint is ejected",
            labels=["endpoint"],
        )
        now = time.monotonic()
        for state in list(self.gateway.registry.states.values()):
            inflight.add_metric([state.address], state.inflight)
            queue.add_metric([state.address], state.waiting)
            kv.add_metric([state.address], state.kv_usage)
            ejected.add_metric([state.address], 1.0 if state.ejected(now) else 0.0)
        yield from (inflight, queue, kv, ejected)


class GatewayMetrics:
    def __init__(self, gateway: Any = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            "llmplane_gateway_requests",
            "Requests by model, route, endpoint and status",
            ["model", "route", "endpoint", "status"],
            registry=r,
        )
        self.e2e = Histogram(
            "llmplane_gateway_request_duration_seconds",
            "End-to-end request latency at the gateway",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "llmplane_gateway_time_to_first_token_seconds",
            "Time to the first streamed chunk",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "llmplane_gateway_time_per_output_token_seconds",
            "Time per output token after the first (streaming)",
            ["model"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "llmplane_gateway_prompt_tokens", "Prompt tokens (from usage)", ["model"], registry=r
        )
        self.output_tokens = Counter(
            "llmplane_gateway_output_tokens", "Output tokens (from usage)", ["model"], registry=r
        )
        self.scheduling = Histogram(
            "llmplane_gateway_scheduling_duration_seconds",
            "Time to pick an endpoint (filters, scorers, picker)",
            buckets=SCHED_BUCKETS,
            registry=r,
        )
        self.shed = Counter(
            "llmplane_gateway_shed", "Sheddable requests refused (429)", ["model"], registry=r
        )
        self.retries = Counter(
            "llmplane_gateway_retries",
            "Requests sent again to another endpoint",
            ["model"],
            registry=r,
        )
        self.ejections = Counter(
            "llmplane_gateway_ejections",
            "Endpoints ejected after repeated failures",
            ["endpoint"],
            registry=r,
        )
        self.pd_requests = Counter(
            "llmplane_gateway_pd_requests",
            "Requests served by a prefill/decode pair, by model and KV connector",
            ["model", "connector"],
            registry=r,
        )
        self.pd_prefill = Histogram(
            "llmplane_gateway_pd_prefill_duration_seconds",
            "Prefill request latency (sent to response read) in prefill/decode serving",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        if gateway is not None:
            r.register(_EndpointCollector(gateway))  # type: ignore[arg-type]
        self._children: dict[tuple[Any, ...], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """A labelled child, cached (``labels()`` takes a lock and builds a tuple each call)."""
        key = (id(metric), *labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def render(self) -> bytes:
        return generate_latest(self.registry)


def log_access(record: dict[str, Any]) -> None:
    if access_log.isEnabledFor(logging.INFO):
        access_log.info(orjson.dumps(record).decode())
