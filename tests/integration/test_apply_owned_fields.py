"""``llmplane apply`` keeps the fields llmplane's own commands write (issue 27, item 3).

The real CLI in a subprocess against a real state directory: keys made by ``llmplane keys``
survive applying the Tenant's file, whatever else the file changes; a file that would drop or
change them is refused with one line and stores nothing (not even its other documents) unless
``--force-conflicts``. (The same with ``llmplane up`` and live keys: test_up_tenants.py.)
"""

from __future__ import annotations

from pathlib import Path

import orjson
import yaml

from llmplane.store.paths import open_store
from tests.integration.upcli import cli

TENANT = """
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {name: team-a}
spec:
  models: ["tiny*"]
"""
OTHER = """
---
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {name: team-b}
"""


def stored_keys(state: Path) -> list[dict]:
    with open_store(state) as store:
        obj = store.get("Tenant", "team-a", "default")
    return obj["spec"].get("keys", []) if obj else []


def with_keys(keys: list[dict], extra: str = "") -> str:
    return TENANT + f"  keys: {orjson.dumps(keys).decode()}\n" + extra


def test_apply_keeps_keys_and_refuses_to_drop_them(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = tmp_path / "tenant.yaml"
    path.write_text(TENANT)
    assert "created" in cli("apply", "-f", str(path), state_dir=state).stdout
    cli("keys", "create", "team-a", "--name", "one", state_dir=state)
    cli("keys", "create", "team-a", "--name", "two", state_dir=state)
    keys = stored_keys(state)
    assert len(keys) == 2

    # The file again, then with other changes: the keys stay, whatever the file changes.
    for text in (TENANT, TENANT.replace("tiny*", "other*"), TENANT + "  weight: 3\n"):
        path.write_text(text)
        cli("apply", "-f", str(path), state_dir=state)
        assert stored_keys(state) == keys, text
    # What `llmplane get -o yaml` prints applies back unchanged (it lists the keys as stored).
    shown = cli("get", "tenant", "team-a", "-o", "yaml", state_dir=state).stdout
    path.write_text(shown)
    assert "unchanged" in cli("apply", "-f", str(path), state_dir=state).stdout

    # Files that would drop or change a key: refused, one line, nothing stored, not even the
    # other Tenant in the same file.
    cli("keys", "revoke", "team-a", keys[1]["id"], state_dir=state)
    keys = stored_keys(state)
    unrevoked = [keys[0], {**keys[1], "revoked": False}]
    renamed = [keys[0], {**keys[1], "name": "three"}]
    for listed in ([], [keys[0]], [keys[1]], unrevoked, renamed):
        path.write_text(with_keys(listed, OTHER))
        proc = cli("apply", "-f", str(path), state_dir=state, check=False)
        assert proc.returncode == 1, (listed, proc.stdout, proc.stderr)
        message = proc.stderr.strip()
        assert len(message.splitlines()) == 1 and "Traceback" not in proc.stderr, message
        assert "spec.keys" in message and "--force-conflicts" in message, message
        assert "llmplane keys" in message, message
        assert stored_keys(state) == keys, listed
        with open_store(state) as store:
            assert store.get("Tenant", "team-b", "default") is None

    # Listing the stored keys plus a new one only adds: accepted.
    new = {"id": "abcdefghij12", "salt": "0" * 32, "hash": "1" * 64}
    path.write_text(with_keys([*keys, new]))
    assert "configured" in cli("apply", "-f", str(path), state_dir=state).stdout
    assert [k["id"] for k in stored_keys(state)] == [*(k["id"] for k in keys), new["id"]]

    # --force-conflicts: the file's keys replace the stored ones (here: none).
    path.write_text(with_keys([]))
    cli("apply", "--force-conflicts", "-f", str(path), state_dir=state)
    assert stored_keys(state) == []
    assert yaml.safe_load(shown)["spec"]["keys"]  # (the earlier listing did show keys)
