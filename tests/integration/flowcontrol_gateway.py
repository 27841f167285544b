"""A gateway with flow control in front of one real sim that saturates at once, Tenants with real
keys: starting it, what to send it, and what its /metrics say of the queue."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.gateway.proxy import ENDPOINT_HEADER
from llmplane.gateway.server import Gateway
from llmplane.keys import create_key
from llmplane.testing import eventually

MODEL = "m"


TOKEN_TIME = 0.0067  # the sim's seconds per output token at --time-scale 1, one sequence


def tenant(name: str, criticality: str = "Default", weight: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "llmplane.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"criticality": criticality, "weight": weight},
    }


async def start(gateways, store, sim, tenants: dict[str, str], **config: Any):
    """A gateway over the one sim with these tenants (name -> criticality); their keys."""
    store.apply(endpoint_object("sim", sim.address, MODEL, engine="vllm"))
    keys = {}
    for name, criticality in tenants.items():
        store.apply(tenant(name, criticality))
        keys[name] = create_key(store, name)[0].key
    config.setdefault("saturation_queue", 0)
    gw: Gateway = await gateways(store, config=GatewayConfig(**config))
    await eventually(
        lambda: (
            gw.auth.table.tenants == len(tenants)
            and all(s.has_load_metrics for s in gw.registry.states.values())
            and gw.registry.states
        ),
        what="tenants loaded and the sim scraped",
    )
    return gw, keys


async def complete(
    client: aiohttp.ClientSession, gw: Gateway, key: str, tokens: int, tag: str = ""
) -> tuple[int, Any, bytes, float]:
    """POST a completion; (status, headers, body, monotonic time it ended)."""
    async with client.post(
        f"http://127.0.0.1:{gw.port}/v1/completions",
        json={"model": MODEL, "prompt": f"hello {tag}", "max_tokens": tokens},
        headers={"Authorization": f"Bearer {key}"},
    ) as r:
        body = await r.read()
        return r.status, r.headers, body, time.monotonic()


def queued(gw: Gateway) -> dict[tuple[str, str], float]:
    """``llmplane_gateway_flow_queue`` as /metrics renders it: (band, tenant) -> waiting."""
    text = gw.metrics.render().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name == "llmplane_gateway_flow_queue":
            for sample in family.samples:
                out[(sample.labels["band"], sample.labels["tenant"])] = sample.value
    return out


def sample(gw: Gateway, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(gw.metrics.render().decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


async def saturate(client, gw, key: str, seconds: float) -> list[asyncio.Task]:
    """Two long requests: one running in the sim, one waiting in its queue (saturated)."""
    tokens = int(seconds / TOKEN_TIME)
    fillers = [asyncio.create_task(complete(client, gw, key, tokens, "filler")) for _ in range(2)]
    state = next(iter(gw.registry.states.values()))
    await eventually(lambda: state.inflight == 2, what="both fillers sent to the sim")
    return fillers


async def release(fillers: list[asyncio.Task]) -> None:
    """End the fillers now (their clients hang up; the sim aborts them), so what waits in the
    gateway is dispatched when the test has set it up, however slow the machine, rather than
    when fillers of a fixed length happen to finish."""
    for task in fillers:
        task.cancel()
    await asyncio.gather(*fillers, return_exceptions=True)


async def stream(
    client: aiohttp.ClientSession,
    gw: Gateway,
    key: str,
    prompt: str,
    tokens: int,
    first: asyncio.Event | None = None,
) -> tuple[int, int, float, str]:
    """POST a streamed completion; (status, chunks with a choice, monotonic time it ended, the
    endpoint that served it). Sets ``first`` at its first line."""
    chunks = 0
    async with client.post(
        f"http://127.0.0.1:{gw.port}/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": tokens, "stream": True},
        headers={"Authorization": f"Bearer {key}"},
    ) as r:
        async for line in r.content:
            if first is not None:
                first.set()
            chunks += line.startswith(b"data: {")
        return r.status, chunks, time.monotonic(), r.headers.get(ENDPOINT_HEADER, "")


def held(gw: Gateway) -> float:
    """Requests that waited in the flow-control queue so far (every band and tenant)."""
    total = 0.0
    for family in text_string_to_metric_families(gw.metrics.render().decode()):
        for s in family.samples:
            if s.name == "llmplane_gateway_flow_wait_seconds_count":
                total += s.value
    return total
