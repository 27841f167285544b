"""Scale from zero in a cluster: the in-cluster gateway's activator asks for the first replica
(docs/autoscaling.md, "On Kubernetes", Scale from zero).

The cluster's autoscaler is the operator's, a network hop and a polling interval away, so the
gateway itself writes the Playground's scale subresource from 0 to ``max(1, minReplicas)`` the
moment a request is held, as a Knative activator pokes its autoscaler. It is the only write the
gateway makes; it carries the resourceVersion it read (a concurrent change wins), and there is
one write per workload at a time however many requests are held.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from llmplane.aio import cancel
from llmplane.kube.client import Conflict, KubeClient
from llmplane.kube.kinds import PLAYGROUND
from llmplane.store.base import Store

log = logging.getLogger("llmplane.gateway")

ATTEMPTS = 3


def first_replicas(playground: dict[str, Any] | None) -> int | None:
    """How many replicas to ask for when a request waits for ``playground`` (None: none)."""
    spec = (playground or {}).get("spec") or {}
    elastic = spec.get("elasticConfig")
    if not isinstance(elastic, dict) or spec.get("replicas", 1) != 0:
        return None
    want = max(1, int(elastic.get("minReplicas") or 0))
    maximum = elastic.get("maxReplicas")
    return min(want, int(maximum)) if isinstance(maximum, int) and maximum > 0 else want


class KubeScaleFromZero:
    """``Activator.wake`` for the in-cluster gateway (see the module docstring). ``store`` is
    the gateway's ``KubeStore`` (its cache answers the first read); ``api`` its API client."""

    def __init__(self, api: Any, store: Store) -> None:
        self.client = KubeClient(api)  # shares the store's API client: the store closes it
        self.store = store
        self._pending: dict[str, asyncio.Task[None]] = {}

    def wake(self, workload: str) -> None:
        if workload in self._pending:
            return
        task = asyncio.get_running_loop().create_task(self._scale(workload))
        self._pending[workload] = task
        task.add_done_callback(lambda _: self._pending.pop(workload, None))

    async def _scale(self, workload: str) -> None:
        namespace, _, name = workload.partition("/")
        obj = self.store.get("Playground", name, namespace)
        for _ in range(ATTEMPTS):
            want = first_replicas(obj)
            if want is None or obj is None:
                return
            try:
                await self.client.scale(
                    PLAYGROUND, name, namespace, want, obj["metadata"].get("resourceVersion")
                )
            except Conflict:
                obj = await self.client.get_or_none(PLAYGROUND, name, namespace)
                continue
            except Exception as err:  # RBAC, API down: the held requests time out with a 503
                log.warning("scale from zero of Playground %s failed: %s", workload, err)
                return
            log.info("Playground %s: 0 -> %d (a request is waiting)", workload, want)
            return

    async def close(self) -> None:
        for task in list(self._pending.values()):
            await cancel(task)
