"""Engine-side priority (``gateway/flowcontrol/priority.py``): ``llmplane gateway`` (a real
process) adds ``priority`` to what it sends an endpoint whose engine orders its queue by it
(``schedulingPolicy: priority``), from the request's band and its tenant's share, and relays
the client's bytes untouched to every other endpoint.

The bytes are read back from the stand-in engine (``llmplane/testing/upstream.py`` reports the
last body it served); the ordering from the real simulated engine (``llmplane.sim
--scheduling-policy priority``): a Critical request sent after queued Default ones reaches
the engine's batch first.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request

import aiohttp
import orjson
import pytest

from llmplane.gateway import apikeys
from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.store.paths import open_store
from llmplane.testing import Processes, gateway, sim_process, upstream_process, wait_for

PRIO, FCFS = "prio-model", "fcfs-model"


def tenant(name: str, criticality: str) -> tuple[dict, str]:
    made = apikeys.new_key()
    obj = {
        "apiVersion": "llmplane.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "criticality": criticality,
            "keys": [{"id": made.id, "salt": made.salt, "hash": made.hash}],
        },
    }
    return obj, made.key


def post(url: str, key: str, body: bytes) -> int:
    req = urllib.request.Request(
        url, body, {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def engine_body(address: str) -> bytes:
    with urllib.request.urlopen(f"http://{address}/admin", timeout=10) as resp:
        return orjson.loads(resp.read())["last_body"].encode()


def test_priority_goes_only_to_priority_engines_and_overrides_the_clients(tmp_path) -> None:
    with Processes() as group:
        prio, fcfs = group.start(upstream_process(PRIO), upstream_process(FCFS))
        crit, crit_key = tenant("crit", "Critical")
        bulk, bulk_key = tenant("bulk", "Sheddable")
        state = tmp_path / "state"
        with open_store(state) as store:
            store.apply(endpoint_object("p", prio.address, PRIO, scheduling_policy="priority"))
            store.apply(endpoint_object("f", fcfs.address, FCFS, scheduling_policy="fcfs"))
            store.apply(crit)
            store.apply(bulk)
        (gw,) = group.start(gateway("--workers", "1", "--log-level", "WARNING", state_dir=state))
        url = f"http://{gw.address}/v1/completions"

        def body(model: str, extra: str = "") -> bytes:
            return b'{"model": "%s", "prompt": "hi",%s "max_tokens": 2}\n' % (
                model.encode(),
                extra.encode(),
            )

        wait_for(lambda: post(url, bulk_key, body(PRIO)) == 200, 30, what="the gateway serving")
        for _ in range(2):
            assert post(url, bulk_key, body(PRIO)) == 200
        sent = body(PRIO)
        assert post(url, crit_key, sent) == 200
        seen = engine_body(prio.address)
        # The client's bytes, with the band's priority as the last member (Critical, its
        # tenant never served before: under its share).
        assert seen == sent.rstrip()[:-1] + b',"priority":-2}', seen
        # A client's own priority is overridden (the last of duplicate keys wins); bulk had 3
        # or more of the recent dispatches, crit 1: Sheddable, over its share.
        sent = body(PRIO, ' "priority": -100,')
        assert post(url, bulk_key, sent) == 200
        seen = engine_body(prio.address)
        assert seen.endswith(b',"priority":3}') and orjson.loads(seen)["priority"] == 3, seen
        # An fcfs engine gets the client's bytes exactly, its priority field included.
        for key in (crit_key, bulk_key):
            sent = body(FCFS, ' "priority": 7,')
            assert post(url, key, sent) == 200
            assert engine_body(fcfs.address) == sent


def sim_metric(address: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return sum(float(v) for v in found)


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_a_critical_request_overtakes_queued_default_ones_on_a_priority_engine(
    tmp_path, policy: str
) -> None:
    """One sequence at a time; a long request runs while three Default requests and then a
    Critical one queue in the engine (flow control off: nothing waits in the gateway); the
    long one is cancelled and the queue drains. Under fcfs (the control) the Critical request
    goes last, under priority first."""
    with Processes() as group:
        (sim,) = group.start(
            sim_process(PRIO, "--max-num-seqs", "1", "--scheduling-policy", policy)
        )
        crit, crit_key = tenant("crit", "Critical")
        dflt, dflt_key = tenant("dflt", "Default")
        state = tmp_path / "state"
        with open_store(state) as store:
            store.apply(endpoint_object("s", sim.address, PRIO, scheduling_policy=policy))
            store.apply(crit)
            store.apply(dflt)
        (gw,) = group.start(
            gateway(
                "--workers", "1", "--log-level", "WARNING", "--no-flow-control",
                state_dir=state,
            )
        )  # fmt: skip
        url = f"http://{gw.address}/v1/completions"
        one = b'{"model": "%s", "prompt": "a b c d", "max_tokens": 1}' % PRIO.encode()
        wait_for(lambda: post(url, dflt_key, one) == 200, 30, what="the gateway serving")
        order = asyncio.run(drain_order(url, sim.address, crit_key, dflt_key))
        expected = (
            ["crit", "d0", "d1", "d2"] if policy == "priority" else ["d0", "d1", "d2", "crit"]
        )
        assert order == expected


async def drain_order(url: str, sim: str, crit_key: str, dflt_key: str) -> list[str]:
    done: list[str] = []

    async def send(session: aiohttp.ClientSession, name: str, key: str, tokens: int) -> None:
        body = {"model": PRIO, "prompt": f"prompt of {name}", "max_tokens": tokens,
                "ignore_eos": True, "stream": True}  # fmt: skip
        async with session.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status == 200, await r.text()
            async for _ in r.content:
                pass
        done.append(name)

    def waiting(n: int) -> bool:
        return sim_metric(sim, "vllm:num_requests_waiting") == n

    async def until(what: str, check) -> None:
        for _ in range(300):
            if await asyncio.to_thread(check):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    async with aiohttp.ClientSession() as session:
        long = asyncio.create_task(send(session, "long", dflt_key, 100_000))
        await until(
            "the long request running", lambda: sim_metric(sim, "vllm:num_requests_running") == 1
        )
        tasks = []
        for i, (name, key) in enumerate(
            [("d0", dflt_key), ("d1", dflt_key), ("d2", dflt_key), ("crit", crit_key)]
        ):
            tasks.append(asyncio.create_task(send(session, name, key, 1)))
            await until(f"{i + 1} waiting", lambda n=i + 1: waiting(n))
        long.cancel()
        await asyncio.gather(*tasks)
    return done
