"""The gateway's view of load per workload, for the autoscaler (``controlplane/autoscaler.py``).

Read off what the gateway keeps anyway (endpoint registry: scraped engine metrics and its own
in-flight counts; the request counter by endpoint; requests waiting in flow control, shared
out over the endpoints they wait for and counted as in flight there, so that queueing in the
gateway instead of the engines still scales the workload): nothing is added to the request
path.

In ``llmplane up`` the autoscaler reads ``GatewaySignals`` in process. In a cluster the operator
reads them over HTTP: ``GET /autoscaling/signals`` (admin key, as ``/metrics``) answers
``snapshot()`` as JSON, every workload the gateway knows at once, and ``RemoteSignals``
(``operator/signals.py``) merges the answers of every gateway replica.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from llmplane.controlplane.autoscaling import INFLIGHT, KV_USAGE, RUNNING, WAITING


class GatewaySignals:
    """``SignalSource`` over a running ``Gateway``."""

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway

    def _states(self, workload: str) -> list[Any]:
        return [s for s in self.gateway.registry.states.values() if s.endpoint.workload == workload]

    def replica_signals(self, workload: str) -> Mapping[str, Mapping[str, float]]:
        staleness = max(self.gateway.config.metrics_staleness, 5.0)
        now = time.monotonic()
        out: dict[str, dict[str, float]] = {}
        queued = self.gateway.flow.queued_by_endpoint()
        for state in self._states(workload):
            values: dict[str, float] = {INFLIGHT: state.inflight + queued.get(state.address, 0.0)}
            if state.metrics_fresh(staleness, now):
                values[WAITING] = state.waiting
                values[RUNNING] = state.running
                if state.has_kv:
                    values[KV_USAGE] = state.kv_usage
            out[state.address] = values
        return out

    def requests_seen(self, workload: str) -> float:
        addresses = {s.address for s in self._states(workload)}
        total = 0.0
        for labels, child in list(self.gateway.metrics.requests.children.items()):
            if labels[2] in addresses:  # (model, route, endpoint, status)
                total += child.value
        queued = self.gateway.flow.queued_by_endpoint()
        return total + sum(s.inflight + queued.get(s.address, 0.0) for s in self._states(workload))

    def held(self, workload: str) -> int:
        return int(self.gateway.activator.held_for(workload))

    def snapshot(self) -> dict[str, Any]:
        """Every workload's signals now: ``{"workloads": {key: {"replicas": {address:
        {signal: value}}, "requestsSeen": n, "held": n}}}`` (the ``/autoscaling/signals`` body)."""
        keys = {s.endpoint.workload for s in self.gateway.registry.states.values()}
        keys |= {q.workload for q in list(self.gateway.activator.queues.values())}
        keys.discard("")
        return {
            "workloads": {
                key: {
                    "replicas": self.replica_signals(key),
                    "requestsSeen": self.requests_seen(key),
                    "held": self.held(key),
                }
                for key in sorted(keys)
            }
        }
