"""The real operator (kopf + kubernetes_asyncio, ``llmplane.operator.main.Operator``) against a
Kubernetes API EMULATOR, not a Kubernetes API server.

The emulator is ``llmplane.testing.kube_emulator.KubeEmulator``, a minimal in-process aiohttp
implementation of the REST endpoints the operator uses (discovery, list/watch, get, server-side
apply, merge patch, status subresource, delete with garbage collection by ownerReferences).
PyPI ``kmock`` was evaluated and is unusable here: its emulator merges dicts and has no
server-side apply, resourceVersion/generation, status subresource, label selectors or GC (see
the emulator's docstring). Nothing here runs pods: the test plays the LeaderWorkerSet
controller by writing the workload's status. A real cluster run is ``deploy/kind/e2e.sh``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmplane.api.documents import dump_resource, parse_paths
from llmplane.operator.main import Operator
from llmplane.render import builtin_backend_models
from llmplane.runtime.kube import KubeOptions
from llmplane.testing import eventually, keeps
from llmplane.testing.kube_emulator import KubeEmulator

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SVC = "inference.llmaz.io/v1alpha1"
LWS = "leaderworkerset.x-k8s.io/v1"
LLMD = "llm-d.ai/v1alpha2"


def _wire(path: Path) -> list[dict[str, Any]]:
    docs = []
    for resource in parse_paths([path]).resources:
        doc = dump_resource(resource)
        doc.pop("status", None)
        docs.append(doc)
    return docs


@contextlib.asynccontextmanager
async def running(
    options: KubeOptions | None = None, resync: float = 3600.0
) -> AsyncIterator[tuple[KubeEmulator, Operator]]:
    async with KubeEmulator() as kube:
        for backend in builtin_backend_models():
            doc = dump_resource(backend)
            doc.pop("status", None)
            await kube.create(doc)
        operator = Operator(options or KubeOptions(), server=kube.url, resync_seconds=resync)
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(operator.run(stop_flag=stop, ready_flag=ready))
        try:
            await asyncio.wait_for(ready.wait(), 20)
            yield kube, operator
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 20)


def _cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return None


async def _lws_ready(kube: KubeEmulator, name: str, replicas: int) -> None:
    """Play the LeaderWorkerSet controller: the group is up."""
    await kube.patch_status(
        LWS,
        "LeaderWorkerSet",
        name,
        "default",
        {
            "replicas": replicas,
            "readyReplicas": replicas,
            "hpaPodSelector": f"leaderworkerset.sigs.k8s.io/name={name}",
            "conditions": [
                {
                    "type": "Available",
                    "status": "True",
                    "reason": "AllGroupsReady",
                    "message": "All replicas are ready",
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                }
            ],
        },
    )


async def test_playground_to_ready_update_and_garbage_collection() -> None:
    async with running() as (kube, _):
        for doc in _wire(EXAMPLES / "opt-125m.yaml"):
            await kube.create(doc)

        # Playground -> Service (owned) -> LeaderWorkerSet + opt-125m-lb (owned by the Service).
        lws = await kube.wait_for(lambda: kube.get(LWS, "LeaderWorkerSet", "opt-125m", "default"))
        pg = kube.get(SVC, "Playground", "opt-125m", "default")
        svc = kube.get(SVC, "Service", "opt-125m", "default")
        lb = await kube.wait_for(lambda: kube.get("v1", "Service", "opt-125m-lb", "default"))
        assert svc["metadata"]["ownerReferences"] == [
            {
                "apiVersion": SVC,
                "kind": "Playground",
                "name": "opt-125m",
                "uid": pg["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        for child in (lws, lb):
            [ref] = child["metadata"]["ownerReferences"]
            assert (ref["kind"], ref["uid"]) == ("Service", svc["metadata"]["uid"])
        assert lws["spec"]["startupPolicy"] == "LeaderReady"
        assert lws["spec"]["replicas"] == 1
        pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        assert pod["spec"]["initContainers"][0]["name"] == "model-loader"

        # Pending while the workload is not available.
        await kube.wait_for(
            lambda: (
                (_cond(kube.get(SVC, "Service", "opt-125m", "default"), "Progressing") or {}).get(
                    "reason"
                )
                == "ServiceInProgress"
            )
        )
        pending = await kube.wait_for(
            lambda: _cond(kube.get(SVC, "Playground", "opt-125m", "default"), "Progressing")
        )
        assert (pending["status"], pending["reason"]) == ("True", "Pending")
        assert pending["observedGeneration"] == 1

        # The LeaderWorkerSet becomes available: Service then Playground report it.
        await _lws_ready(kube, "opt-125m", 1)
        available = await kube.wait_for(
            lambda: _cond(kube.get(SVC, "Playground", "opt-125m", "default"), "Available")
        )
        assert (available["status"], available["reason"]) == ("True", "PlaygroundReady")
        assert available["observedGeneration"] == 1
        svc = kube.get(SVC, "Service", "opt-125m", "default")
        assert _cond(svc, "Available")["reason"] == "ServiceReady"
        assert svc["status"]["replicas"] == 1
        assert svc["status"]["selector"] == "leaderworkerset.sigs.k8s.io/name=opt-125m"
        pg = kube.get(SVC, "Playground", "opt-125m", "default")
        assert pg["status"]["replicas"] == 1
        assert pg["status"]["selector"] == "leaderworkerset.sigs.k8s.io/name=opt-125m"

        # Spec change: replicas and args flow down to the LeaderWorkerSet.
        await kube.patch(
            SVC,
            "Playground",
            "opt-125m",
            "default",
            {
                "spec": {
                    "replicas": 3,
                    "backendRuntimeConfig": {"args": ["--max-model-len", "2048"]},
                }
            },
        )

        def updated() -> dict[str, Any] | None:
            obj = kube.get(LWS, "LeaderWorkerSet", "opt-125m", "default")
            return obj if obj and obj["spec"]["replicas"] == 3 else None

        lws = await kube.wait_for(updated)
        runner = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
        args = runner["args"]  # (the KV-events flag the operator adds follows the user's args)
        assert args[args.index("--max-model-len") + 1] == "2048"
        assert lws["metadata"]["generation"] == 2
        # The new generation is observed on the Playground's conditions.
        await kube.wait_for(
            lambda: (
                (_cond(kube.get(SVC, "Playground", "opt-125m", "default"), "Available") or {}).get(
                    "observedGeneration"
                )
                == 2
            )
        )

        # Deleting the Playground takes everything it created with it.
        await kube.delete(SVC, "Playground", "opt-125m", "default")
        for api, kind, name in (
            (SVC, "Service", "opt-125m"),
            (LWS, "LeaderWorkerSet", "opt-125m"),
            ("v1", "Service", "opt-125m-lb"),
        ):
            assert kube.get(api, kind, name, "default") is None


async def test_reconcile_is_idempotent() -> None:
    async with running() as (kube, operator):
        for doc in _wire(EXAMPLES / "opt-125m.yaml"):
            await kube.create(doc)
        await _wait_settled(kube)
        versions = _versions(kube)
        writes = len(kube.events)
        await operator.resync_once()
        await operator.resync_once()
        await keeps(  # nor anything that follows from them
            lambda: _versions(kube) == versions and len(kube.events) == writes,
            0.3,
            what="no write after the resyncs",
        )


async def test_drift_on_the_workload_is_repaired() -> None:
    async with running() as (kube, _):
        for doc in _wire(EXAMPLES / "opt-125m.yaml"):
            await kube.create(doc)
        await _wait_settled(kube)
        # Someone scales the LeaderWorkerSet by hand; the event alone brings it back.
        await kube.patch(LWS, "LeaderWorkerSet", "opt-125m", "default", {"spec": {"replicas": 7}})
        await kube.wait_for(
            lambda: kube.get(LWS, "LeaderWorkerSet", "opt-125m", "default")["spec"]["replicas"] == 1
        )


async def test_hpa_follows_elastic_config() -> None:
    text = (
        (EXAMPLES / "opt-125m.yaml")
        .read_text()
        .replace(
            "    maxReplicas: 3\n",
            "    maxReplicas: 3\n    scaleTrigger:\n      hpa:\n        metrics:\n"
            "          - type: Resource\n            resource: {name: cpu, target: {type: Utilization, averageUtilization: 70}}\n",
        )
    )
    docs = [d for d in yaml.safe_load_all(text) if d]
    async with running() as (kube, _):
        for doc in docs:
            await kube.create(doc)
        hpa = await kube.wait_for(
            lambda: kube.get("autoscaling/v2", "HorizontalPodAutoscaler", "opt-125m", "default")
        )
        assert hpa["spec"]["scaleTargetRef"]["kind"] == "Playground"
        assert hpa["spec"]["maxReplicas"] == 3
        assert hpa["metadata"]["ownerReferences"][0]["kind"] == "Playground"
        # Removing elasticConfig removes the HPA.
        await kube.patch(
            SVC, "Playground", "opt-125m", "default", {"spec": {"elasticConfig": None}}
        )
        await kube.wait_for(
            lambda: (
                kube.get("autoscaling/v2", "HorizontalPodAutoscaler", "opt-125m", "default") is None
            )
        )


async def test_missing_model_aborts_then_recovers() -> None:
    docs = _wire(EXAMPLES / "opt-125m.yaml")
    model = next(d for d in docs if d["kind"] == "OpenModel")
    playground = next(d for d in docs if d["kind"] == "Playground")
    async with running() as (kube, _):
        await kube.create(playground)
        aborted = await kube.wait_for(
            lambda: _cond(kube.get(SVC, "Playground", "opt-125m", "default"), "Progressing")
        )
        assert (aborted["status"], aborted["reason"]) == ("False", "AbortProcessing")
        assert "Waiting for model creation" in aborted["message"]
        assert kube.get(SVC, "Service", "opt-125m", "default") is None
        await kube.create(model)  # the OpenModel event re-plans the Playground
        await kube.wait_for(lambda: kube.get(LWS, "LeaderWorkerSet", "opt-125m", "default"))
        progressing = await kube.wait_for(
            lambda: (
                (c := _cond(kube.get(SVC, "Playground", "opt-125m", "default"), "Progressing"))
                and c["status"] == "True"
                and c
            )
        )
        assert progressing["reason"] == "Pending"


async def test_service_with_the_playground_name_is_not_taken_over() -> None:
    docs = _wire(EXAMPLES / "opt-125m.yaml")
    async with running() as (kube, _):
        [service] = _wire(EXAMPLES / "service.yaml")
        service["metadata"]["name"] = "opt-125m"
        for doc in [*docs[:1], service]:
            await kube.create(doc)
        await kube.wait_for(lambda: kube.get(LWS, "LeaderWorkerSet", "opt-125m", "default"))
        await kube.create(docs[1])
        aborted = await kube.wait_for(
            lambda: _cond(kube.get(SVC, "Playground", "opt-125m", "default"), "Progressing")
        )
        assert aborted["reason"] == "AbortProcessing"
        assert "existing Service" in aborted["message"]
        assert "ownerReferences" not in kube.get(SVC, "Service", "opt-125m", "default")["metadata"]


async def test_deployment_mode_and_multi_host_lws() -> None:
    async with running(KubeOptions(use_leader_worker_set=False)) as (kube, _):
        for doc in _wire(EXAMPLES / "opt-125m.yaml"):
            await kube.create(doc)
        deployment = await kube.wait_for(
            lambda: kube.get("apps/v1", "Deployment", "opt-125m", "default")
        )
        assert deployment["spec"]["selector"]["matchLabels"] == {
            "inference.llmaz.io/service-name": "opt-125m"
        }
        await kube.patch_status(
            "apps/v1",
            "Deployment",
            "opt-125m",
            "default",
            {
                "replicas": 1,
                "readyReplicas": 1,
                "availableReplicas": 1,
                "conditions": [{"type": "Available", "status": "True"}],
            },
        )
        await kube.wait_for(
            lambda: (
                (_cond(kube.get(SVC, "Playground", "opt-125m", "default"), "Available") or {}).get(
                    "status"
                )
                == "True"
            )
        )
    async with running() as (kube, _):
        for doc in _wire(EXAMPLES / "llama3-405b.yaml"):
            await kube.create(doc)
        lws = await kube.wait_for(
            lambda: kube.get(LWS, "LeaderWorkerSet", "llama3-405b-instruct", "default")
        )
        assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert "leaderTemplate" in lws["spec"]["leaderWorkerTemplate"]


def _versions(kube: KubeEmulator) -> dict[Any, str]:
    return {k: s.obj["metadata"]["resourceVersion"] for k, s in kube.objects.items()}


async def _wait_settled(kube: KubeEmulator, quiet: float = 0.5) -> None:
    """Until the operator's LeaderWorkerSet exists and then ``quiet`` seconds pass without a
    write."""
    await kube.wait_for(lambda: kube.get(LWS, "LeaderWorkerSet", "opt-125m", "default"))

    async def quiet_period() -> bool:
        before = len(kube.events)
        await asyncio.sleep(quiet)
        return len(kube.events) == before

    await eventually(quiet_period, 30, every=0, what="the operator to stop writing")


async def test_disaggregated_playground_runs_roles_scaled_apart() -> None:
    async with running() as (kube, _):
        for doc in _wire(EXAMPLES / "disaggregated-vllm.yaml"):
            await kube.create(doc)
        name = "qwen2-5-0-5b"
        prefill = await kube.wait_for(
            lambda: kube.get(LWS, "LeaderWorkerSet", f"{name}-prefill", "default")
        )
        decode = await kube.wait_for(
            lambda: kube.get(LWS, "LeaderWorkerSet", f"{name}-decode", "default")
        )
        for lws, role in ((prefill, "prefill"), (decode, "decode")):
            labels = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
            assert labels["llmplane.io/role"] == role
        assert kube.get(SVC, "Service", name, "default") is None  # no Service of its own name

        # Only prefill is up: the Playground says decode is what it waits for.
        await _lws_ready(kube, f"{name}-prefill", 1)

        def waiting_on_decode() -> bool:
            available = _cond(kube.get(SVC, "Playground", name, "default"), "Available") or {}
            message = available.get("message", "")
            return available.get("status") == "False" and message.startswith("decode not ready")

        await kube.wait_for(waiting_on_decode)
        await _lws_ready(kube, f"{name}-decode", 1)
        available = await kube.wait_for(
            lambda: (
                (c := _cond(kube.get(SVC, "Playground", name, "default"), "Available"))
                and c["status"] == "True"
                and c
            )
        )
        assert available["reason"] == "PlaygroundReady"
        assert kube.get(SVC, "Playground", name, "default")["status"]["readyReplicas"] == 2

        # Scaling one role changes only its workload.
        await kube.patch(
            SVC,
            "Playground",
            name,
            "default",
            {"spec": {"llmplane": {"disaggregation": {"prefill": {"replicas": 3}}}}},
        )

        def scaled() -> bool:
            obj = kube.get(LWS, "LeaderWorkerSet", f"{name}-prefill", "default")
            return bool(obj and obj["spec"]["replicas"] == 3)

        await kube.wait_for(scaled)
        decode = kube.get(LWS, "LeaderWorkerSet", f"{name}-decode", "default")
        assert decode["spec"]["replicas"] == 1 and decode["metadata"]["generation"] == 1

        # Back to one workload: the Playground's own Service replaces the role Services.
        await kube.patch(SVC, "Playground", name, "default", {"spec": {"llmplane": None}})
        await kube.wait_for(lambda: kube.get(SVC, "Service", name, "default"))
        await kube.wait_for(
            lambda: all(
                kube.get(SVC, "Service", f"{name}-{role}", "default") is None
                for role in ("prefill", "decode")
            )
        )


async def test_objectives_and_rewrites_are_accepted_when_their_pool_exists() -> None:
    """The published examples (examples/gie-v1): the objectives and rewrites name a v1 pool
    that exists (Accepted True); one naming a missing pool is Unknown/Pending until the pool
    appears, here in the v1alpha2 group."""
    async with running() as (kube, _):
        for path in sorted((EXAMPLES / "gie-v1").glob("*.yaml")):
            for doc in _wire(path):
                await kube.create(doc)
        orphan = {
            "apiVersion": "llm-d.ai/v1alpha2",
            "kind": "InferenceObjective",
            "metadata": {"name": "orphan", "namespace": "default"},
            "spec": {"priority": -1, "poolRef": {"name": "later"}},
        }
        await kube.create(orphan)

        def accepted(kind: str, name: str) -> str | None:
            c = _cond(kube.get(LLMD, kind, name, "default"), "Accepted")
            return c and c["status"]

        await eventually(
            lambda: (
                accepted("InferenceObjective", "base-model") == "True"
                and accepted("InferenceModelRewrite", "small-segment-lora-alias") == "True"
                and accepted("InferenceModelRewrite", "generic-fallback") == "True"
                and accepted("InferenceObjective", "orphan") == "Unknown"
            ),
            what="objectives and rewrites of the existing pool accepted, the orphan pending",
        )
        assert (
            _cond(kube.get(LLMD, "InferenceObjective", "orphan", "default"), "Accepted")["reason"]
            == "Pending"
        )
        await kube.create(
            {
                "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
                "kind": "InferencePool",
                "metadata": {"name": "later", "namespace": "default"},
                "spec": {
                    "selector": {"app": "x"},
                    "targetPortNumber": 8000,
                    "extensionRef": {"name": "e"},
                },
            }
        )
        await eventually(
            lambda: accepted("InferenceObjective", "orphan") == "True",
            what="the orphan accepted once its (v1alpha2) pool exists",
        )
