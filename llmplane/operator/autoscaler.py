"""The operator's autoscaler: llmplane's own decision for Playgrounds no HPA can scale.

A Playground with ``elasticConfig`` gets a real HorizontalPodAutoscaler when its trigger names
metrics an HPA can read (``runtime.kube.service.hpa_reads``). The others - no trigger anywhere
(the built-in default: the gateway's in-flight requests per replica), a trigger on the
gateway's own metrics, ``minReplicas: 0`` - are scaled here, with the very decision
``llmplane up`` runs (``controlplane.autoscaler.Deciders`` over ``autoscaling.decide``):

- every ``interval`` seconds it asks every gateway replica for its signals
  (``operator/signals.py``), averages them per replica over ``window`` seconds and decides;
- it writes the result to the Playground's **scale subresource**, as an HPA does (RBAC
  ``playgrounds/scale``), carrying the resourceVersion it read so a concurrent edit wins;
  the Playground's reconcile then carries ``spec.replicas`` to the Service and its workload;
- each change is a ``SuccessfulRescale`` Event on the Playground saying why
  (``kubectl describe playground``).

With no gateway answering it does nothing: silence is not idleness. Scale from zero does not
wait for it: the gateway's activator writes the first replica itself
(``gateway/kube_activation.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llmplane.api.inference import BackendRuntime, Playground
from llmplane.api.llmaz import OpenModel
from llmplane.controlplane import autoscaling
from llmplane.controlplane.autoscaler import (
    RESCALE,
    AutoscalerConfig,
    Deciders,
    pair_key,
    replica_requests,
    rescale_message,
    role_scale,
    scaled_workloads,
)
from llmplane.controlplane.events import event_object
from llmplane.controlplane.kube_reconciler import parse
from llmplane.kube.client import Conflict, KubeClient
from llmplane.kube.kinds import BACKENDRUNTIME, EVENT, INFERENCE_SERVICE, OPENMODEL, PLAYGROUND
from llmplane.operator.signals import RemoteSignals
from llmplane.runtime.kube.service import scaled_by_llmplane

log = logging.getLogger("llmplane.operator")

COMPONENT = "llmplane-operator"
GATEWAY_SELECTOR = "app.kubernetes.io/name=llmplane-gateway"  # the Helm chart's gateway pods


@dataclass(frozen=True)
class AutoscaleOptions:
    """How the operator finds the gateways and how often it decides (``llmplane operator``)."""

    enabled: bool = True
    gateway_urls: tuple[str, ...] = ()
    gateway_selector: str | None = GATEWAY_SELECTOR
    gateway_port: int = 8000
    admin_key: str | None = None
    interval: float = 2.0
    window: float = 15.0


class KubeAutoscaler:
    """See the module docstring. ``step()`` is one pass; ``run()`` repeats it."""

    def __init__(
        self,
        client: KubeClient,
        signals: RemoteSignals,
        config: AutoscalerConfig | None = None,
        namespaces: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.signals = signals
        self.config = config or AutoscalerConfig()
        self.namespaces = list(namespaces)
        self.clock = clock
        self.deciders = Deciders(self.config.window)

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.step()
                except Exception:  # a bug or an API hiccup must not stop autoscaling for good
                    log.exception("autoscaling pass failed")
                await asyncio.sleep(self.config.interval)
        finally:
            await self.signals.close()

    async def _parsed(self, kind: Any, cls: Any, namespaced: bool) -> list[Any]:
        objects: list[dict[str, Any]] = []
        for namespace in (self.namespaces or [None]) if namespaced else [None]:
            objects += await self.client.list(kind, namespace)
        out = []
        for obj in objects:
            with contextlib.suppress(Exception):  # the reconciler reports invalid objects
                out.append((parse(cls, obj), obj))
        return out

    async def step(self) -> None:
        """One pass: list the elastic Playgrounds that are ours, sample, decide, write."""
        now = self.clock()
        elastic = [
            (pg, obj)
            for pg, obj in await self._parsed(PLAYGROUND, Playground, True)
            if scaled_workloads(pg)
        ]
        # (Playground, its object, trigger, role or None, the Service of the workload)
        ours: list[tuple[Playground, dict[str, Any], Any, str | None, str]] = []
        if elastic:
            models = {m.name: m for m, _ in await self._parsed(OPENMODEL, OpenModel, False)}
            backends = {
                b.name: b for b, _ in await self._parsed(BACKENDRUNTIME, BackendRuntime, False)
            }
            for pg, obj in elastic:
                backend = backends.get(pg.spec.backend_runtime_config.backend_name)
                for role, service in scaled_workloads(pg):
                    if role is not None:  # roles get no HPA: always scaled here
                        trigger = autoscaling.role_trigger(role, role_scale(pg, role)[0])
                        ours.append((pg, obj, trigger, role, service))
                    elif scaled_by_llmplane(pg, backend, models):
                        trigger = autoscaling.trigger_in_force(pg, backend, models)
                        ours.append((pg, obj, trigger, None, service))
        self.deciders.forget({f"{pg.namespace}/{service}" for pg, _, _, _, service in ours})
        if not ours:
            return
        snapshot = await self.signals.fetch()
        if snapshot is None:
            return  # no gateway answered: nothing is known about load
        for pg, obj, trigger, role, service_name in ours:
            key = f"{pg.namespace}/{service_name}"
            assert trigger is not None
            service = await self.client.get_or_none(INFERENCE_SERVICE, service_name, pg.namespace)
            decision = self.deciders.decide(
                pg,
                key,
                trigger,
                snapshot.replica_signals(key),
                snapshot.requests_seen(key),
                snapshot.held(key) + (snapshot.held(pair_key(pg)) if role else 0),
                replica_requests(service),
                now,
                role,
            )
            current = role_scale(pg, role)[1]
            if decision.desired != current:
                await self._scale(obj, current, decision.desired, decision.reason, role)

    async def _scale(
        self, obj: dict[str, Any], current: int, desired: int, reason: str, role: str | None
    ) -> None:
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        try:
            if role is None:
                await self.client.scale(
                    PLAYGROUND, meta["name"], namespace, desired, meta.get("resourceVersion")
                )
            else:  # spec.llmplane.disaggregation.<role>.replicas: no scale subresource
                body = {
                    "metadata": {"resourceVersion": meta.get("resourceVersion")},
                    "spec": {"llmplane": {"disaggregation": {role: {"replicas": desired}}}},
                }
                await self.client.merge_patch(PLAYGROUND, meta["name"], namespace, body)
        except Conflict:
            return  # changed since it was read: decide again on the next pass
        log.info(
            "Playground %s/%s: %d -> %d (%s)", namespace, meta["name"], current, desired, reason
        )
        try:
            message = rescale_message(desired, reason)
            if role is not None:
                message = f"{role}: {message}"
            await self.client.create(EVENT, rescale_event(obj, message))
        except Exception as err:  # an Event is for people; the scaling stands without it
            log.warning("could not post the rescale Event of %s: %s", meta["name"], err)

    def reason(self, key: str) -> str:
        return self.deciders.reason(key)


def rescale_event(obj: dict[str, Any], message: str) -> dict[str, Any]:
    """A core/v1 Event ``SuccessfulRescale`` about a Playground (``kubectl describe``)."""
    event = event_object(
        obj, RESCALE, message, "Normal", f"{obj['metadata']['name']}.{time.time_ns():x}"
    )
    event["source"] = {"component": COMPONENT}
    event["reportingComponent"] = COMPONENT
    return event
