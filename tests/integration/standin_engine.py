"""The stand-in upstream (``llmplane.testing.upstream``) as an engine under the local runtime: its
plan, and a GET to what it serves."""

from __future__ import annotations

import sys

import aiohttp

from llmplane.controlplane.plan import (
    MODEL_NAME_LABEL,
    HttpProbe,
    LocalLaunch,
    WorkloadPlan,
)

STANDIN = [sys.executable, "-m", "llmplane.testing.upstream"]


def engine_plan(
    *engine_args: str,
    replicas: int = 1,
    name: str = "chat",
    env: dict[str, str] | None = None,
    argv: list[str] | None = None,
    readiness: HttpProbe | None = None,
    startup: HttpProbe | None = None,
    liveness: HttpProbe | None = None,
    health_path: str | None = None,
    grace: int = 30,
) -> WorkloadPlan:
    """A plan running the stand-in engine, probed like a real one on container port 8080."""
    if readiness is None:
        readiness = HttpProbe(path="/health", port=8080, period_seconds=1, failure_threshold=1)
    return WorkloadPlan(
        namespace="default",
        name=name,
        replicas=replicas,
        model_name="fake-model",
        backend="fake",
        image="example/fake:1",
        command=[],
        args=[],
        env=env or {},
        labels={MODEL_NAME_LABEL: "fake-model"},
        readiness_probe=readiness,
        startup_probe=startup,
        liveness_probe=liveness,
        local=LocalLaunch(
            argv=argv
            or [*STANDIN, "--port", "8080", "--host", "0.0.0.0", "--model", "fake", *engine_args],
            install_hint="pip install fake-engine",
            health_path=health_path,
        ),
        termination_grace_seconds=grace,
    )


async def get(address: str, path: str, timeout: float = 5.0) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{address}{path}", timeout=aiohttp.ClientTimeout(total=timeout)) as r,
    ):
        return r.status, await r.text()
