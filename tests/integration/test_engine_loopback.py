"""A local engine listens on loopback only, whatever its resource says (issue 27, item 8).

``llmplane up`` with real sim replicas whose Playground args try to open them to the network
with the spellings argparse accepts (prefixes, ``=`` forms, IPv6), and one BackendRuntime whose
engine binds every interface whatever its flags say: the first are served on 127.0.0.1 only,
the last is stopped and reported (``ListensBeyondLoopback``), never Ready.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
from pathlib import Path

import orjson

from llmplane.runtime.sockets import listening
from llmplane.testing import Processes, always, wait_for
from tests.integration.upcli import http, status

HOSTILE = {
    "hos": ["--hos", "0.0.0.0"],
    "ho-eq": ["--ho=0.0.0.0"],
    "h-v6": ["--h", "::"],
    "host-and-po": ["--host=0.0.0.0", "--po", "1"],
    "hos-twice": ["--hos=::", "--port", "2", "--ho", "0.0.0.0"],
}

# An engine that binds every interface whatever flags it gets (as one configured by an
# environment variable or a config file would): the sim, its host forced after our flags.
EXPOSED_BACKEND = f"""
apiVersion: inference.llmaz.io/v1alpha1
kind: BackendRuntime
metadata: {{name: exposed}}
spec:
  command: ["unused"]
  image: example/unused
  version: "1"
  recommendedConfigs: [{{name: default, args: ["--model", "{{{{ .ModelName }}}}"]}}]
  local:
    command: ["sh", "-c", 'exec "$0" -m llmplane.sim "$@" --host 0.0.0.0', {json.dumps(sys.executable)}]
  readinessProbe:
    periodSeconds: 1
    httpGet: {{path: /health, port: 8080}}
"""


def playground(name: str, backend: str, args: list[str], model: str = "tiny") -> str:
    return f"""
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {{name: {name}}}
spec:
  replicas: 1
  modelClaim: {{modelName: {model}}}
  backendRuntimeConfig:
    backendName: {backend}
    args: {json.dumps(["--time-scale", "0.01", *args])}
"""


MODEL = """
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {name: NAME}
spec:
  familyName: tiny
  source: {uri: "host:///dev/null"}
"""


def outward_address() -> str | None:
    """This machine's address on its default route (not loopback), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def refused(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect((address, port))
        except OSError:
            return True
    return False


def engines(state_dir: Path) -> dict[str, dict]:
    """The recorded engine processes by workload name (pid, argv as started)."""
    path = state_dir / "runtime" / "processes.json"
    with contextlib.suppress(FileNotFoundError, ValueError):
        records = orjson.loads(path.read_bytes())["processes"]
        return {r["workload"].split("/")[-1]: r for r in records}
    return {}


def test_engine_args_never_open_a_local_engine_to_the_network(
    tmp_path: Path, processes: Processes
) -> None:
    docs = [MODEL.replace("NAME", "tiny"), MODEL.replace("NAME", "other"), EXPOSED_BACKEND]
    docs.append(playground("exposed", "exposed", [], model="other"))
    docs += [playground(name, "sim", args) for name, args in HOSTILE.items()]
    path = tmp_path / "fleet.yaml"
    path.write_text("---".join(docs))
    up = processes.up(tmp_path / "state", str(path), args=["-v"])
    outward = outward_address()

    for name in HOSTILE:
        wait_for(
            lambda n=name: status(up.state_dir, "Playground", n).get("readyReplicas") == 1,
            120,
            every=0.25,
            what=f"Playground {name} ready",
        )
        record = engines(up.state_dir)[name]
        port = int(record["argv"][record["argv"].index("--port") + 1])
        assert "0.0.0.0" not in record["argv"] and "::" not in record["argv"], record["argv"]
        bound = listening(record["pid"])
        assert bound == [("127.0.0.1", port)], (name, bound, record["argv"])
        assert not refused("127.0.0.1", port)
        if outward is not None:
            assert refused(outward, port), f"{name}: the engine answers on {outward}:{port}"

    def exposed_failed() -> bool:
        conditions = status(up.state_dir, "Playground", "exposed").get("conditions") or []
        return any(
            c.get("reason") == "ListensBeyondLoopback" and "0.0.0.0:" in c.get("message", "")
            for c in conditions
        )

    wait_for(
        exposed_failed, 120, every=0.25, what="the exposed engine reported ListensBeyondLoopback"
    )
    assert "exposed" not in engines(up.state_dir), "the exposed engine still runs"
    # Its model is not held for an engine that will not come: a 503 that says why, at once.
    _, _, doc = wait_for(
        lambda: (
            (r := http(f"{up.url}/v1/completions", {"model": "other", "prompt": "hi"}))[0] == 503
            and r
        ),
        30,
        every=0.25,
        what="503 for the exposed engine's model",
    )
    assert "ListensBeyondLoopback" in doc["error"]["message"], doc
    # Stopped for good (not restarted into the same exposure) and never Ready.
    always(
        lambda: (
            "exposed" not in engines(up.state_dir)
            and not status(up.state_dir, "Playground", "exposed").get("readyReplicas")
        ),
        3,
        every=0.25,
        what="the exposed engine stays stopped",
    )
