"""An InferenceObjective's integer priority decides who waits under overload, as a Tenant's
criticality does (tests/integration/test_gateway_flowcontrol.py): a real sim that saturates
at once behind a v1 InferencePool, an InferenceModelRewrite routing the model to the pool, two
objectives; requests name theirs in ``x-llm-d-inference-objective``. Swapping the two
priorities swaps which requests are served first."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.gateway.server import Gateway
from llmplane.testing import eventually
from tests.integration.flowcontrol_gateway import queued, release, sample, saturate

MODEL = "m"
LABELS = {"app": "pool"}


def objective(name: str, priority: int) -> dict[str, Any]:
    return {
        "apiVersion": "llm-d.ai/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"priority": priority, "poolRef": {"name": "pool"}},
    }


async def start(gateways, store, processes, priorities: dict[str, int]) -> Gateway:
    sim = processes.sim(MODEL, "--max-num-seqs", "1")
    store.apply(endpoint_object("sim", sim.address, MODEL, labels=LABELS))
    store.apply(
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "pool", "namespace": "default"},
            "spec": {"selector": {"matchLabels": LABELS}, "targetPorts": [{"number": 8000}]},
        }
    )
    store.apply(
        {
            "apiVersion": "llm-d.ai/v1alpha2",
            "kind": "InferenceModelRewrite",
            "metadata": {"name": "to-pool", "namespace": "default"},
            "spec": {
                "poolRef": {"name": "pool"},
                "rules": [{"matches": [{"model": {"value": MODEL}}]}],
            },
        }
    )
    for name, priority in priorities.items():
        store.apply(objective(name, priority))
    gw: Gateway = await gateways(store, config=GatewayConfig(saturation_queue=0))
    await eventually(
        lambda: (
            gw.registry.states
            and all(s.has_load_metrics for s in gw.registry.states.values())
            and len(gw.table.objectives) == len(priorities)
        ),
        what="the sim scraped and the objectives loaded",
    )
    return gw


async def complete(
    client: aiohttp.ClientSession, gw: Gateway, objective_name: str | None, tokens: int
) -> tuple[int, bytes, float]:
    headers = {"x-llm-d-inference-objective": objective_name} if objective_name else {}
    async with client.post(
        f"http://127.0.0.1:{gw.port}/v1/completions",
        json={"model": MODEL, "prompt": f"hello {objective_name}", "max_tokens": tokens},
        headers=headers,
    ) as r:
        return r.status, await r.read(), time.monotonic()


async def served_first(gateways, store, processes, client, priorities: dict[str, int]) -> str:
    """Queue 3 requests of ``first`` then 3 of ``second`` behind saturating fillers; which
    objective's requests all finished before any of the other's."""
    gw = await start(gateways, store, processes, priorities)
    fillers = await saturate(client, gw, "", 60.0)
    first, second = list(priorities)
    band = {name: f"priority:{p}" for name, p in priorities.items()}
    early = [asyncio.create_task(complete(client, gw, first, 5)) for _ in range(3)]
    await eventually(
        lambda: sum(n for (b, _), n in queued(gw).items() if b == band[first]) == 3,
        what=f"3 of {first} queued",
    )
    late = [asyncio.create_task(complete(client, gw, second, 5)) for _ in range(3)]
    await eventually(
        lambda: sum(n for (b, _), n in queued(gw).items() if b == band[second]) == 3,
        what=f"3 of {second} queued",
    )
    await release(fillers)
    early_done, late_done = await asyncio.gather(*early), await asyncio.gather(*late)
    assert [r[0] for r in early_done + late_done] == [200] * 6, early_done + late_done
    for name in priorities:
        assert sample(gw, "llmplane_gateway_flow_wait_seconds_count", band=band[name]) == 3
    if max(r[2] for r in late_done) < min(r[2] for r in early_done):
        return second
    assert max(r[2] for r in early_done) < min(r[2] for r in late_done), "interleaved"
    return first


async def test_higher_priority_objective_is_served_first(gateways, store, processes, client):
    # Queued after the other objective's requests, served before every one of them.
    assert (
        await served_first(gateways, store, processes, client, {"bulk": 2, "urgent": 7}) == "urgent"
    )


async def test_swapped_priorities_swap_who_waits(gateways, store, processes, client):
    assert (
        await served_first(gateways, store, processes, client, {"bulk": 7, "urgent": -3}) == "bulk"
    )
