"""``llmplane gateway`` without ``--workers`` runs ``auto``: one worker process per core it may
use. Real processes: the default on this machine, and the same command under ``taskset -c 0``
(a CPU affinity of one core, as a systemd ``CPUAffinity=`` or a cpuset gives) runs one process."""

from __future__ import annotations

import sys

import aiohttp
import pytest

from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.gateway.workers.cores import auto_workers
from llmplane.store.paths import open_store
from llmplane.testing import Process, Processes, gateway, sim_process
from tests.integration.multiworker import workers_of

MODEL = "auto-sim"


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    with Processes() as group:
        (sim,) = group.start(sim_process(MODEL, "--time-scale", "0"))
        state = tmp_path_factory.mktemp("state")
        store = open_store(state)
        store.apply(endpoint_object("sim", sim.address, MODEL))
        store.close()
        yield state


async def served(address: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    url = f"http://{address}/v1/chat/completions"
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as resp:
        await resp.read()
        return resp.status


def expected_children(workers: int) -> int:
    """A supervisor forks ``workers`` children; one worker is the process itself."""
    return workers if workers > 1 else 0


async def test_default_runs_one_worker_per_usable_core(state):
    with Processes() as group:
        (gw,) = group.start(gateway("--log-level", "WARNING", state_dir=state))
        assert len(workers_of(gw.pid)) == expected_children(auto_workers()), gw.output()
        assert await served(gw.address) == 200


async def test_cpu_affinity_bounds_auto(state):
    argv = [
        *("taskset", "-c", "0"),
        *(sys.executable, "-m", "llmplane.cli", "gateway", "--port", "0"),
        *("--state-dir", str(state), "--log-level", "WARNING"),
    ]
    with Processes() as group:
        (gw,) = group.start(Process(argv, name="gateway on one core"))
        assert workers_of(gw.pid) == set(), gw.output()
        assert await served(gw.address) == 200
