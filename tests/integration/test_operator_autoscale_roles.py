"""In-cluster autoscaling of a disaggregated Playground's roles: the real operator and the
real in-cluster gateway against the Kubernetes API EMULATOR (see test_operator_autoscale.py for
the setup and why no real API server), with simulated engines as the role pods: two prefill
engines (``--role prefill``, 512 prompt tokens a step, so long prompts queue) and two decode
engines, at time scale 5; the LeaderWorkerSet controller is played, one pod per replica asked.

The bursts of ``test_up_autoscale_roles.py`` through the gateway's prefill/decode pairs: a
prompt-heavy one queues prompts on the prefill replica, and the operator scales the prefill
role to its maximum while decode stays at one replica (also with prefill on a trigger of prompt
tokens waiting alone, the gateway's count); a decode-heavy one keeps more sequences decoding
than the decode target, and the operator scales decode, not prefill.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import pytest

from llmplane.testing import Process, Processes, eventually, keeps, sim_process
from llmplane.testing.kube_emulator import KubeEmulator, pod
from tests.integration.kube_fleet import free_loopback_prefix, ip
from tests.integration.operator_cluster import LWS, MODEL, SVC, cluster, openmodel
from tests.integration.role_bursts import BURSTS

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def role_engines() -> Iterator[dict[str, list[Process]]]:
    prefix = free_loopback_prefix()

    def engine(host: int, role: str, *extra: str) -> Any:
        address = ("--host", f"{prefix}.{host}", "--port", "8080")
        return sim_process(MODEL, *address, "--role", role, "--time-scale", "5", *extra)

    with Processes() as group:
        started = group.start(
            engine(2, "prefill", "--max-num-batched-tokens", "512"),
            engine(3, "prefill", "--max-num-batched-tokens", "512"),
            engine(4, "decode"),
            engine(5, "decode"),
        )
        yield {"prefill": started[:2], "decode": started[2:]}


def playground(
    elastic: dict[str, Any] | None = None, prefill_trigger: dict[str, Any] | None = None
) -> dict[str, Any]:
    elastic = elastic or {"minReplicas": 1, "maxReplicas": 2}
    prefill = {**elastic, "scaleTrigger": prefill_trigger} if prefill_trigger else elastic
    return {
        "apiVersion": SVC,
        "kind": "Playground",
        "metadata": {"name": MODEL, "namespace": "default"},
        "spec": {
            "modelClaim": {"modelName": MODEL},
            "llmplane": {
                "disaggregation": {
                    "kvConnector": {"type": "nixl"},
                    "prefill": {"replicas": 1, "elasticConfig": prefill},
                    "decode": {"replicas": 1, "elasticConfig": elastic},
                }
            },
        },
    }


class RoleLws:
    """The LeaderWorkerSet controller and kubelet, played for both role workloads: one Ready
    pod per replica each LeaderWorkerSet asks for, on that role's engines, with the labels the
    pod template carries."""

    def __init__(self, kube: KubeEmulator, engines: dict[str, list[Process]]) -> None:
        self.kube, self.engines = kube, engines
        self.highest = {"prefill": 0, "decode": 0}
        self.task = asyncio.create_task(self._run())

    def replicas(self, role: str) -> int:
        lws = self.kube.get(LWS, "LeaderWorkerSet", f"{MODEL}-{role}", "default")
        return int((lws or {}).get("spec", {}).get("replicas", 0))

    async def _run(self) -> None:
        while True:
            for role, engines in self.engines.items():
                name = f"{MODEL}-{role}"
                lws = self.kube.get(LWS, "LeaderWorkerSet", name, "default")
                if lws is None:
                    continue
                want = int(lws["spec"]["replicas"])
                self.highest[role] = max(self.highest[role], want)
                template = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
                labels = {
                    **template["metadata"]["labels"],
                    "leaderworkerset.sigs.k8s.io/name": name,
                    "leaderworkerset.sigs.k8s.io/worker-index": "0",
                }
                for i, engine in enumerate(engines):
                    pod_name = f"{name}-{i}"
                    exists = self.kube.get("v1", "Pod", pod_name, "default") is not None
                    if i < want and not exists:
                        await self.kube.create(pod(pod_name, labels, ip(engine)))
                    elif i >= want and exists:
                        await self.kube.delete("v1", "Pod", pod_name, "default")
            await asyncio.sleep(0.05)  # a controller's resync, not a test wait

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@BURSTS
async def test_a_burst_scales_the_role_it_loads_and_not_the_other(
    role_engines: dict[str, list[Process]],
    burst: Callable[[int], dict[str, Any]],
    clients: int,
    scaled: str,
    metric: str,
    prefill_trigger: dict[str, Any] | None,
) -> None:
    other = "decode" if scaled == "prefill" else "prefill"
    async with cluster([]) as (kube, gateway, _):
        lws = RoleLws(kube, role_engines)
        try:
            await kube.create(openmodel())
            await kube.create(playground(prefill_trigger=prefill_trigger))
            await eventually(
                lambda: len(gateway.registry.states) == 2, 30, what="one pod of each role routed"
            )
            await keeps(
                lambda: (lws.replicas("prefill"), lws.replicas("decode")) == (1, 1),
                1.0,
                what="idle: one replica per role",
            )
            url = f"http://127.0.0.1:{gateway.port}/v1/completions"
            statuses: list[int] = []
            sent = itertools.count()
            stopping = False

            async def client() -> None:
                async with aiohttp.ClientSession() as session:
                    while not stopping:
                        body = {"model": MODEL, **burst(next(sent))}
                        async with session.post(url, json=body) as resp:
                            await resp.read()
                            statuses.append(resp.status)

            tasks = [asyncio.create_task(client()) for _ in range(clients)]
            try:
                await eventually(lambda: lws.replicas(scaled) == 2, 60, what=f"{scaled} scaled up")
                await keeps(lambda: lws.replicas(other) == 1, 3.0, what=f"{other} stays at 1")
            finally:
                stopping = True
                await asyncio.gather(*tasks)
            assert set(statuses) == {200}, statuses
            assert lws.highest[other] == 1
            pg = kube.get(SVC, "Playground", MODEL, "default")
            assert pg["spec"]["llmplane"]["disaggregation"][scaled]["replicas"] == 2
            messages = [
                e["message"]
                for e in kube.list("v1", "Event")
                if e.get("reason") == "SuccessfulRescale"
            ]
            assert any(m.startswith(f"{scaled}: New size: 2") for m in messages), messages
            assert any(metric in m for m in messages), messages
            assert not any(m.startswith(f"{other}:") for m in messages), messages
        finally:
            await lws.close()


async def test_the_pair_scales_to_zero_and_a_request_wakes_both_roles(
    role_engines: dict[str, list[Process]],
) -> None:
    """``minReplicas: 0`` on both roles: idle, the operator stops both; a request is held by
    the gateway (a pair missing a role is not served) until the operator, counting it as demand
    for both roles, has started one replica of each, and is then served on a pair."""
    elastic = {
        "minReplicas": 0,
        "maxReplicas": 2,
        "scaleToZeroAfterSeconds": 2,
        "scaleTrigger": {"hpa": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 1}}}},
    }
    async with cluster([], activator_hold_timeout=60) as (kube, gateway, _):
        lws = RoleLws(kube, role_engines)
        try:
            await kube.create(openmodel())
            await kube.create(playground(elastic))
            await eventually(
                lambda: len(gateway.registry.states) == 2, 30, what="one pod of each role routed"
            )

            def both() -> tuple[int, int]:
                return lws.replicas("prefill"), lws.replicas("decode")

            await eventually(lambda: both() == (0, 0), 30, what="both roles scaled to zero")
            await eventually(lambda: not gateway.registry.states, 30, what="no endpoint left")

            async with aiohttp.ClientSession() as session:
                body = {"model": MODEL, "prompt": "wake up " * 50, "max_tokens": 4}
                url = f"http://127.0.0.1:{gateway.port}/v1/completions"
                async with session.post(url, json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    assert "x-llmplane-prefill-endpoint" in resp.headers
            assert both() == (1, 1)
            messages = [
                e["message"]
                for e in kube.list("v1", "Event")
                if e.get("reason") == "SuccessfulRescale"
            ]
            for role in ("prefill", "decode"):
                assert any(m.startswith(f"{role}: New size: 1") for m in messages), messages
        finally:
            await lws.close()
