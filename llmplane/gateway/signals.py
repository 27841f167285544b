"""The gateway's view of load per workload, for the autoscaler (``controlplane/autoscaler.py``).

Read off what the gateway keeps anyway (endpoint registry: scraped engine metrics and its own
in-flight counts and prompt tokens waiting for their first byte; the request counter by endpoint; requests waiting in flow control, shared
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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llmplane.controlplane.autoscaling import (
    INFLIGHT,
    KV_USAGE,
    PREFILL_TOKENS,
    RUNNING,
    TTFT,
    WAITING,
)

if TYPE_CHECKING:
    from llmplane.gateway.server import GatewayView


class GatewaySignals:
    """``SignalSource`` over a running ``Gateway``'s ``view()``."""

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway
        self._peers: list[Mapping[str, Any]] = []  # the other workers' parts, as of refresh()

    async def refresh(self) -> None:
        """Read the other workers' ``parts()`` (``llmplane up --workers N``): the autoscaler
        calls this before each pass, so the reads below count every worker's requests."""
        seat = getattr(self.gateway, "seat", None)
        self._peers = await seat.metrics.signals() if seat is not None else []

    def _states(self, workload: str, view: GatewayView | None = None) -> list[Any]:
        view = view or self.gateway.view()
        return [s for s in view.endpoints if s.endpoint.workload == workload]

    def parts(self) -> dict[str, Any]:
        """This process's own share of the signals, the part that is not in shared state:
        requests counted per workload, flow-control queues per endpoint, requests held at the
        activator per workload. With several workers (``llmplane/gateway/workers``) the worker
        answering ``/autoscaling/signals`` adds its peers' parts (in-flight counts and scraped
        engine metrics are the same in every worker)."""
        view = self.gateway.view()
        return {"requests": self._requests(view), "queued": view.queued, "held": view.held}

    def replica_signals(
        self, workload: str, queued: Mapping[str, float] | None = None
    ) -> Mapping[str, Mapping[str, float]]:
        view = self.gateway.view()
        staleness = max(view.metrics_staleness, 5.0)
        now = time.monotonic()
        out: dict[str, dict[str, float]] = {}
        if queued is None:
            queued = self._merged(self._peers)[1] if self._peers else view.queued
        for state in self._states(workload, view):
            values: dict[str, float] = {
                INFLIGHT: state.inflight + queued.get(state.address, 0.0),
                PREFILL_TOKENS: float(state.prefill_tokens),
            }
            if state.metrics_fresh(staleness, now):
                values[WAITING] = state.waiting
                values[RUNNING] = state.running
                if state.has_kv:
                    values[KV_USAGE] = state.kv_usage
                if state.ttft >= 0:
                    values[TTFT] = state.ttft
            out[state.address] = values
        return out

    @staticmethod
    def _requests(view: GatewayView) -> dict[str, float]:
        """Requests this process has sent, per workload (the request counter by endpoint)."""
        workload_of = {s.address: s.endpoint.workload for s in view.endpoints}
        requests: dict[str, float] = {}
        for address, n in view.requests.items():
            workload = workload_of.get(address)
            if workload:
                requests[workload] = requests.get(workload, 0.0) + n
        return requests

    def requests_seen(self, workload: str) -> float:
        requests, queued, _ = self._merged(self._peers)
        return self._seen(workload, requests, queued)

    def _seen(
        self, workload: str, requests: Mapping[str, float], queued: Mapping[str, float]
    ) -> float:
        states = self._states(workload)
        return requests.get(workload, 0.0) + sum(
            s.inflight + queued.get(s.address, 0.0) for s in states
        )

    def held(self, workload: str) -> int:
        peers = sum(int(p.get("held", {}).get(workload, 0)) for p in self._peers)
        return self.gateway.view().held.get(workload, 0) + peers

    def _merged(
        self, peers: Sequence[Mapping[str, Any]]
    ) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
        """(requests per workload, queued per endpoint, held per workload): this process's
        parts plus ``peers``'."""
        requests: dict[str, float] = {}
        queued: dict[str, float] = {}
        held: dict[str, int] = {}
        for part in (self.parts(), *peers):
            for key, n in part.get("requests", {}).items():
                requests[key] = requests.get(key, 0.0) + n
            for key, n in part.get("queued", {}).items():
                queued[key] = queued.get(key, 0.0) + n
            for key, n in part.get("held", {}).items():
                held[key] = held.get(key, 0) + int(n)
        return requests, queued, held

    def snapshot(self, peers: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """Every workload's signals now: ``{"workloads": {key: {"replicas": {address:
        {signal: value}}, "requestsSeen": n, "held": n}}}`` (the ``/autoscaling/signals`` body),
        with ``peers``' ``parts()`` added (the other workers of this gateway)."""
        requests, queued, held = self._merged(peers)
        keys = {s.endpoint.workload for s in self.gateway.view().endpoints}
        keys |= {k for k, n in held.items() if n}
        keys.discard("")
        return {
            "workloads": {
                key: {
                    "replicas": self.replica_signals(key, queued),
                    "requestsSeen": self._seen(key, requests, queued),
                    "held": held.get(key, 0),
                }
                for key in sorted(keys)
            }
        }
