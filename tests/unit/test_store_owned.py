"""API-owned fields on apply (llmplane/store/owned.py), on a real SQLiteStore."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmplane.store.owned import OwnedFieldConflict, _losses
from llmplane.store.sqlite import SQLiteStore

KEY_A = {"id": "aaaaaaaaaaaa", "salt": "0" * 32, "hash": "1" * 64}
KEY_B = {"id": "bbbbbbbbbbbb", "salt": "2" * 32, "hash": "3" * 64}


def tenant(spec: dict | None) -> dict:
    obj = {
        "apiVersion": "llmplane.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": "t", "namespace": "default"},
    }
    if spec is not None:
        obj["spec"] = spec
    return obj


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / "db.sqlite") as s:
        s.apply(tenant({"models": ["*"], "keys": [KEY_A, KEY_B]}))
        yield s


def keys(store: SQLiteStore) -> list[dict]:
    return store.get("Tenant", "t", "default")["spec"].get("keys")


def test_left_out_is_kept_even_without_a_spec(store: SQLiteStore) -> None:
    for spec in ({"models": ["x"]}, {}, None):
        store.apply(tenant(spec))
        assert keys(store) == [KEY_A, KEY_B], spec


def test_adding_is_allowed_dropping_or_changing_is_not(store: SQLiteStore) -> None:
    new = {"id": "cccccccccccc", "salt": "4" * 32, "hash": "5" * 64}
    store.apply(tenant({"keys": [KEY_B, new, KEY_A]}))  # order is not a change
    assert len(keys(store)) == 3
    before = store.get("Tenant", "t", "default")
    for given in ([], [KEY_A, new], [KEY_A, {**KEY_B, "revoked": True}, new]):
        with pytest.raises(OwnedFieldConflict, match=r"spec\.keys is written by `llmplane keys`"):
            store.apply(tenant({"models": ["changed"], "keys": given}))
        assert store.get("Tenant", "t", "default") == before  # nothing of the apply stored


def test_force_replaces_and_an_empty_field_takes_anything(store: SQLiteStore) -> None:
    store.apply(tenant({"keys": []}), force_conflicts=True)
    assert keys(store) == []
    store.apply(tenant({"keys": [KEY_A]}))  # nothing stored to lose: accepted
    assert keys(store) == [KEY_A]


def test_losses_without_a_list_key() -> None:
    assert _losses(None, 1, None) == [] and _losses(1, 1, None) == []
    assert _losses(1, 2, None) == ["replace it"]
    assert _losses([{"id": 1}], [{"id": 1, "x": 1}], "id") == ["change 1"]
