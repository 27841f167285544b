"""Outlier ejection: replicas that fail repeatedly are skipped for a cool-down.

A replica with ``ejection_failures`` consecutive failures (connect errors, 5xx, timeouts) is
ejected for ``ejection_base`` seconds, doubling with each ejection up to ``ejection_max``.
After the cool-down it is readmitted on probation once its metrics endpoint answers again (at
once for engines without metrics); one failure on probation ejects it again, a success ends
the probation and two in a row forgive its past ejections. Failures while it is ejected (the
requests it had) count for nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.registry import EndpointState

log = logging.getLogger("llmplane.gateway")


class Outliers:
    def __init__(
        self, config: GatewayConfig, on_eject: Callable[[EndpointState], None] | None = None
    ) -> None:
        self.config = config
        self.on_eject = on_eject

    def success(self, state: EndpointState) -> None:
        state.consecutive_failures = 0
        if state.probation:
            state.probation = False
        elif state.ejections:
            state.ejections = 0

    def failure(self, state: EndpointState, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if state.ejected_until > now:
            # Requests sent before the ejection failing now (every stream of a killed replica)
            # say nothing new: counted, they re-ejected it at a doubled cool-down each, so a
            # replica restarted at once stayed out for the maximum.
            return
        state.consecutive_failures += 1
        if state.probation or state.consecutive_failures >= self.config.ejection_failures:
            cooldown = min(
                self.config.ejection_base * (2**state.ejections), self.config.ejection_max
            )
            state.ejections += 1
            state.ejected_until = now + cooldown
            state.probation = False
            state.consecutive_failures = 0
            log.warning(
                "ejecting %s for %.1f s after repeated failures (ejection %d)",
                state.address,
                cooldown,
                state.ejections,
            )
            if self.on_eject is not None:
                self.on_eject(state)

    def available(self, candidates: Sequence[EndpointState], now: float) -> list[EndpointState]:
        """Candidates not ejected (readmitting those whose cool-down is over and that look
        healthy); all of them if every one is ejected (fail open: better a try than a 503)."""
        out = []
        for state in candidates:
            if state.ejected_until:
                if state.ejected_until > now or not (
                    state.scrape_ok or state.has_load_metrics is False
                ):
                    continue
                state.ejected_until = 0.0
                state.probation = True
                log.info("readmitting %s on probation", state.address)
            out.append(state)
        return out or list(candidates)
