"""``llmplane operator``: reconcile llmplane resources on a Kubernetes cluster (kopf).

Watches OpenModels, BackendRuntimes, Playgrounds, inference Services and the LeaderWorkerSets /
Deployments it creates, and triggers level-based passes of
``llmplane.controlplane.kube_reconciler.Reconciler`` (this package decides only when): every event
re-reads what it needs and server-side-applies the planned objects with field manager
``llmplane``. Only event handlers are used, so kopf puts no finalizers and no annotations on
anyone's objects; deletion is the API server's garbage collection via ownerReferences. A resync
loop repairs drift (someone edited a LeaderWorkerSet) every ``--resync-seconds``. The
autoscaler (``operator/autoscaler.py``) scales the elastic Playgrounds no HPA can scale, on the
gateways' signals (``--gateway-selector`` / ``--gateway-url``; ``--no-autoscaler`` turns it off).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import kopf

from llmplane.aio import cancel
from llmplane.controlplane.autoscaler import AutoscalerConfig
from llmplane.controlplane.kube_reconciler import Reconciler
from llmplane.kube.client import KubeClient
from llmplane.kube.kinds import (
    BACKENDRUNTIME,
    DEPLOYMENT,
    INFERENCE_SERVICE,
    LEADERWORKERSET,
    OPENMODEL,
    PLAYGROUND,
    Kind,
)
from llmplane.operator.autoscaler import GATEWAY_SELECTOR, AutoscaleOptions, KubeAutoscaler
from llmplane.operator.signals import RemoteSignals
from llmplane.runtime.kube import DEFAULT_IMAGE, KubeOptions

log = logging.getLogger("llmplane.operator")


class Operator:
    """The reconciler plus what kopf needs: a registry of handlers and per-object locks."""

    def __init__(
        self,
        options: KubeOptions,
        server: str | None = None,
        token: str | None = None,
        resync_seconds: float = 60.0,
        autoscale: AutoscaleOptions | None = None,
    ):
        self.options = options
        self.autoscale = autoscale or AutoscaleOptions()
        self.autoscaler: KubeAutoscaler | None = None
        self._autoscaling: asyncio.Task[None] | None = None
        self.namespaces: list[str] = []
        self.server, self.token = server, token
        self.resync_seconds = resync_seconds
        self.client: KubeClient | None = None
        self.reconciler: Reconciler | None = None
        self._locks: defaultdict[tuple[str, str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self._resync: asyncio.Task[None] | None = None
        self.registry = self._build_registry()

    async def _locked(self, key: tuple[str, str, str], fn: Callable[[], Awaitable[None]]) -> None:
        async with self._locks[key]:
            try:
                await fn()
            except Exception:  # an event handler must not die; the resync retries
                log.exception("reconciling %s/%s/%s failed", *key)

    async def playground(self, namespace: str, name: str) -> None:
        assert self.reconciler is not None
        await self._locked(
            ("Playground", namespace, name), lambda: self.reconciler.playground(namespace, name)
        )

    async def service(self, namespace: str, name: str) -> None:
        assert self.reconciler is not None
        await self._locked(
            ("Service", namespace, name), lambda: self.reconciler.service(namespace, name)
        )

    async def resync_once(self) -> None:
        assert self.client is not None
        for obj in await self.client.list(PLAYGROUND):
            await self.playground(
                obj["metadata"].get("namespace", "default"), obj["metadata"]["name"]
            )
        for obj in await self.client.list(INFERENCE_SERVICE):
            await self.service(obj["metadata"].get("namespace", "default"), obj["metadata"]["name"])
        await self.pool_refs()

    async def pool_refs(self) -> None:
        """InferenceObjectives' and InferenceModelRewrites' status (one pass, serialised)."""
        assert self.reconciler is not None
        await self._locked(("PoolRefs", "", ""), self.reconciler.pool_refs)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.resync_seconds)
            try:
                await self.resync_once()
            except Exception:
                log.exception("resync failed")

    def _build_registry(self) -> kopf.OperatorRegistry:
        registry = kopf.OperatorRegistry()

        def on_event(kind: Kind) -> Callable[[Any], Any]:
            return kopf.on.event(
                group=kind.group, version=kind.version, plural=kind.plural, registry=registry
            )

        @kopf.on.startup(registry=registry)
        async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.posting.level = logging.WARNING
            settings.watching.server_timeout = 300
            self.client = await KubeClient.connect(self.server, self.token)
            self.reconciler = Reconciler(self.client, self.options)
            self._resync = asyncio.create_task(self._resync_loop(), name="llmplane-resync")
            if self.autoscale.enabled:
                a = self.autoscale
                signals = RemoteSignals(
                    a.gateway_urls,
                    client=self.client,
                    selector=a.gateway_selector,
                    port=a.gateway_port,
                    namespaces=self.namespaces,
                    admin_key=a.admin_key,
                )
                self.autoscaler = KubeAutoscaler(
                    self.client,
                    signals,
                    AutoscalerConfig(interval=a.interval, window=a.window),
                    self.namespaces,
                )
                self._autoscaling = asyncio.create_task(
                    self.autoscaler.run(), name="llmplane-autoscaler"
                )

        @kopf.on.cleanup(registry=registry)
        async def cleanup(**_: Any) -> None:
            for task in (self._resync, self._autoscaling):
                await cancel(task)
            if self.client is not None:
                await self.client.close()

        if self.server:

            @kopf.on.login(registry=registry)
            def login(**_: Any) -> kopf.ConnectionInfo:
                return kopf.ConnectionInfo(server=self.server, token=self.token, insecure=True)

        else:
            kopf.on.login(registry=registry)(kopf.login_with_service_account)
            kopf.on.login(registry=registry)(kopf.login_with_kubeconfig)

        @on_event(PLAYGROUND)
        async def playground_event(
            event: dict[str, Any], name: str, namespace: str, **_: Any
        ) -> None:
            if event["type"] != "DELETED":
                await self.playground(namespace, name)

        @on_event(INFERENCE_SERVICE)
        async def service_event(
            event: dict[str, Any], body: Any, name: str, namespace: str, **_: Any
        ) -> None:
            if event["type"] == "DELETED":
                return
            await self.service(namespace, name)
            # The owning Playground mirrors the Service's status.
            for ref in body.get("metadata", {}).get("ownerReferences") or []:
                if ref.get("kind") == "Playground" and ref.get("controller"):
                    await self.playground(namespace, ref["name"])

        async def workload_event(
            event: dict[str, Any], body: Any, namespace: str, **_: Any
        ) -> None:
            for ref in body.get("metadata", {}).get("ownerReferences") or []:
                if (
                    ref.get("controller")
                    and ref.get("kind") == "Service"
                    and ref.get("apiVersion") == INFERENCE_SERVICE.api_version
                ):
                    await self.service(namespace, ref["name"])

        on_event(LEADERWORKERSET)(workload_event)
        on_event(DEPLOYMENT)(workload_event)

        @on_event(OPENMODEL)
        async def model_event(event: dict[str, Any], name: str, **_: Any) -> None:
            assert self.reconciler is not None
            await self.reconciler.playgrounds_using(model=name)

        @on_event(BACKENDRUNTIME)
        async def backend_event(event: dict[str, Any], name: str, **_: Any) -> None:
            assert self.reconciler is not None
            await self.reconciler.playgrounds_using(backend=name)

        async def pool_ref_event(**_: Any) -> None:
            await self.pool_refs()

        # An objective or rewrite changed, or a pool they may name came or went.
        for name in ("InferenceObjective", "InferenceModelRewrite", "InferencePool"):
            on_event(Kind.of(name))(pool_ref_event)
        for served in Kind.served_of(["InferencePool"]):
            on_event(served)(pool_ref_event)

        return registry

    async def run(
        self,
        *,
        namespaces: Sequence[str] = (),
        liveness: str | None = None,
        stop_flag: asyncio.Event | None = None,
        ready_flag: asyncio.Event | None = None,
    ) -> None:
        settings = kopf.OperatorSettings()
        self.namespaces = list(namespaces)
        await kopf.operator(
            registry=self.registry,
            settings=settings,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            standalone=True,
            liveness_endpoint=liveness,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmplane operator",
        description="Reconcile Playgrounds and Services into LeaderWorkerSets, Services and HPAs.",
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", help="watch every namespace (default)"
    )
    scope.add_argument("--namespace", "-n", action="append", default=[], help="watch only these")
    p.add_argument(
        "--loader-image", default=DEFAULT_IMAGE, help="image of model-loader init containers"
    )
    p.add_argument(
        "--deployment",
        action="store_true",
        help="create apps/v1 Deployments instead of LeaderWorkerSets (single-host only)",
    )
    p.add_argument("--resync-seconds", type=float, default=60.0)
    scaling = p.add_argument_group(
        "autoscaling",
        "Playgrounds no HPA can scale (default trigger, gateway metrics, minReplicas 0) are "
        "scaled by the operator on the gateways' signals (docs/autoscaling.md)",
    )
    scaling.add_argument(
        "--no-autoscaler", action="store_true", help="do not run the operator's autoscaler"
    )
    scaling.add_argument(
        "--gateway-selector",
        default=GATEWAY_SELECTOR,
        help="label selector of the gateway pods to read signals from ('' for none)",
    )
    scaling.add_argument("--gateway-port", type=int, default=8000, help="the gateway pods' port")
    scaling.add_argument(
        "--gateway-url", action="append", default=[], help="a gateway to read (repeatable)"
    )
    scaling.add_argument("--autoscale-interval", type=float, default=2.0, help="seconds")
    scaling.add_argument(
        "--autoscale-window", type=float, default=15.0, help="seconds of signals averaged"
    )
    p.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="kopf liveness endpoint ('' for none)",
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--server", help=argparse.SUPPRESS)  # API server URL (development, tests)
    p.add_argument("--token", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    options = KubeOptions(image=args.loader_image, use_leader_worker_set=not args.deployment)
    if args.autoscale_interval <= 0 or args.autoscale_window <= 0:
        print(
            "llmplane operator: --autoscale-interval and --autoscale-window must be > 0",
            file=sys.stderr,
        )
        return 2
    autoscale = AutoscaleOptions(
        enabled=not args.no_autoscaler,
        gateway_urls=tuple(args.gateway_url),
        gateway_selector=args.gateway_selector or None,
        gateway_port=args.gateway_port,
        admin_key=os.environ.get("LLMPLANE_GATEWAY_ADMIN_KEY") or None,
        interval=args.autoscale_interval,
        window=args.autoscale_window,
    )
    operator = Operator(options, args.server, args.token, args.resync_seconds, autoscale)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(operator.run(namespaces=args.namespace, liveness=args.liveness or None))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
