import re
import sqlite3

import pytest

from llmplane.store import (
    Conflict,
    InvalidObject,
    NotFound,
    SQLiteStore,
    Store,
    StoreError,
    open_store,
    state_dir,
)


def pg(name, ns="default", labels=None, spec=None, **meta):
    obj = {
        "apiVersion": "inference.llmaz.io/v1alpha1",
        "kind": "Playground",
        "metadata": {"name": name, "namespace": ns, **meta},
        "spec": spec if spec is not None else {"replicas": 1},
    }
    if labels is not None:
        obj["metadata"]["labels"] = labels
    return obj


def model(name, spec=None):
    return {
        "apiVersion": "llmaz.io/v1alpha1",
        "kind": "OpenModel",
        "metadata": {"name": name},
        "spec": spec or {"familyName": "qwen2"},
    }


@pytest.fixture
def store(tmp_path):
    with SQLiteStore(tmp_path / "llmplane.db") as s:
        yield s


def test_implements_protocol(store):
    assert isinstance(store, Store)


def test_create_sets_server_fields(store):
    out = store.apply(pg("a", labels={"x": "1"}))
    meta = out["metadata"]
    assert re.fullmatch(r"[0-9a-f-]{36}", meta["uid"])
    assert meta["resourceVersion"] == "1"
    assert meta["generation"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert meta["labels"] == {"x": "1"}
    assert "status" not in out
    assert store.get("Playground", "a", "default") == out
    assert list(out) == ["apiVersion", "kind", "metadata", "spec"]


def test_server_fields_in_input_are_ignored(store):
    out = store.apply(pg("a", uid="mine", generation=7, creationTimestamp="2000-01-01T00:00:00Z"))
    assert out["metadata"]["uid"] != "mine"
    assert out["metadata"]["generation"] == 1
    assert out["metadata"]["creationTimestamp"] != "2000-01-01T00:00:00Z"


def test_update_semantics(store):
    first = store.apply(pg("a", labels={"x": "1"}, spec={"replicas": 1}))
    store.update_status("Playground", "a", "default", {"phase": "Ready"})

    relabeled = store.apply(pg("a", labels={"x": "2"}, spec={"replicas": 1}))
    assert relabeled["metadata"]["generation"] == 1  # labels are not spec
    assert int(relabeled["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    assert relabeled["metadata"]["labels"] == {"x": "2"}
    assert relabeled["status"] == {"phase": "Ready"}  # apply keeps status
    assert relabeled["metadata"]["uid"] == first["metadata"]["uid"]
    assert relabeled["metadata"]["creationTimestamp"] == first["metadata"]["creationTimestamp"]

    respecced = store.apply(pg("a", labels={"x": "2"}, spec={"replicas": 3}))
    assert respecced["metadata"]["generation"] == 2
    assert respecced["spec"] == {"replicas": 3}
    assert int(respecced["metadata"]["resourceVersion"]) > int(
        relabeled["metadata"]["resourceVersion"]
    )

    # labels and annotations are replaced, not merged
    bare = store.apply(pg("a", spec={"replicas": 3}))
    assert "labels" not in bare["metadata"]
    assert bare["metadata"]["generation"] == 2


def test_apply_never_writes_status(store):
    obj = pg("a")
    obj["status"] = {"phase": "Hacked"}
    assert "status" not in store.apply(obj)
    store.update_status("Playground", "a", "default", {"phase": "Ready"})
    assert store.apply(obj)["status"] == {"phase": "Ready"}


def test_noop_apply_changes_nothing(store):
    first = store.apply(pg("a", labels={"x": "1"}))
    again = store.apply(pg("a", labels={"x": "1"}))
    assert again == first
    assert store.resource_version() == first["metadata"]["resourceVersion"]
    # carrying the current resourceVersion is still a no-op
    assert store.apply(pg("a", labels={"x": "1"}, resourceVersion="1")) == first


def test_apply_conflict_on_stale_resource_version(store):
    store.apply(pg("a"))
    store.apply(pg("a", spec={"replicas": 2}))  # rv 2
    with pytest.raises(Conflict, match=r"Playground/a was modified: resourceVersion 1 is stale"):
        store.apply(pg("a", spec={"replicas": 5}, resourceVersion="1"))
    assert store.get("Playground", "a", "default")["spec"] == {"replicas": 2}
    ok = store.apply(pg("a", spec={"replicas": 5}, resourceVersion="2"))
    assert ok["spec"] == {"replicas": 5}
    with pytest.raises(Conflict, match="does not exist"):
        store.apply(pg("b", resourceVersion="3"))
    assert store.get("Playground", "b", "default") is None


def test_resource_versions_compare_as_whole_values_past_one_digit(store):
    """Optimistic concurrency at resourceVersions of two and more digits: a stale one ("9"
    sorts after "12" as text) and one from the future are both refused, by apply and by
    update_status, and the object stays as it was."""
    for i in range(12):  # other objects move the global resourceVersion past 10
        store.apply(pg(f"filler-{i}"))
    current = store.apply(pg("a", spec={"replicas": 1}))
    rv = current["metadata"]["resourceVersion"]
    assert int(rv) >= 13
    stale = str(int(rv) - 4)  # one digit shorter than rv, and larger as text
    assert len(stale) < len(rv) or stale > rv
    for given in (stale, "1", str(int(rv) + 1), str(int(rv) * 10), rv + "0"):
        with pytest.raises(Conflict, match=f"resourceVersion {given} is stale"):
            store.apply(pg("a", spec={"replicas": 7}, resourceVersion=given))
        with pytest.raises(Conflict, match="Playground/a was modified"):
            store.update_status("Playground", "a", "default", {"x": given}, resource_version=given)
    assert store.get("Playground", "a", "default") == current
    # The current one, two digits and all, is accepted.
    updated = store.apply(pg("a", spec={"replicas": 7}, resourceVersion=rv))
    assert updated["spec"] == {"replicas": 7}
    assert int(updated["metadata"]["resourceVersion"]) == int(rv) + 1
    new_rv = updated["metadata"]["resourceVersion"]
    out = store.update_status("Playground", "a", "default", {"ok": True}, resource_version=new_rv)
    assert out["status"] == {"ok": True}


def test_update_status(store):
    created = store.apply(pg("a"))
    out = store.update_status(
        "Playground", "a", "default", {"conditions": []}, created["metadata"]["resourceVersion"]
    )
    assert out["status"] == {"conditions": []}
    assert out["metadata"]["generation"] == 1
    assert out["metadata"]["resourceVersion"] == "2"
    with pytest.raises(Conflict, match="Playground/a was modified"):
        store.update_status("Playground", "a", "default", {"x": 1}, resource_version="1")
    assert store.get("Playground", "a", "default")["status"] == {"conditions": []}
    replaced = store.update_status("Playground", "a", "default", {"x": 1})
    assert replaced["status"] == {"x": 1}  # replaced, not merged
    # an identical status is a no-op
    assert store.update_status("Playground", "a", "default", {"x": 1}) == replaced
    with pytest.raises(NotFound, match="Playground/other/missing not found"):
        store.update_status("Playground", "missing", "other", {})


def test_apply_many_is_atomic(store):
    store.apply(pg("b"))
    store.apply(pg("b", spec={"replicas": 2}))  # b at rv 2
    before = store.resource_version()
    with pytest.raises(Conflict):
        store.apply_many([pg("a"), pg("b", spec={"replicas": 9}, resourceVersion="1"), pg("c")])
    assert store.get("Playground", "a", "default") is None
    assert store.get("Playground", "c", "default") is None
    assert store.get("Playground", "b", "default")["spec"] == {"replicas": 2}
    assert store.resource_version() == before

    with pytest.raises(InvalidObject):
        store.apply_many([pg("a"), {"kind": "Playground", "metadata": {}}])
    assert store.get("Playground", "a", "default") is None

    out = store.apply_many([pg("a"), pg("c"), model("m")])
    assert [o["metadata"]["name"] for o in out] == ["a", "c", "m"]
    assert [o["metadata"]["resourceVersion"] for o in out] == ["3", "4", "5"]


def test_apply_many_same_object_twice(store):
    out = store.apply_many([pg("a"), pg("a", spec={"replicas": 2})])
    assert out[1]["metadata"]["generation"] == 2
    assert store.get("Playground", "a", "default")["spec"] == {"replicas": 2}


def test_list_filters(store):
    store.apply_many(
        [
            pg("b", labels={"app": "web", "tier": "front"}),
            pg("a", labels={"app": "web"}),
            pg("a", ns="team", labels={"app": "db"}),
            model("z"),
            model("m"),
        ]
    )
    names = lambda objs: [(o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objs]  # noqa: E731
    assert names(store.list()) == [
        ("", "m"),
        ("", "z"),
        ("default", "a"),
        ("default", "b"),
        ("team", "a"),
    ]
    assert names(store.list("Playground")) == [("default", "a"), ("default", "b"), ("team", "a")]
    assert names(store.list("Playground", "team")) == [("team", "a")]
    assert names(store.list(namespace="default")) == [("default", "a"), ("default", "b")]
    assert names(store.list("OpenModel")) == [("", "m"), ("", "z")]
    assert names(store.list(label_selector="app=web")) == [("default", "a"), ("default", "b")]
    assert names(store.list(label_selector="app=web,!tier")) == [("default", "a")]
    assert names(store.list(label_selector="app in (db,web),tier notin (front)")) == [
        ("default", "a"),
        ("team", "a"),
    ]
    assert names(store.list(label_selector={"app": "db"})) == [("team", "a")]
    assert names(store.list(label_selector={"matchLabels": {"tier": "front"}})) == [
        ("default", "b")
    ]
    assert store.list("Nothing") == []
    with pytest.raises(ValueError, match="invalid label selector"):
        store.list(label_selector="app in web")


def test_delete(store):
    store.apply(pg("a"))
    deleted = store.delete("Playground", "a", "default")
    assert deleted["metadata"]["name"] == "a"
    assert deleted["metadata"]["resourceVersion"] == "2"  # the deletion's resourceVersion
    assert store.get("Playground", "a", "default") is None
    assert store.delete("Playground", "a", "default") is None
    recreated = store.apply(pg("a"))
    assert recreated["metadata"]["generation"] == 1
    assert recreated["metadata"]["uid"] != deleted["metadata"]["uid"]


def test_cluster_scoped(store):
    out = store.apply(model("qwen"))
    assert "namespace" not in out["metadata"]
    assert store.get("OpenModel", "qwen") == out
    assert store.get("OpenModel", "qwen", "") == out
    assert store.get("OpenModel", "qwen", "default") is None
    assert store.list("OpenModel", namespace="") == [out]
    # an empty namespace key is treated as none
    same = store.apply({**model("qwen"), "metadata": {"name": "qwen", "namespace": ""}})
    assert same == out
    status = store.update_status("OpenModel", "qwen", None, {"ok": True})
    assert status["status"] == {"ok": True}
    assert store.delete("OpenModel", "qwen")["metadata"]["name"] == "qwen"
    assert store.list() == []


def test_returned_objects_are_copies(store):
    obj = pg("a", labels={"x": "1"})
    out = store.apply(obj)
    obj["metadata"]["labels"]["x"] = "changed"
    out["spec"]["replicas"] = 99
    got = store.get("Playground", "a", "default")
    assert got["metadata"]["labels"] == {"x": "1"}
    assert got["spec"] == {"replicas": 1}


def test_invalid_objects(store):
    with pytest.raises(InvalidObject, match="no kind"):
        store.apply({"metadata": {"name": "a"}})
    with pytest.raises(InvalidObject, match=r"no metadata\.name"):
        store.apply({"kind": "Playground", "metadata": {}})
    with pytest.raises(InvalidObject, match="labels must map strings to strings"):
        store.apply(pg("a", labels={"x": 1}))
    with pytest.raises(InvalidObject, match="not plain JSON"):
        store.apply(pg("a", spec={"x": object()}))
    assert issubclass(InvalidObject, StoreError)


def test_persists_and_has_schema(tmp_path):
    path = tmp_path / "s.db"
    with SQLiteStore(path) as s:
        s.apply(pg("a"))
    with SQLiteStore(path) as s:
        assert s.get("Playground", "a", "default")["metadata"]["resourceVersion"] == "1"
        assert s.apply(pg("b"))["metadata"]["resourceVersion"] == "2"
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(1,)]
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer than this llmplane"):
        SQLiteStore(path)


def test_closed_store(tmp_path):
    s = SQLiteStore(tmp_path / "s.db")
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.get("Playground", "a")


def test_event_log_is_compacted(tmp_path):
    with SQLiteStore(tmp_path / "s.db", max_events=50, compact_every=10) as s:
        for i in range(300):
            s.apply(pg("a", spec={"replicas": i}))
        conn = sqlite3.connect(tmp_path / "s.db")
        count, low = conn.execute("SELECT COUNT(*), MIN(rv) FROM events").fetchone()
        conn.close()
        assert count <= 60
        assert low >= 300 - 60


def test_state_dir(tmp_path, monkeypatch):
    explicit = tmp_path / "explicit" / "nested"
    assert state_dir(explicit) == explicit
    assert explicit.is_dir()
    monkeypatch.setenv("LLMPLANE_HOME", str(tmp_path / "env"))
    assert state_dir() == tmp_path / "env"
    assert (tmp_path / "env").is_dir()
    assert state_dir(str(explicit)) == explicit
    monkeypatch.delenv("LLMPLANE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_dir() == tmp_path / "home" / ".llmplane"
    with open_store(explicit) as s:
        assert s.path == explicit / "llmplane.db"
        s.apply(model("m"))
    assert (explicit / "llmplane.db").exists()
