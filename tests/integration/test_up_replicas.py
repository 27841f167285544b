"""What one object may ask of ``llmplane up``: replicas up to the machine's ceiling, refused
with the field path and the limit before anything is stored; started a few at a time, so a
scale-up of dozens of sims leaves ``/health`` answering and SIGTERM stopping everything fast.
Real ``llmplane up`` and ``llmplane apply`` processes, real sim engines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from llmplane.runtime.capacity import ENV, machine_ceiling, start_concurrency
from llmplane.store.paths import open_store
from llmplane.testing import Processes, Up, always, wait_for
from llmplane.testing.process import ROOT, carrying
from tests.integration.upcli import http, sim_fleet, status

MODEL = "tiny"


def fleet(tmp_path: Path, replicas: int | str, extra: str = "") -> str:
    path = tmp_path / f"fleet-{replicas}-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(sim_fleet(MODEL, replicas) + extra)
    return str(path)


def spec_replicas(state: Path) -> int | None:
    with open_store(state) as store:
        obj = store.get("Playground", MODEL, "default")
    return obj["spec"]["replicas"] if obj else None


def apply(state: Path, path: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``llmplane apply`` as a user runs it, with ``env`` added: (exit code, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "llmplane.cli", "apply", "-f", path, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    return proc.returncode, " ".join(proc.stderr.split())


def test_apply_refuses_more_replicas_than_the_machine_runs(
    tmp_path: Path, processes: Processes
) -> None:
    state = tmp_path / "state"
    up = processes.up(state, fleet(tmp_path, 1))
    wait_for(lambda: status(state, "Playground", MODEL).get("readyReplicas") == 1, 60)
    before = spec_replicas(state)

    # The default ceiling comes from the machine; 100000 is far over it.
    ceiling = machine_ceiling()
    code, err = apply(state, fleet(tmp_path, 100000))
    assert code == 1, err
    assert f"Playground/{MODEL}: spec.replicas: 100000 is over this machine's limit of" in err
    assert f"limit of {ceiling} replicas per object" in err and ENV in err, err
    assert "Traceback" not in err

    # A configured ceiling, and every field that asks for replicas, each named.
    low = {ENV: "5"}
    elastic = "  elasticConfig: {minReplicas: 6, maxReplicas: 9}\n"
    code, err = apply(state, fleet(tmp_path, 6, elastic), low)
    assert code == 1, err
    for field, count in (("replicas", 6), ("elasticConfig.minReplicas", 6)):
        assert f"spec.{field}: {count} is over this machine's limit of 5" in err, err
    assert "spec.elasticConfig.maxReplicas: 9 is over" in err, err
    code, err = apply(state, fleet(tmp_path, 5), {ENV: "many"})
    assert code == 1 and f"{ENV}='many': must be a whole number" in err, err
    assert spec_replicas(state) == before, "a refused apply stored something"

    # At the ceiling is fine, and it is served.
    code, err = apply(state, fleet(tmp_path, 3), low)
    assert code == 0, err
    wait_for(lambda: status(state, "Playground", MODEL).get("readyReplicas") == 3, 60)
    assert http(f"{up.url}/health")[0] == 200


def test_up_refuses_files_over_the_ceiling_and_runs_no_more_than_it(
    tmp_path: Path, processes: Processes
) -> None:
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": str(ROOT), ENV: "2"}
    refused = Up(state, fleet(tmp_path, 3), env=env)
    refused.launch()
    assert refused.exited(60) == 1
    assert "spec.replicas: 3 is over this machine's limit of 2" in refused.output()
    assert spec_replicas(state) is None, "up stored a file it refused"

    # Past apply's check (a store written elsewhere, by an older llmplane), the
    # runtime still runs no more than the ceiling, and says why.
    with open_store(state) as store:
        for doc in _docs(fleet(tmp_path, 4)):
            store.apply(doc)
    up = processes.up(state, env=env)
    wait_for(lambda: len(up.engine_pids()) == 2, 60, what="two engines")
    always(lambda: len(up.engine_pids()) <= 2, 2.0, every=0.1, what="no third engine")
    wait_for(
        lambda: "4 replicas asked, 2 run" in str(status(state, "Service", MODEL)),
        20,
        what="the Service to say why it runs 2 of 4",
    )


def _docs(path: str) -> list[dict[str, Any]]:
    from llmplane.api.documents import dump_resource, parse_text

    return [dump_resource(r) for r in parse_text(Path(path).read_text(), path).resources]


def test_a_large_scale_up_keeps_health_answering_and_sigterm_stops_it(
    tmp_path: Path, processes: Processes
) -> None:
    state = tmp_path / "state"
    marker = uuid.uuid4().hex  # in every engine's environment: found if one outlives up
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLMPLANE_TEST_MARKER": marker}
    up = processes.up(state, fleet(tmp_path, 1), env=env)
    wait_for(lambda: status(state, "Playground", MODEL).get("readyReplicas") == 1, 60)

    health: list[float] = []
    starting_seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            began = time.monotonic()
            code, _, body = http(f"{up.url}/health")
            health.append(time.monotonic() - began if code == 200 else float("inf"))
            code, _, body = http(f"{up.url}/console/api/fleet")
            phases = [r["phase"] for w in body["workloads"] for r in w["replicas"]]
            starting_seen.append(phases.count("Starting"))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        code, err = apply(state, fleet(tmp_path, 100))
        assert code == 0, err
        wait_for(lambda: len(up.engine_pids()) >= 20, 60, what="the scale-up under way")
    finally:
        done.set()
        watcher.join()
    assert status(state, "Playground", MODEL).get("readyReplicas", 0) < 100, "not mid-scale-up"
    assert len(health) >= 5, health
    assert max(health) < 1.0, f"/health took up to {max(health):.2f} s during the scale-up"
    assert max(starting_seen) <= start_concurrency(), starting_seen

    up.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    began = time.monotonic()
    assert up.exited(60) == 0
    took = time.monotonic() - began
    assert took < 10, f"up took {took:.1f} s to stop during a scale-up"
    left = _marked(marker)
    assert not left, f"processes outlived up: {left}"


def _marked(marker: str) -> list[int]:
    """Live processes whose environment carries ``marker``."""
    return carrying("LLMPLANE_TEST_MARKER", marker)
