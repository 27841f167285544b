"""The gateway's view of load per workload, for the autoscaler (``controlplane/autoscaler.py``).

Read off what the gateway keeps anyway (``Gateway.view``): nothing is added to the request
path. Requests waiting in flow control count as in flight on the endpoints they wait for, so
that queueing in the gateway instead of the engines still scales the workload.

In ``llmplane up`` the autoscaler reads ``Gateway.signals`` in process. In a cluster the
operator reads ``GET /autoscaling/signals`` (admin key, as ``/metrics``): ``snapshot()`` as
JSON, every workload at once, and ``RemoteSignals`` (``operator/signals.py``) merges the
answers of every gateway replica.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from llmplane.controlplane.autoscaling import (
    INFLIGHT,
    KV_USAGE,
    PREFILL_TOKENS,
    RUNNING,
    TTFT,
    WAITING,
)

if TYPE_CHECKING:
    from llmplane.gateway.registry import EndpointState
    from llmplane.gateway.server import GatewayView

Part = Mapping[str, Any]  # one process's ``parts()``


class PeerSignals(Protocol):
    """The other worker processes of this gateway (``workers/metrics.py``)."""

    async def signals(self) -> list[dict[str, Any]]: ...


class GatewaySignals:
    """``SignalSource`` over the gateway's ``view`` (and its worker ``peers``' parts)."""

    def __init__(self, view: Callable[[], GatewayView], peers: PeerSignals | None = None) -> None:
        self.view = view
        self.peers = peers
        self._peers: Sequence[Part] = []  # the other workers' parts, as of refresh()

    async def refresh(self) -> None:
        """Read the other workers' ``parts()`` (``llmplane up --workers N``): the autoscaler
        calls this before each pass, so the reads below count every worker's requests."""
        self._peers = await self.peers.signals() if self.peers is not None else []

    def parts(self) -> dict[str, Any]:
        """This process's own share, the part not in shared state: requests per workload,
        flow-control queues per endpoint, requests held at the activator per workload (every
        worker has the same in-flight counts and scraped engine metrics)."""
        view = self.view()
        workload_of = {s.address: s.endpoint.workload for s in view.endpoints}
        requests: dict[str, float] = {}
        for address, n in view.requests.items():
            workload = workload_of.get(address)
            if workload:
                requests[workload] = requests.get(workload, 0.0) + n
        return {"requests": requests, "queued": view.queued, "held": view.held}

    def replica_signals(
        self, workload: str, queued: Mapping[str, float] | None = None
    ) -> Mapping[str, Mapping[str, float]]:
        view = self.view()
        staleness = max(view.metrics_staleness, 5.0)
        now = time.monotonic()
        if queued is None:
            queued = self._merged(self._peers)[1] if self._peers else view.queued
        out: dict[str, dict[str, float]] = {}
        for state in _states(view, workload):
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

    def requests_seen(self, workload: str) -> float:
        requests, queued, _ = self._merged(self._peers)
        return self._seen(workload, requests, queued)

    def held(self, workload: str) -> int:
        return self._merged(self._peers)[2].get(workload, 0)

    def _seen(
        self, workload: str, requests: Mapping[str, float], queued: Mapping[str, float]
    ) -> float:
        states = _states(self.view(), workload)
        return requests.get(workload, 0.0) + sum(
            s.inflight + queued.get(s.address, 0.0) for s in states
        )

    def _merged(
        self, peers: Sequence[Part]
    ) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
        """(requests per workload, queued per endpoint, held per workload): this process's
        parts plus ``peers``'."""
        merged: tuple[dict[str, Any], ...] = ({}, {}, {})
        for part in (self.parts(), *peers):
            for total, name in zip(merged, ("requests", "queued", "held"), strict=True):
                for key, n in part.get(name, {}).items():
                    total[key] = total.get(key, 0) + n
        return merged  # type: ignore[return-value]

    def snapshot(self, peers: Sequence[Part] = ()) -> dict[str, Any]:
        """Every workload's signals now: ``{"workloads": {key: {"replicas": {address:
        {signal: value}}, "requestsSeen": n, "held": n}}}`` (the ``/autoscaling/signals`` body),
        with ``peers``' ``parts()`` added (the other workers of this gateway)."""
        requests, queued, held = self._merged(peers)
        keys = {s.endpoint.workload for s in self.view().endpoints}
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


def _states(view: GatewayView, workload: str) -> list[EndpointState]:
    return [s for s in view.endpoints if s.endpoint.workload == workload]
