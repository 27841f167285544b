"""The in-cluster gateways' autoscaling signals, read by the operator over HTTP.

Every gateway replica serves ``GET /autoscaling/signals`` (``gateway/signals.py``): per
workload (``namespace/playground``) the signals of each ready replica it routes to, a request
counter and the requests its activator holds. Each gateway counts only its own traffic, so the
operator asks every replica and merges: in-flight counts, prompt tokens waiting for their first
token, request counters and held requests add up; engine metrics (queue, running, KV usage,
time to first token), which every gateway scrapes from the same
engine, are the same reading and the highest one is kept.

The gateways are found by a label selector on Pods (``--gateway-selector``, the Helm chart's
gateway labels; ready pods only, ``podIP:--gateway-port``), or given as URLs
(``--gateway-url``). With the gateway's admin key set, the operator sends it
(``LLMPLANE_GATEWAY_ADMIN_KEY``), as for ``/metrics``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from llmplane.controlplane.autoscaling import INFLIGHT, PREFILL_TOKENS
from llmplane.kube.kinds import POD
from llmplane.kube.pods import pod_address, pod_ready

log = logging.getLogger("llmplane.operator")

PATH = "/autoscaling/signals"
# Each gateway's own counts; the rest are engine readings.
ADDITIVE = frozenset({INFLIGHT, PREFILL_TOKENS})


@dataclass
class Snapshot:
    """Merged signals of every gateway that answered (a ``SignalSource``)."""

    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    gateways: int = 0

    def add(self, body: Mapping[str, Any]) -> None:
        """Merge one gateway's ``/autoscaling/signals`` answer (malformed parts are skipped)."""
        self.gateways += 1
        workloads = body.get("workloads")
        if not isinstance(workloads, Mapping):
            return
        for key, data in workloads.items():
            if not isinstance(data, Mapping):
                continue
            into = self.workloads.setdefault(
                str(key), {"replicas": {}, "requestsSeen": 0.0, "held": 0}
            )
            into["requestsSeen"] += _number(data.get("requestsSeen"))
            into["held"] += int(_number(data.get("held")))
            replicas = data.get("replicas")
            for address, values in (replicas if isinstance(replicas, Mapping) else {}).items():
                if not isinstance(values, Mapping):
                    continue
                merged = into["replicas"].setdefault(str(address), {})
                for name, value in values.items():
                    number = _number(value)
                    if name in ADDITIVE:
                        merged[name] = merged.get(name, 0.0) + number
                    else:
                        merged[name] = max(merged.get(name, number), number)

    def replica_signals(self, workload: str) -> Mapping[str, Mapping[str, float]]:
        return (self.workloads.get(workload) or {}).get("replicas") or {}

    def requests_seen(self, workload: str) -> float:
        return float((self.workloads.get(workload) or {}).get("requestsSeen") or 0.0)

    def held(self, workload: str) -> int:
        return int((self.workloads.get(workload) or {}).get("held") or 0)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


class RemoteSignals:
    """Fetches and merges the gateways' signals (see the module docstring)."""

    def __init__(
        self,
        urls: Sequence[str] = (),
        *,
        client: Any = None,
        selector: str | None = None,
        port: int = 8000,
        namespaces: Sequence[str] = (),
        admin_key: str | None = None,
        timeout: float = 2.0,
    ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.client = client  # KubeClient, to find gateway pods by ``selector``
        self.selector = selector
        self.port = port
        self.namespaces = list(namespaces)
        self.headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._failing: set[str] = set()

    async def gateways(self) -> list[str]:
        """Base URLs of the gateways to ask now."""
        urls = list(self.urls)
        if self.selector and self.client is not None:
            pods: list[dict[str, Any]] = []
            for namespace in self.namespaces or [None]:
                pods += await self.client.list(POD, namespace, label_selector=self.selector)
            urls += [
                f"http://{pod_address(p['status']['podIP'], self.port)}"
                for p in pods
                if pod_ready(p)
            ]
        return urls

    async def fetch(self) -> Snapshot | None:
        """Every gateway's answer merged; None when no gateway answered (then nothing is
        known about load, and the autoscaler must not act on silence)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        urls = await self.gateways()
        answers = await asyncio.gather(*(self._one(u) for u in urls))
        snapshot = Snapshot()
        for body in answers:
            if body is not None:
                snapshot.add(body)
        return snapshot if snapshot.gateways else None

    async def _one(self, url: str) -> Mapping[str, Any] | None:
        assert self._session is not None
        try:
            async with self._session.get(url + PATH, headers=self.headers) as response:
                if response.status != 200:
                    raise ValueError(f"HTTP {response.status}")
                body = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            if url not in self._failing:
                log.warning("autoscaling signals from gateway %s: %s", url, err)
                self._failing.add(url)
            return None
        self._failing.discard(url)
        return body if isinstance(body, Mapping) else None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
