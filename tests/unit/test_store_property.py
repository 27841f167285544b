"""Random sequences of writes keep the store consistent with a plain dict model."""

import asyncio
import contextlib
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmplane.store import NotFound, SQLiteStore

NAMES = st.sampled_from(["a", "b", "c"])
NAMESPACES = st.sampled_from(["", "default", "team"])  # "" = cluster-scoped
LABELS = st.dictionaries(st.sampled_from(["app", "tier"]), st.sampled_from(["x", "y"]), max_size=2)
SPECS = st.fixed_dictionaries({"replicas": st.integers(0, 2)})
STATUSES = st.fixed_dictionaries({"phase": st.sampled_from(["Pending", "Ready"])})

OPS = st.one_of(
    st.tuples(st.just("apply"), NAMES, NAMESPACES, LABELS, SPECS),
    st.tuples(st.just("delete"), NAMES, NAMESPACES),
    st.tuples(st.just("status"), NAMES, NAMESPACES, STATUSES),
)


def kind_for(ns):
    return "OpenModel" if ns == "" else "Playground"


def make(name, ns, labels, spec):
    meta = {"name": name, "labels": labels}
    if ns:
        meta["namespace"] = ns
    return {"apiVersion": "x/v1", "kind": kind_for(ns), "metadata": meta, "spec": spec}


def view(obj):
    meta = obj["metadata"]
    return {
        "key": (obj["kind"], meta.get("namespace", ""), meta["name"]),
        "labels": meta.get("labels"),
        "spec": obj["spec"],
        "status": obj.get("status"),
        "generation": meta["generation"],
    }


async def replay(store):
    """Reconstruct the state from the full event log."""
    state = {}
    head = int(store.resource_version())
    if head == 0:
        return state
    async with contextlib.aclosing(store.watch(since="0")) as watch:
        async for event in watch:
            key = event.key
            if event.type == "DELETED":
                state.pop(key)
            else:
                state[key] = event.object
            if int(event.resource_version) == head:
                return state
    return state


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=30))
def test_random_writes_match_model(ops):
    with tempfile.TemporaryDirectory() as tmp, SQLiteStore(Path(tmp) / "s.db") as store:
        model: dict[tuple, dict] = {}
        last_rv = 0
        for op in ops:
            name, ns = op[1], op[2]
            key = (kind_for(ns), ns, name)
            if op[0] == "apply":
                labels, spec = op[3], op[4]
                old = model.get(key)
                out = store.apply(make(name, ns, labels, spec))
                if old is None:
                    generation, status = 1, None
                else:
                    generation = old["generation"] + (old["spec"] != spec)
                    status = old["status"]
                changed = old is None or (old["spec"], old["labels"]) != (spec, labels)
                model[key] = {
                    "key": key,
                    "labels": labels,
                    "spec": spec,
                    "status": status,
                    "generation": generation,
                }
            elif op[0] == "delete":
                out = store.delete(key[0], name, ns or None)
                assert (out is None) == (key not in model)
                changed = model.pop(key, None) is not None
            else:
                status = op[3]
                if key not in model:
                    try:
                        store.update_status(key[0], name, ns, status)
                    except NotFound:
                        continue
                    raise AssertionError("update_status on a missing object must raise NotFound")
                out = store.update_status(key[0], name, ns, status)
                changed = model[key]["status"] != status
                model[key]["status"] = status

            rv = int(store.resource_version())
            assert rv == last_rv + changed  # one new resourceVersion per real change
            if out is not None:
                assert int(out["metadata"]["resourceVersion"]) == rv or not changed
            last_rv = rv

            listed = store.list()
            expected = sorted(model.values(), key=lambda v: (v["key"][1], v["key"][2]))
            assert [view(o) for o in listed] == expected
            for kind in ("OpenModel", "Playground"):
                assert [view(o) for o in store.list(kind)] == [
                    v for v in expected if v["key"][0] == kind
                ]
            assert [view(o) for o in store.list(label_selector="app=x")] == [
                v for v in expected if v["labels"].get("app") == "x"
            ]

        replayed = asyncio.run(replay(store))
        assert sorted(replayed.items()) == sorted(
            ((o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]), o)
            for o in store.list()
        )
