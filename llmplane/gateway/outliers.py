"""Outlier ejection: replicas that fail repeatedly are skipped for a cool-down (the rules:
docs/gateway.md, "Retries, timeouts, ejection").

Failures while a replica is ejected (the requests it had) count for nothing, nor do the
gateway's own shortages (a connect that failed with EMFILE, ENOMEM ...: ``attempt_failed``),
which are logged once per burst instead: a gateway out of descriptors must not eject the
healthy engines it could not reach.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.observability import Counter
from llmplane.gateway.registry import EndpointState
from llmplane.shortage import ShortageLog

if TYPE_CHECKING:
    from llmplane.gateway.proxy import AttemptFailed

log = logging.getLogger("llmplane.gateway")


class Outliers:
    def __init__(self, config: GatewayConfig, ejections: Counter | None = None) -> None:
        self.config = config
        self.ejections = ejections  # by endpoint address
        self.shortage = ShortageLog(
            log,
            "the gateway ran out of its own resources connecting to a replica (%s): such "
            "requests get 503 with Retry-After and no replica is blamed; see docs/security.md "
            "(open files)",
            "the gateway has its resources back: connecting to replicas as usual",
        )

    def success(self, state: EndpointState) -> None:
        if self.shortage.short_now:
            self.shortage.back()
        state.consecutive_failures = 0
        if state.probation:
            state.probation = False
        elif state.ejections:
            state.ejections = 0

    def attempt_failed(self, state: EndpointState, failure: AttemptFailed) -> None:
        """An attempt on ``state`` failed before reaching the client: charged to it unless the
        gateway itself was short of a resource."""
        if failure.blames_replica:
            self.failure(state)
        else:
            self.shortage.short(f"{state.address}: {failure.detail}")

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
            if self.ejections is not None:
                self.ejections.labels(state.address).inc()

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
