"""``llmplane up`` with a disaggregated Playground on the sim (examples/disaggregated-sim.yaml):
two role workloads, and the gateway serves the model name on a prefill + decode pair."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import orjson

from llmplane.store.paths import open_store
from llmplane.testing import Processes, wait_for
from tests.integration.upcli import cli, condition, http, sim_fleet, status

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "disaggregated-sim.yaml"
MODEL = "llama3-8b-pd"


def role_ports(state_dir: Path) -> dict[str, set[int]]:
    """Engine ports per role, from the runtime's record of the processes it started."""
    data = orjson.loads((state_dir / "runtime" / "processes.json").read_bytes())
    out: dict[str, set[int]] = {"prefill": set(), "decode": set()}
    for record in data["processes"]:
        argv = record["argv"]
        role = argv[argv.index("--role") + 1]
        out[role].add(int(argv[argv.index("--port") + 1]))
    return out


def external_tokens(port: int) -> float:
    """The sim's count of prompt tokens it took from a KV transfer instead of computing
    (``vllm:external_prefix_cache_hits_total``, as vLLM with a KV connector)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(r"^vllm:external_prefix_cache_hits_total\{[^}]*\} (\S+)", text, re.M)
    assert match, "a sim with a role exports vllm:external_prefix_cache_hits_total"
    return float(match.group(1))


# The explicit Kthena way still works on the labels llmplane gives the roles.
ROUTED = f"""
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {{name: pd-servers}}
spec:
  model: {MODEL}
  inferenceEngine: vLLM
  workloadSelector:
    matchLabels: {{llmaz.io/model-name: {MODEL}}}
    pdGroup:
      groupKey: llmplane.io/pd-group
      prefillLabels: {{llmplane.io/role: prefill}}
      decodeLabels: {{llmplane.io/role: decode}}
  kvConnector: {{type: nixl}}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {{name: pd-chat}}
spec:
  modelName: pd-chat
  rules:
    - targetModels:
        - modelServerName: pd-servers
"""


def test_disaggregated_example_serves_on_pairs(tmp_path: Path, processes: Processes) -> None:
    state = tmp_path / "state"
    # A smaller copy of the example: 1 prefill + 2 decode (the machine is shared).
    doc = (
        EXAMPLE.read_text()
        .replace("replicas: 2", "replicas: 1")
        .replace("replicas: 4", "replicas: 2")
    )
    path = tmp_path / "pd.yaml"
    path.write_text(doc)
    routes = tmp_path / "routes.yaml"
    routes.write_text(ROUTED)
    up = processes.up(state, str(path), str(routes))

    def available() -> bool:
        return condition(state, "Playground", MODEL, "Available").get("status") == "True"

    wait_for(available, 90, what="the disaggregated Playground to be Available")
    assert status(state, "Playground", MODEL)["readyReplicas"] == 3
    assert {s.split()[0] for s in cli("get", "isvc", state_dir=state).stdout.splitlines()[1:]} == {
        f"{MODEL}-prefill",
        f"{MODEL}-decode",
    }
    ports = role_ports(state)
    assert (len(ports["prefill"]), len(ports["decode"])) == (1, 2)
    before = {p: external_tokens(p) for p in ports["decode"]}

    prompt = "Tell me about disaggregated serving " * 20
    chat = {"messages": [{"role": "user", "content": prompt}]}
    requests = [
        (MODEL, "/v1/chat/completions", chat),
        (MODEL, "/v1/completions", {"prompt": prompt}),
        ("pd-chat", "/v1/chat/completions", chat),  # through the explicit ModelServer
    ]
    for model, path_, body in requests:
        code, headers, data = http(f"{up.url}{path_}", {"model": model, "max_tokens": 5, **body})
        assert code == 200, data
        assert data["usage"]["completion_tokens"] == 5
        prefill = int(headers["x-llmplane-prefill-endpoint"].rsplit(":", 1)[1])
        decode = int(headers["x-llmplane-endpoint"].rsplit(":", 1)[1])
        assert prefill in ports["prefill"] and decode in ports["decode"], headers
    # The decode replicas took the prompts from the prefill side instead of computing them.
    moved = sum(external_tokens(p) - before[p] for p in ports["decode"])
    assert moved > 0, "no prompt token came from the prefill replica"

    # The console's fleet shows one workload per role, with its replicas and endpoints, and
    # the KV the pair moved: what the decode replicas report, once the gateway scraped it.
    def roles() -> dict[str, dict]:
        _, _, fleet = http(f"{up.url}/console/api/fleet")
        return {w["role"]: w for w in fleet["workloads"] if w["playground"] == MODEL}

    received = sum(external_tokens(p) for p in ports["decode"])
    wait_for(
        lambda: roles()["decode"]["kvMoved"] == received,
        30,
        what=f"the fleet's decode card showing {received} tokens of KV moved",
    )
    workloads = roles()
    assert set(workloads) == {"prefill", "decode"}
    assert workloads["prefill"]["kvMoved"] is None  # the pair's KV is counted where it lands
    for role, workload in workloads.items():
        assert workload["name"] == f"{MODEL}-{role}"
        assert workload["ready"] == workload["desired"] == len(ports[role])
        assert {r["port"] for r in workload["replicas"]} == ports[role]


def test_roles_scale_to_zero_together_and_a_request_wakes_the_pair(
    tmp_path: Path, processes: Processes
) -> None:
    elastic = (
        "{minReplicas: 0, maxReplicas: 2, scaleToZeroAfterSeconds: 2, "
        "scaleTrigger: {hpa: {behavior: {scaleDown: {stabilizationWindowSeconds: 1}}}}}"
    )
    doc = EXAMPLE.read_text()
    doc = doc.replace("replicas: 2", f"replicas: 1\n        elasticConfig: {elastic}")
    doc = doc.replace("replicas: 4", f"replicas: 1\n        elasticConfig: {elastic}")
    path = tmp_path / "pd.yaml"
    path.write_text(doc)
    state = tmp_path / "state"
    up = processes.up(
        state, str(path), args=["--autoscale-interval", "0.2", "--autoscale-window", "1"]
    )

    def role_replicas() -> tuple[int, int]:
        with open_store(state) as store:
            dis = store.get("Playground", MODEL, "default")["spec"]["llmplane"]["disaggregation"]
        return dis["prefill"]["replicas"], dis["decode"]["replicas"]

    wait_for(lambda: role_replicas() == (0, 0), 60, what="both roles scaled to zero when idle")
    wait_for(lambda: not up.engine_pids(), 30, what="no engine left")

    # A request is held while both roles start, then served on the pair.
    body = {"model": MODEL, "prompt": "wake up " * 50, "max_tokens": 4}
    code, headers, data = http(f"{up.url}/v1/completions", body)
    assert code == 200, data
    assert "x-llmplane-prefill-endpoint" in headers
    assert role_replicas() == (1, 1)
    assert len(up.engine_pids()) == 2


def test_the_playground_names_the_role_that_is_not_ready(
    tmp_path: Path, processes: Processes
) -> None:
    """A decode role whose engine cannot start (an engine argument the sim refuses): the
    prefill role runs, and the Playground's Available condition says decode is not ready and
    why; the same with the roles the other way round."""
    for broken, working in (("decode", "prefill"), ("prefill", "decode")):
        roles = {
            "kvConnector": {"type": "nixl"},
            working: {"replicas": 1},
            broken: {"replicas": 1, "args": ["--max-num-seqs", "0"]},
        }
        path = tmp_path / f"{broken}.yaml"
        path.write_text(sim_fleet(MODEL, 1, disaggregation=roles))
        state = tmp_path / f"state-{broken}"
        processes.up(state, str(path))

        service = f"{MODEL}-{working}"
        wait_for(
            lambda service=service, state=state: (
                condition(state, "Service", service, "Available").get("status") == "True"
            ),
            60,
            what=f"the {working} role ready",
        )

        def failing(state: Path = state, working: str = working) -> dict:
            found = condition(state, "Playground", MODEL, "Available")
            crashing = found.get("reason") == "CrashLoopBackOff"
            return found if crashing and working not in found.get("message", "") else {}

        available = wait_for(failing, 60, what=f"the Playground to name {broken} alone")
        assert (available["status"], available["reason"]) == ("False", "CrashLoopBackOff")
        assert available["message"].startswith(f"{broken} not ready: replica 0: "), available
        assert "--max-num-seqs must be >= 1" in available["message"], available  # the engine's
        assert working not in available["message"], available
        processes.stop()
