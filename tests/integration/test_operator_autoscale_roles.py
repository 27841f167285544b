"""In-cluster autoscaling of a disaggregated Playground's roles: the real operator and the
real in-cluster gateway against the Kubernetes API EMULATOR (see test_operator_autoscale.py for
the setup and why no real API server), with simulated engines as the role pods: two prefill
engines (``--role prefill``, one sequence at a time, so prompts queue) and one decode engine.

A prompt-heavy burst (long prompts, two-token answers) through the gateway's prefill/decode
pairs queues prompts on the prefill replica: the operator scales the prefill role to its
maximum and leaves decode at one replica.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from llmplane.testing import Process, Processes, eventually, keeps, sim_process
from llmplane.testing.kube_emulator import KubeEmulator, pod
from tests.integration.kube_fleet import free_loopback_prefix, ip
from tests.integration.operator_cluster import LWS, MODEL, SVC, cluster, openmodel

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def role_engines() -> Iterator[dict[str, list[Process]]]:
    prefix = free_loopback_prefix()

    def engine(host: int, role: str, *extra: str) -> Any:
        address = ("--host", f"{prefix}.{host}", "--port", "8080")
        return sim_process(MODEL, *address, "--role", role, "--time-scale", "5", *extra)

    with Processes() as group:
        started = group.start(
            engine(2, "prefill", "--max-num-seqs", "1"),
            engine(3, "prefill", "--max-num-seqs", "1"),
            engine(4, "decode"),
        )
        yield {"prefill": started[:2], "decode": started[2:]}


def playground() -> dict[str, Any]:
    elastic = {"minReplicas": 1, "maxReplicas": 2}
    return {
        "apiVersion": SVC,
        "kind": "Playground",
        "metadata": {"name": MODEL, "namespace": "default"},
        "spec": {
            "modelClaim": {"modelName": MODEL},
            "llmplane": {
                "disaggregation": {
                    "kvConnector": {"type": "nixl"},
                    "prefill": {"replicas": 1, "elasticConfig": elastic},
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


async def test_a_prompt_heavy_burst_scales_prefill_not_decode(
    role_engines: dict[str, list[Process]],
) -> None:
    async with cluster([]) as (kube, gateway, _):
        lws = RoleLws(kube, role_engines)
        try:
            await kube.create(openmodel())
            await kube.create(playground())
            await eventually(
                lambda: len(gateway.registry.states) == 2, 30, what="one pod of each role routed"
            )
            await keeps(
                lambda: (lws.replicas("prefill"), lws.replicas("decode")) == (1, 1),
                1.0,
                what="idle: one replica per role",
            )
            prompt = "a long prompt that takes a while to prefill " * 120
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
            url = f"http://127.0.0.1:{gateway.port}/v1/completions"
            statuses: list[int] = []
            stopping = False

            async def client() -> None:
                async with aiohttp.ClientSession() as session:
                    while not stopping:
                        async with session.post(url, json=body) as resp:
                            await resp.read()
                            statuses.append(resp.status)

            tasks = [asyncio.create_task(client()) for _ in range(8)]
            try:
                await eventually(lambda: lws.replicas("prefill") == 2, 60, what="prefill scaled up")
                await keeps(lambda: lws.replicas("decode") == 1, 2.0, what="decode stays at 1")
            finally:
                stopping = True
                await asyncio.gather(*tasks)
            assert set(statuses) == {200}, statuses
            assert lws.highest["decode"] == 1
            pg = kube.get(SVC, "Playground", MODEL, "default")
            assert pg["spec"]["llmplane"]["disaggregation"]["prefill"]["replicas"] == 2
            messages = [
                e["message"]
                for e in kube.list("v1", "Event")
                if e.get("reason") == "SuccessfulRescale"
            ]
            assert any(m.startswith("prefill: New size: 2") for m in messages), messages
            assert any("vllm:num_requests_waiting" in m for m in messages), messages
        finally:
            await lws.close()
