"""Admission: which candidates a request may use now, and whether it is shed.

A backend without candidates is a 503. Ejected replicas are left out (failing open when all
are). A ``Sheddable`` request (InferenceModel criticality) gets a 429 with ``Retry-After`` when
every remaining candidate is saturated: its queue or KV use above the configured limits, its
metrics stale, or (engines without load metrics) more than ``saturation_inflight`` requests in
flight from this gateway.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.errors import GatewayError
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.routing import Decision


class Admission:
    def __init__(self, config: GatewayConfig, outliers: Outliers) -> None:
        self.config = config
        self.outliers = outliers

    def saturated(self, state: EndpointState, now: float) -> bool:
        c = self.config
        if state.has_load_metrics is False or (
            state.has_load_metrics is None and not state.scraped_at
        ):
            return state.inflight >= c.saturation_inflight
        if not state.metrics_fresh(c.metrics_staleness, now):
            return True
        return state.queue_estimate(c.metrics_staleness, now) > c.saturation_queue or (
            state.has_kv and state.kv_usage > c.saturation_kv
        )

    def admit(self, model: str, decision: Decision, now: float) -> Sequence[EndpointState]:
        """The candidates to schedule over, or the GatewayError to answer with."""
        backend = decision.backend
        if not backend.candidates:
            raise GatewayError(
                503,
                f"model {model!r} has no ready endpoint ({backend.ref} selects none)",
                "no_ready_endpoint",
            )
        candidates = self.outliers.available(backend.candidates, now)
        if decision.criticality == "Sheddable" and all(self.saturated(s, now) for s in candidates):
            raise GatewayError(
                429,
                f"model {model!r} is overloaded: every endpoint is saturated and this "
                "request is Sheddable; retry later",
                "overloaded",
                retry_after=self.config.shed_retry_after,
            )
        return candidates
