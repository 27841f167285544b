"""``llmplane up`` end to end: real up processes, real engine processes (the sim backend), real HTTP."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmplane.testing import Processes, Up, always, eventually, wait_for
from tests.integration.upcli import alive, cli, condition, http, sim_fleet, status

ROOT = Path(__file__).resolve().parents[2]

SIM_FLEET = sim_fleet("tiny", "REPLICAS")


def fleet(tmp_path: Path, replicas: int) -> str:
    path = tmp_path / f"fleet-{replicas}.yaml"
    path.write_text(SIM_FLEET.replace("REPLICAS", str(replicas)))
    return str(path)


@pytest.fixture
def up_factory(tmp_path: Path, processes: Processes) -> Iterator[type]:
    """``up_factory(*files, state_dir=None)``: a started ``llmplane up``; every one, and every
    engine it started, ends with the test."""

    def make(*files: str, state_dir: Path | None = None) -> Up:
        return processes.up(state_dir or tmp_path / "state", *files)

    yield make  # type: ignore[misc]


def engine_ports(up: Up) -> list[int]:
    """The ports of the engines ``up`` runs now (from their recorded command lines)."""
    import orjson

    data = orjson.loads((up.state_dir / "runtime" / "processes.json").read_bytes())
    return [int(r["argv"][r["argv"].index("--port") + 1]) for r in data["processes"]]


def ready(state_dir: Path, name: str = "tiny") -> bool:
    return condition(state_dir, "Playground", name, "Available").get("status") == "True"


def test_playground_becomes_ready_and_scales_live(tmp_path: Path, up_factory) -> None:
    state = tmp_path / "state"
    up = up_factory(fleet(tmp_path, 2))
    wait_for(lambda: ready(state), 60, what="Playground ready")
    st = status(state, "Playground", "tiny")
    assert st["replicas"] == 2
    assert "llmaz.io/model-name=tiny" in st["selector"]
    pids = wait_for(lambda: len(up.engine_pids()) == 2 and up.engine_pids(), 10)
    assert len(pids) == 2

    # `get pl` shows the columns users look for
    table = cli("get", "pl", state_dir=state).stdout
    assert table.split("\n")[0].split() == ["NAME", "READY", "REPLICAS", "MODEL", "BACKEND", "AGE"]
    assert table.split("\n")[1].split()[:5] == ["tiny", "True", "2", "tiny", "sim"]

    # scaling 2 -> 1 from another terminal takes effect live: replica 1 stops, replica 0 stays
    cli("apply", "-f", fleet(tmp_path, 1), state_dir=state)
    wait_for(lambda: len(up.engine_pids()) == 1, 60, what="scale down to one engine")
    remaining = up.engine_pids()
    assert remaining < pids
    gone = pids - remaining
    wait_for(lambda: not any(alive(p) for p in gone), 30, what="stopped replica to exit")
    wait_for(lambda: status(state, "Playground", "tiny").get("replicas") == 1, 30)
    assert ready(state)

    described = cli("describe", "pl", "tiny", state_dir=state).stdout
    assert "Conditions:" in described and "PlaygroundReady" in described
    assert "Events:" in described and "ServiceCreated" in described


def test_killed_engine_comes_back_ready(tmp_path: Path, up_factory) -> None:
    state = tmp_path / "state"
    up = up_factory(fleet(tmp_path, 1))
    wait_for(lambda: ready(state), 60)
    (pid,) = wait_for(lambda: up.engine_pids(), 10)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: up.engine_pids() and up.engine_pids() != {pid}, 60, what="engine restarted")
    wait_for(lambda: ready(state), 60, what="ready again after restart")
    logs = cli("logs", "pl/tiny", state_dir=state).stdout
    assert "LISTENING" in logs  # the sim's start line, twice: before and after the restart


def test_delete_playground_leaves_no_process(tmp_path: Path, up_factory) -> None:
    state = tmp_path / "state"
    up = up_factory(fleet(tmp_path, 2))
    wait_for(lambda: ready(state), 60)
    pids = wait_for(lambda: len(up.engine_pids()) == 2 and up.engine_pids(), 10)
    cli("delete", "pl", "tiny", state_dir=state)
    wait_for(lambda: not up.engine_pids(), 60, what="engines stopped after delete")
    wait_for(lambda: not any(alive(p) for p in pids), 30)
    wait_for(
        lambda: cli("get", "isvc", "tiny", state_dir=state, check=False).returncode == 1,
        30,
        what="owned Service deleted",
    )


def test_restart_keeps_resources_and_sigterm_stops_engines(tmp_path: Path, up_factory) -> None:
    state = tmp_path / "state"
    up = up_factory(fleet(tmp_path, 1))
    wait_for(lambda: ready(state), 60)
    pids = wait_for(lambda: up.engine_pids(), 10)
    assert up.stop(signal.SIGTERM) == 0
    assert not any(alive(p) for p in pids)  # drained and stopped before up exited

    again = up_factory(state_dir=state)  # no files: everything comes from the store
    wait_for(lambda: len(again.engine_pids()) == 1, 60, what="engine started after restart")
    wait_for(lambda: ready(state), 60, what="ready after restart")
    assert cli("get", "om", "tiny", state_dir=state).returncode == 0


def test_sigkilled_up_leaves_no_orphans(tmp_path: Path, up_factory) -> None:
    state = tmp_path / "state"
    up = up_factory(fleet(tmp_path, 2))
    wait_for(lambda: ready(state), 60)
    pids = wait_for(lambda: len(up.engine_pids()) == 2 and up.engine_pids(), 10)
    up.stop(signal.SIGKILL)
    # engines die with their parent (PDEATHSIG), and a restarted up would reap any that did not
    wait_for(lambda: not any(alive(p) for p in pids), 30, what="engines to die with up")
    again = up_factory(state_dir=state)
    wait_for(lambda: len(again.engine_pids()) == 2, 60, what="engines started after restart")
    wait_for(lambda: ready(state), 60)


def test_missing_engine_reports_engine_not_installed(tmp_path: Path, up_factory) -> None:
    state = tmp_path / "state"
    doc = SIM_FLEET.replace("REPLICAS", "1").replace("backendName: sim", "backendName: tgi")
    path = tmp_path / "tgi.yaml"
    path.write_text(doc.replace('    args: ["--time-scale", "0.01"]\n', ""))
    up = up_factory(str(path))
    cond = wait_for(
        lambda: (
            (c := condition(state, "Playground", "tiny", "Available")).get("reason")
            == "EngineNotInstalled"
            and c
        ),
        60,
        what="EngineNotInstalled",
    )
    assert cond["status"] == "False"
    assert "text-generation-inference" in cond["message"]  # the install hint
    assert not up.engine_pids()


def test_invalid_file_fails_before_starting(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent(SIM_FLEET.replace("REPLICAS", "-1")))
    proc = cli("up", "-f", str(bad), "--port", "0", state_dir=tmp_path / "s", check=False)
    assert proc.returncode == 1
    assert "Playground/tiny: spec.replicas" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_waits_for_model_creation_then_proceeds(tmp_path: Path, up_factory) -> None:
    state = tmp_path / "state"
    docs = SIM_FLEET.replace("REPLICAS", "1").split("---")
    pg_only = tmp_path / "pg.yaml"
    pg_only.write_text(docs[1])
    up_factory(str(pg_only))
    cond = wait_for(
        lambda: (
            (c := condition(state, "Playground", "tiny", "Progressing")).get("reason")
            == "AbortProcessing"
            and c
        ),
        30,
    )
    assert "Waiting for model creation" in cond["message"]
    model = tmp_path / "model.yaml"
    model.write_text(docs[0])
    cli("apply", "-f", str(model), state_dir=state)
    wait_for(lambda: ready(state), 60, what="ready once the model exists")


def test_scale_down_drains_in_flight_requests(tmp_path: Path, up_factory) -> None:
    import asyncio

    import aiohttp

    state = tmp_path / "state"
    # The sim would finish in-flight work on SIGTERM by itself; with no grace of its own, only
    # llmplane's drain (waiting for the gateway's in-flight count) saves the request.
    slow = SIM_FLEET.replace(
        '"--time-scale", "0.01"', '"--time-scale", "1", "--shutdown-timeout", "0.001"'
    )
    two, one = tmp_path / "two.yaml", tmp_path / "one.yaml"
    two.write_text(slow.replace("REPLICAS", "2"))
    one.write_text(slow.replace("REPLICAS", "1"))
    up = up_factory(str(two))
    wait_for(lambda: status(state, "Playground", "tiny").get("readyReplicas") == 2, 60)

    async def long_request(session: aiohttp.ClientSession, i: int) -> tuple[int, str, int]:
        body = {"model": "tiny", "prompt": f"request {i}", "max_tokens": 400, "ignore_eos": True}
        async with session.post(f"{up.url}/v1/completions", json=body) as resp:
            data = await resp.json()
            return (
                resp.status,
                resp.headers["x-llmplane-endpoint"],
                data["usage"]["completion_tokens"],
            )

    async def scenario() -> list[tuple[int, str, int]]:
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(long_request(session, i)) for i in range(2)]

            async def running(port: int) -> bool:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
                    text = await r.text()
                return any(
                    line.startswith("vllm:num_requests_running") and float(line.split()[-1]) >= 1
                    for line in text.splitlines()
                )

            async def one_on_each() -> bool:
                return all([await running(port) for port in engine_ports(up)])

            await eventually(one_on_each, 30, what="a request running on each replica")
            await asyncio.to_thread(cli, "apply", "-f", str(one), state_dir=state)
            return await asyncio.gather(*tasks)

    results = asyncio.run(scenario())
    assert {r[1] for r in results} == set(results[0][1:2]) | set(results[1][1:2])
    assert len({r[1] for r in results}) == 2, (
        results
    )  # one request was on the replica that went away
    assert all(status_code == 200 and tokens == 400 for status_code, _, tokens in results), results
    wait_for(lambda: len(up.engine_pids()) == 1, 60, what="scaled down to one engine")


ROUTED = """
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {name: tiny-servers}
spec:
  model: tiny
  inferenceEngine: vLLM
  workloadSelector:
    matchLabels: {llmaz.io/model-name: tiny}
  trafficPolicy:
    retry: {attempts: 2}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {name: chat}
spec:
  modelName: chat
  rules:
    - name: premium
      modelMatch:
        headers:
          x-tier: {exact: premium}
      targetModels:
        - modelServerName: tiny-servers
    - name: everyone-else
      targetModels:
        - modelServerName: nowhere
"""


def test_model_route_selects_playground_replicas_by_label(tmp_path: Path, up_factory) -> None:
    state = tmp_path / "state"
    routes = tmp_path / "routes.yaml"
    routes.write_text(ROUTED)
    up = up_factory(fleet(tmp_path, 2), str(routes))
    wait_for(lambda: status(state, "Playground", "tiny").get("readyReplicas") == 2, 60)
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    served: set[str] = set()
    sent = iter(range(10_000))

    def premium_request() -> int:
        body["messages"][0]["content"] = f"hi {next(sent)}"
        code, headers, data = http(f"{up.url}/v1/chat/completions", body, {"x-tier": "premium"})
        assert code == 200, data
        assert data["model"] == "tiny"  # rewritten to ModelServer.spec.model
        served.add(headers["x-llmplane-endpoint"])
        return len(served)

    # Short prompts, one at a time: once both replicas' loads are scraped every score ties and
    # the tie-break is random, so both replicas serve the route's requests.
    wait_for(lambda: premium_request() == 2, 20, what="both replicas serving the route 'chat'")
    # the second rule matches but its ModelServer does not exist: no endpoint, a clear error
    code, _, data = http(f"{up.url}/v1/chat/completions", body)
    assert code in (404, 503) and data["error"]["message"]
    code, _, data = http(f"{up.url}/v1/chat/completions", {**body, "model": "nope"})
    assert code == 404 and data["error"]["code"]
    models = {m["id"] for m in http(f"{up.url}/v1/models")[2]["data"]}
    assert {"tiny", "chat"} <= models


def test_model_load_failure_shows_on_the_model_and_the_playground(
    tmp_path: Path, up_factory
) -> None:
    state = tmp_path / "state"
    path = tmp_path / "missing.yaml"
    path.write_text(
        SIM_FLEET.replace("REPLICAS", "1").replace("host:///dev/null", "host:///no/such/model.gguf")
    )
    up = up_factory(str(path))
    model = wait_for(
        lambda: (
            (c := condition(state, "OpenModel", "tiny", "Ready", namespace=None)).get("reason")
            == "NotFound"
            and c
        ),
        30,
        what="OpenModel NotFound",
    )
    assert model["status"] == "False" and "/no/such/model.gguf" in model["message"]
    pg = wait_for(
        lambda: (
            (c := condition(state, "Playground", "tiny", "Available")).get("reason") == "NotFound"
            and c
        ),
        30,
        what="Playground shows the cause",
    )
    assert "failed to load" in pg["message"]
    # The planning error is the Service's Progressing=False, as under the operator.
    svc = condition(state, "Service", "tiny", "Progressing")
    assert (svc["status"], svc["reason"]) == ("False", "NotFound")
    assert not up.engine_pids()  # nothing starts without its model


def test_engine_missing_behind_a_launcher_is_not_a_crash_loop(tmp_path: Path, up_factory) -> None:
    # ollama starts through llmplane's launcher, which exits 127 ("command not found") when
    # ollama is absent (as on this machine): EngineNotInstalled, no restarts.
    assert shutil.which("ollama") is None
    state = tmp_path / "state"
    up = up_factory(str(ROOT / "examples" / "ollama.yaml"))
    name = "qwen2-0--5b-ollama"
    cond = wait_for(
        lambda: (
            (c := condition(state, "Playground", name, "Available")).get("reason")
            == "EngineNotInstalled"
            and c
        ),
        60,
        what="EngineNotInstalled",
    )
    assert "ollama.com/download" in cond["message"]
    # It stays so: no engine is started again (a crash loop would restart it within the
    # first back-off, 1 s), and the condition does not flap.
    always(
        lambda: (
            not up.engine_pids()
            and condition(state, "Playground", name, "Available")["reason"] == "EngineNotInstalled"
        ),
        2.0,
        what="no engine and EngineNotInstalled",
    )


def test_engines_run_with_the_interpreter_running_llmplane(tmp_path: Path, up_factory) -> None:
    # `~/venv/bin/llmplane up` with the venv not on PATH (pipx, a systemd unit): the sim engine
    # (`python -m llmplane.sim`) must start with llmplane's own interpreter, not whatever `python`
    # PATH finds (here: none at all).
    script = Path(sys.executable).parent / "llmplane"
    assert script.is_file(), f"the llmplane script is not installed beside {sys.executable}"
    path = "/usr/bin:/bin"
    assert not any(os.path.exists(os.path.join(d, "python")) for d in path.split(":")), (
        "this test needs a PATH with no `python` on it"
    )
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:  # running from a worktree
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    state = tmp_path / "state"
    up = Up(state, fleet(tmp_path, 1), command=[str(script)], env=env)
    try:
        up.start()  # a failed start stops what it started
        wait_for(lambda: ready(state), 60, what="Playground ready")
        code, _, body = http(
            f"{up.url}/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
        assert code == 200, body
        assert body["usage"]["completion_tokens"] > 0
        pid = next(iter(up.engine_pids()))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            engine_python = f.read().split(b"\0")[0].decode()
        assert os.path.samefile(engine_python, sys.executable)
    finally:
        up.kill_everything()


def test_crash_loop_says_the_engine_fails_and_points_at_its_logs(
    tmp_path: Path, up_factory
) -> None:
    # An engine that rejects its arguments (as vLLM did the old --speculative_model) exits at
    # once: the condition and the gateway's 503 say it is failing, not "starting".
    path = tmp_path / "bad.yaml"
    path.write_text(
        sim_fleet("tiny", 1).replace(
            'args: ["--time-scale", "0.01"]', 'args: ["--no-such-flag", "1"]'
        )
    )
    state = tmp_path / "state"
    up = up_factory(str(path))
    cond = wait_for(
        lambda: (
            (c := condition(state, "Playground", "tiny", "Available")).get("reason")
            == "CrashLoopBackOff"
            and c
        ),
        60,
        what="CrashLoopBackOff",
    )
    assert "the engine is failing" in cond["message"]
    assert "`llmplane logs pl/tiny`" in cond["message"]
    assert "--no-such-flag" in cond["message"]  # the engine's own complaint, from its log

    def refused() -> tuple[int, dict]:
        code, _, body = http(
            f"{up.url}/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 1}
        )
        return (code, body) if "failing" in str(body) else None  # type: ignore[return-value]

    code, body = wait_for(refused, 30, what="a 503 saying the engine fails")
    assert code == 503
    message = body["error"]["message"]
    assert "its engine is failing (CrashLoopBackOff)" in message
    assert "llmplane logs pl/tiny" in message
    assert "starting or scaled to zero" not in message


def test_gpus_are_placed_per_replica_and_an_unplaceable_one_stays_pending(
    tmp_path: Path, processes
) -> None:
    # `up --gpus 0,1,2` (a configured device list: no GPU here). Flavors in priority order: a
    # two-GPU one, then a one-GPU one. Three replicas: [0,1] on the first, [2] on the second,
    # the third fits neither and waits Pending with the reason instead of sharing a GPU.
    path = tmp_path / "gpus.yaml"
    path.write_text(
        sim_fleet("tiny", 3).replace(
            '  source: {uri: "host:///dev/null"}',
            '  source: {uri: "host:///dev/null"}\n'
            "  inferenceConfig:\n"
            "    flavors:\n"
            "      - {name: a100x2, limits: {nvidia.com/gpu: 2}}\n"
            "      - {name: t4, limits: {nvidia.com/gpu: 1}}",
        )
    )
    state = tmp_path / "state"
    up = processes.up(state, str(path), args=["--gpus", "0,1,2"])
    wait_for(lambda: len(up.engine_pids()) == 2, 60, what="two engines placed")
    cond = wait_for(
        lambda: (
            (c := condition(state, "Playground", "tiny", "Available")).get("reason")
            == "Unschedulable"
            and c
        ),
        60,
        what="the third replica Unschedulable",
    )
    assert "needs 2 nvidia.com/gpu (0 of 3 free)" in cond["message"], cond
    assert "needs 1 nvidia.com/gpu (0 of 3 free)" in cond["message"], cond
    devices = []
    for pid in up.engine_pids():
        env = dict(
            item.split(b"=", 1)
            for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if b"=" in item
        )
        devices.append(env[b"CUDA_VISIBLE_DEVICES"].decode())
    assert sorted(devices) == ["0,1", "2"]
    assert len(up.engine_pids()) == 2  # nothing overcommitted


def test_a_bad_gpu_list_is_one_line(tmp_path: Path) -> None:
    out = cli("up", "--gpus", "0,,1", state_dir=tmp_path / "s", check=False)
    assert out.returncode != 0
    assert "--gpus '0,,1': expected a comma-separated list" in out.stderr
    assert "Traceback" not in out.stderr
