"""A corrupt row in the embedded store (a damaged file, a hand edit): ``get`` skips it and
says which, reading it by name is one clear line, ``up`` reconciles everything else, and
``delete`` or ``apply`` repairs it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from llmplane.store.paths import db_path
from llmplane.testing import Up, wait_for
from tests.integration.upcli import cli, condition, http, sim_fleet


def corrupt(state: Path, kind: str, name: str, body: str, namespace: str = "default") -> None:
    with sqlite3.connect(db_path(state)) as conn:
        changed = conn.execute(
            "UPDATE objects SET object = ? WHERE kind = ? AND namespace = ? AND name = ?",
            (body, kind, namespace, name),
        ).rowcount
    assert changed == 1, f"no stored {kind}/{name} to corrupt"


def test_a_corrupt_row_is_skipped_reported_and_the_rest_reconciles(tmp_path: Path) -> None:
    state = tmp_path / "state"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("---".join(sim_fleet(name, 1) for name in ("good", "broken", "hollow")))
    cli("apply", "-f", str(fleet), state_dir=state)
    corrupt(state, "Playground", "broken", '{"kind": "Playground", "metad')  # cut short
    corrupt(state, "OpenModel", "broken", "[1, 2, 3]", namespace="")  # JSON, not an object
    corrupt(state, "Playground", "hollow", '{"kind": "Playground", "spec": {}}')  # no metadata

    listed = cli("get", "playgrounds", state_dir=state)
    assert "Traceback" not in listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert names == ["good"], listed.stdout
    assert "Playground/broken: the stored object is corrupt: not JSON" in listed.stderr
    assert "Playground/hollow: the stored object is corrupt: no metadata" in listed.stderr
    models = cli("get", "openmodels", "-o", "name", state_dir=state)
    assert models.stdout.split() == ["openmodel.llmaz.io/good", "openmodel.llmaz.io/hollow"]
    assert "OpenModel/broken: the stored object is corrupt" in models.stderr

    one = cli("get", "playground", "broken", state_dir=state, check=False)
    assert one.returncode == 1 and "Traceback" not in one.stderr, one.stderr
    assert len(one.stderr.strip().splitlines()) == 1
    assert "Playground/broken: the stored object is corrupt" in one.stderr
    assert "llmplane delete Playground broken" in one.stderr
    described = cli("describe", "playground", "hollow", state_dir=state, check=False)
    assert described.returncode == 1 and "Traceback" not in described.stderr

    up = Up(state)
    try:
        up.start()
        wait_for(
            lambda: condition(state, "Playground", "good", "Available").get("status") == "True",
            60,
            what="the good Playground to become Available despite the corrupt rows",
        )
        status, _, body = http(
            f"{up.url}/v1/completions", {"model": "good", "prompt": "hi", "max_tokens": 2}
        )
        assert status == 200, body
        assert "Traceback" not in up.output(), up.output()
        log = up.output().replace("\n", " ")
        assert "Playground/broken" in log and "corrupt" in log  # reported by kind/name
    finally:
        up.kill_everything()

    # delete removes a corrupt row; apply writes over one
    assert "deleted" in cli("delete", "playground", "broken", state_dir=state).stdout
    cli("apply", "-f", str(fleet), state_dir=state)
    listed = cli("get", "playgrounds", "-o", "name", state_dir=state)
    assert listed.stderr == "" and len(listed.stdout.split()) == 3
