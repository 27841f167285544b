"""Admission: which candidates a request may use now, and whether it is shed (the rules:
docs/gateway.md, "Admission and flow control").

A backend without candidates is a 503; ejected replicas are left out (failing open when all
are). With every remaining candidate saturated the request waits in flow control
(``gateway/flowcontrol/``) or, with it off, a Sheddable one (or of a negative priority) gets
a 429 with ``Retry-After``.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.errors import ErrorCode, GatewayError, Overloaded
from llmplane.gateway.flowcontrol.queue import SHEDDABLE_BAND, Level, band_of
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.routing import Backend


class Admission:
    def __init__(self, config: GatewayConfig, outliers: Outliers) -> None:
        self.config = config
        self.outliers = outliers

    def saturated(self, state: EndpointState, now: float, extra: int = 0) -> bool:
        """``extra``: that many more requests allowed past each count limit (flow control's
        reserve for flows under their fair share); stale metrics and KV use stay limits."""
        c = self.config
        if self._capped(state, extra):
            return True
        if (
            state.has_load_metrics is False
            or (state.has_load_metrics is None and not state.scraped_at)
            or not state.scrape_ok  # its metrics cannot be read now: our own count
        ):
            return state.inflight >= c.saturation_inflight + extra
        if not state.metrics_fresh(c.metrics_staleness, now):
            return True
        return state.queue_estimate(c.metrics_staleness, now) > c.saturation_queue + extra or (
            state.has_kv and state.kv_estimate() > c.saturation_kv
        )

    def _capped(self, state: EndpointState, extra: int = 0) -> bool:
        """At a configured cap, whatever the metrics say: ``saturation_max_inflight`` (keeps
        room in the engine: what it is sent starts at once) or ``saturation_max_prefilling``
        (one more prefill would share the steps of those under way)."""
        c = self.config
        return bool(
            (c.saturation_max_inflight and state.inflight >= c.saturation_max_inflight + extra)
            or (
                c.saturation_max_prefilling
                and state.prefilling >= c.saturation_max_prefilling + extra
            )
        )

    def with_room(self, candidates: Sequence[EndpointState]) -> Sequence[EndpointState]:
        """The candidates below the configured caps, so that the scheduler does not send past
        a cap while another endpoint has room (a prefix held there outweighs the load
        scorers); all of them when none has room (or no cap is configured: then nothing is
        looked at)."""
        c = self.config
        if not (c.saturation_max_inflight or c.saturation_max_prefilling):
            return candidates
        return [state for state in candidates if not self._capped(state)] or candidates

    def admit(
        self, model: str, backend: Backend, now: float, level: Level, shed: bool
    ) -> Sequence[EndpointState]:
        """The candidates to schedule over, or the GatewayError to answer with (a Sheddable
        request, or one of a negative priority, over saturated candidates only when
        ``shed``)."""
        if not backend.candidates:
            raise GatewayError(
                503,
                f"model {model!r} has no ready endpoint ({backend.ref} selects none)",
                ErrorCode.NO_READY_ENDPOINT,
            )
        candidates = self.outliers.available(backend.candidates, now)
        if (
            shed
            and band_of(level) >= SHEDDABLE_BAND
            and all(self.saturated(state, now) for state in candidates)
        ):
            raise Overloaded(
                429,
                f"model {model!r} is overloaded: every endpoint is saturated and this "
                "request is Sheddable; retry later",
                retry_after=self.config.shed_retry_after,
            )
        return candidates
