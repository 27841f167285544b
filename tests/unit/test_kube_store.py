"""``llmplane.store.kube.KubeStore`` against ``llmplane.testing.kube_emulator.KubeEmulator``, an
in-process Kubernetes API EMULATOR (aiohttp), not an API server: none can run here.

List/get from the watched cache, the Store watch (its own event sequence, Expired), relisting
after ``410 Gone``, kinds whose CRD is missing, namespace scoping, and read-only writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llmplane.gateway.store_follower import StoreFollower
from llmplane.store.base import Expired, StoreError
from llmplane.store.kube import GATEWAY_KINDS, KubeStore, ReadOnly
from llmplane.testing import eventually
from llmplane.testing.kube_emulator import KubeEmulator, default_kinds

pytestmark = pytest.mark.timeout(60)

KTHENA = "networking.serving.volcano.sh/v1alpha1"


def server(name: str, namespace: str = "default", labels: dict[str, str] | None = None):
    return {
        "apiVersion": KTHENA,
        "kind": "ModelServer",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels or {},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
        },
        "spec": {
            "model": "llama",
            "inferenceEngine": "vLLM",
            "workloadSelector": {"matchLabels": {"app": name}},
        },
    }


def route(name: str, target: str, namespace: str = "default"):
    return {
        "apiVersion": KTHENA,
        "kind": "ModelRoute",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"modelName": name, "rules": [{"targetModels": [{"modelServerName": target}]}]},
    }


def openmodel(name: str):
    return {
        "apiVersion": "llmaz.io/v1alpha1",
        "kind": "OpenModel",
        "metadata": {"name": name},
        "spec": {"familyName": "opt", "source": {"modelHub": {"modelID": "facebook/opt-125m"}}},
    }


@contextlib.asynccontextmanager
async def store_on(kube: KubeEmulator, **kwargs: Any) -> AsyncIterator[KubeStore]:
    store = await KubeStore.connect(server=kube.url, **kwargs)
    try:
        yield store
    finally:
        await store.aclose()


async def test_lists_from_the_cache_and_follows_changes() -> None:
    async with KubeEmulator() as kube:
        await kube.create(server("a", labels={"tier": "gold"}))
        await kube.create(server("b", namespace="team"))
        await kube.create(openmodel("opt-125m"))
        async with store_on(kube) as store:
            requests = len(kube.requests)
            servers = store.list("ModelServer")
            assert [(o["metadata"].get("namespace"), o["metadata"]["name"]) for o in servers] == [
                ("default", "a"),
                ("team", "b"),
            ]
            a = servers[0]
            assert (a["apiVersion"], a["kind"]) == (KTHENA, "ModelServer")
            assert "managedFields" not in a["metadata"]  # slimmed: the API models forbid it
            assert a["metadata"]["uid"] and a["metadata"]["resourceVersion"]
            assert [o["metadata"]["name"] for o in store.list("ModelServer", "team")] == ["b"]
            assert [o["metadata"]["name"] for o in store.list(None, None, "tier=gold")] == ["a"]
            assert [o["metadata"]["name"] for o in store.list(None, None, {"tier": "gold"})] == [
                "a"
            ]
            assert store.get("OpenModel", "opt-125m")["kind"] == "OpenModel"
            assert store.get("ModelServer", "b", "team") is not None
            assert store.get("ModelServer", "b") is None
            # every read above came from the cache: no request reached the API
            assert len(kube.requests) == requests
            # the copy is the caller's
            a["spec"]["model"] = "changed"
            assert store.get("ModelServer", "a", "default")["spec"]["model"] == "llama"

            await kube.create(route("chat", "a"))
            await eventually(lambda: store.get("ModelRoute", "chat", "default"))
            await kube.patch(KTHENA, "ModelServer", "a", "default", {"spec": {"model": "qwen"}})
            await eventually(
                lambda: store.get("ModelServer", "a", "default")["spec"]["model"] == "qwen"
            )
            await kube.delete(KTHENA, "ModelServer", "b", "team")
            await eventually(lambda: store.get("ModelServer", "b", "team") is None)


async def test_watch_replays_then_follows_and_resumes_from_its_own_sequence() -> None:
    async with KubeEmulator() as kube:
        await kube.create(server("a"))
        async with store_on(kube) as store:
            watch = store.watch("ModelServer")
            first = await asyncio.wait_for(watch.__anext__(), 5)
            assert (first.type, first.key) == ("ADDED", ("ModelServer", "default", "a"))

            await kube.create(route("chat", "a"))  # another kind: filtered out
            # (kinds are separate watch streams: their relative order is only the arrival's)
            await eventually(lambda: store.get("ModelRoute", "chat", "default"))
            await kube.create(server("b"))
            second = await asyncio.wait_for(watch.__anext__(), 5)
            assert (second.type, second.key) == ("ADDED", ("ModelServer", "default", "b"))
            await watch.aclose()

            # resume after `second` (the store's sequence, not the API's resourceVersion)
            resumed = store.watch(None, None, second.resource_version)
            await kube.delete(KTHENA, "ModelServer", "a", "default")
            event = await asyncio.wait_for(resumed.__anext__(), 5)
            assert (event.type, event.key) == ("DELETED", ("ModelServer", "default", "a"))
            await resumed.aclose()

            # from the start of the history: every event again, in order
            replay = store.watch(None, None, "0")
            keys = [(await asyncio.wait_for(replay.__anext__(), 5)).key for _ in range(4)]
            await replay.aclose()
            assert keys == [
                ("ModelServer", "default", "a"),
                ("ModelRoute", "default", "chat"),
                ("ModelServer", "default", "b"),
                ("ModelServer", "default", "a"),
            ]

            for since in ("not-a-number", str(int(store.resource_version()) + 5)):
                with pytest.raises(Expired):
                    await store.watch(None, None, since).__anext__()


async def test_history_is_bounded_and_an_old_since_is_expired() -> None:
    async with KubeEmulator() as kube, store_on(kube, history=2) as store:
        for name in ("a", "b", "c"):
            await kube.create(server(name))
        await eventually(lambda: len(store.list("ModelServer")) == 3)
        with pytest.raises(Expired):
            await store.watch(None, None, "0").__anext__()
        # a follower recovers from Expired by listing again
        seen: list[set[str]] = []
        follower = StoreFollower(
            store,
            ["ModelServer"],
            lambda objs: seen.append({k[2] for k in objs}),
            debounce=0.0,
        )
        assert seen[-1] == {"a", "b", "c"}
        await follower.start()
        await kube.delete(KTHENA, "ModelServer", "b", "default")
        await eventually(lambda: seen[-1] == {"a", "c"})
        await follower.close()


async def test_relists_after_410_gone_and_reports_the_difference(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "llmplane.kube.informer")
    async with KubeEmulator() as kube:
        await kube.create(server("a"))
        await kube.create(server("b"))
        async with store_on(kube) as store:
            events: list[tuple[str, str]] = []

            async def collect() -> None:
                async for e in store.watch("ModelServer", None, store.resource_version()):
                    events.append((e.type, e.key[2]))

            task = asyncio.create_task(collect())
            # The watch is open once it reports a change made now.
            await kube.create(server("probe"))
            await eventually(lambda: ("ADDED", "probe") in events, what="the watch open")
            # Changes the store must not miss, then compaction: open watches end and resuming
            # from their resourceVersion gets 410, so the store lists again.
            await kube.create(openmodel("other"))  # moves the global resourceVersion on
            kube.compact()
            await kube.delete(KTHENA, "ModelServer", "a", "default")
            await kube.create(server("c"))
            await eventually(lambda: {o["metadata"]["name"] for o in store.list("ModelServer")})
            await eventually(
                lambda: (
                    {o["metadata"]["name"] for o in store.list("ModelServer")}
                    == {"b", "c", "probe"}
                )
            )
            await eventually(lambda: ("DELETED", "a") in events and ("ADDED", "c") in events)
            assert "modelservers: resourceVersion" in caplog.text and "is gone" in caplog.text
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_kind_whose_crd_is_missing_is_empty_and_the_rest_work() -> None:
    kinds = [k for k in default_kinds() if k.kind not in ("InferencePool", "InferenceModel")]
    async with KubeEmulator(kinds=kinds) as kube:
        await kube.create(server("a"))
        async with store_on(kube) as store:
            assert store.list("InferencePool") == []
            assert [o["metadata"]["name"] for o in store.list("ModelServer")] == ["a"]
            missing = [i for i in store.informers if i.missing]
            assert {i.resource.kind for i in missing} == {"InferencePool", "InferenceModel"}


async def test_namespaces_scope_namespaced_kinds_not_cluster_scoped_ones() -> None:
    async with KubeEmulator() as kube:
        await kube.create(server("a", namespace="team"))
        await kube.create(server("b", namespace="other"))
        await kube.create(openmodel("opt-125m"))
        async with store_on(kube, namespaces=["team"]) as store:
            assert [o["metadata"]["name"] for o in store.list("ModelServer")] == ["a"]
            assert store.get("OpenModel", "opt-125m") is not None
            await kube.create(server("c", namespace="other"))
            await kube.create(server("d", namespace="team"))
            await eventually(lambda: store.get("ModelServer", "d", "team"))
            assert store.get("ModelServer", "c", "other") is None
            paths = {p for _, p in kube.requests}
            assert "/apis/networking.serving.volcano.sh/v1alpha1/modelservers" not in paths
            assert "/apis/llmaz.io/v1alpha1/openmodels" in paths


async def test_writes_are_refused_as_read_only() -> None:
    async with KubeEmulator() as kube, store_on(kube) as store:
        for call in (
            lambda: store.apply(server("a")),
            lambda: store.apply_many([server("a")]),
            lambda: store.delete("ModelServer", "a", "default"),
            lambda: store.update_status("ModelServer", "a", "default", {}),
        ):
            with pytest.raises(ReadOnly, match="read-only") as err:
                call()
            assert isinstance(err.value, StoreError)
        assert kube.list(KTHENA, "ModelServer") == []
        assert set(GATEWAY_KINDS) == {
            "Playground",
            "OpenModel",
            "ModelRoute",
            "ModelServer",
            "InferencePool",
            "InferenceModel",
            "InferenceObjective",
            "InferenceModelRewrite",
            "Endpoint",
            "Tenant",
        }


async def test_start_fails_when_the_api_cannot_be_reached() -> None:
    async with KubeEmulator() as kube:
        url = kube.url
    with pytest.raises(Exception):  # noqa: B017 - a connection error of aiohttp's
        await KubeStore.connect(server=url)


def test_the_charts_gateway_role_grants_exactly_reads_of_what_it_follows() -> None:
    """The gateway's ClusterRole (deploy/helm/llmplane/templates/gateway.yaml) lets it get /
    list / watch every resource the store and PodDiscovery follow, and nothing more than read
    but the scale of Playgrounds (its activator's scale from zero)."""
    from llmplane.kube.kinds import POD, Kind
    from tests.unit.helm_chart import render_chart

    [role] = [
        d
        for d in render_chart()
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-gateway")
    ]
    granted = {
        (group, resource)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        if {"get", "list", "watch"} <= set(rule["verbs"])
    }
    assert all(
        set(rule["verbs"]) <= {"get", "list", "watch"}
        or (rule["resources"] == ["playgrounds/scale"] and set(rule["verbs"]) == {"get", "patch"})
        for rule in role["rules"]
    )
    served = Kind.served_of(GATEWAY_KINDS)  # older groups it reads too
    followed = {(r.group, r.plural) for r in [*map(Kind.of, GATEWAY_KINDS), *served, POD]}
    assert followed <= granted, followed - granted


async def test_a_pool_in_both_groups_shows_the_v1_one_and_survives_either_deletion() -> None:
    """A v1alpha2 InferencePool (inference.networking.x-k8s.io) is kept converted to v1; with a
    v1 pool of the same name too, the v1 one is shown, and deleting either leaves the other."""
    old = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferencePool",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "selector": {"app": "old"},
            "targetPortNumber": 8000,
            "extensionRef": {"name": "e"},
        },
    }
    new = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "new"}}, "targetPorts": [{"number": 9000}]},
    }

    def shown() -> dict[str, Any] | None:
        pool = store.get("InferencePool", "p", "default")
        return pool and pool["spec"]["selector"]["matchLabels"]

    async with KubeEmulator() as kube:
        await kube.create(old)
        async with store_on(kube) as store:
            await eventually(lambda: shown() == {"app": "old"}, what="the v1alpha2 pool as v1")
            assert store.get("InferencePool", "p", "default")["apiVersion"] == (
                "inference.networking.k8s.io/v1"
            )
            await kube.create(new)
            await eventually(lambda: shown() == {"app": "new"}, what="the v1 pool wins")
            # A change to the shadowed v1alpha2 pool does not replace the v1 one.
            await kube.patch(
                old["apiVersion"],
                "InferencePool",
                "p",
                "default",
                {"spec": {"selector": {"app": "older"}}},
            )
            await kube.patch(
                new["apiVersion"],
                "InferencePool",
                "p",
                "default",
                {"metadata": {"labels": {"x": "y"}}},
            )
            await eventually(
                lambda: store.get("InferencePool", "p", "default")["metadata"].get("labels"),
                what="the v1 pool's change seen",
            )
            assert shown() == {"app": "new"}
            await kube.delete(new["apiVersion"], "InferencePool", "p", "default")
            await eventually(lambda: shown() == {"app": "older"}, what="the v1alpha2 pool again")
            await kube.delete(old["apiVersion"], "InferencePool", "p", "default")
            await eventually(lambda: shown() is None, what="no pool")
            assert store.list("InferencePool") == []
