"""``/console/api/logs`` on ``llmplane up`` refuses replica numbers that are not small ASCII
integers with the API's JSON 400, never a 500 (issue 27, item 13)."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import orjson

from llmplane.testing import Processes, wait_for
from tests.integration.upcli import sim_fleet, status

BAD_REPLICAS = [
    "\u0661",  # ARABIC-INDIC DIGIT ONE: str.isdigit() says yes
    "\u00b2",  # SUPERSCRIPT TWO: isdigit() yes, int() no
    "\uff11",  # FULLWIDTH DIGIT ONE
    "9" * 5000,  # past int()'s digit limit
    "1" * 7,
    "-1",
    "+1",
    " 1",
    "1\n",
    "0x1",
    "1e3",
]


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


def test_hostile_replica_numbers_get_a_json_400(tmp_path: Path, processes: Processes) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet("tiny", 1))
    up = processes.up(tmp_path / "state", str(fleet))
    wait_for(
        lambda: status(up.state_dir, "Playground", "tiny").get("readyReplicas") == 1,
        90,
        every=0.25,
        what="the replica ready",
    )
    base = f"{up.url}/console/api/logs?workload=default/tiny&replica="
    code, _, body = get(base + "0")
    assert code == 200 and "starting default/tiny replica 0" in orjson.loads(body)["text"]
    code, _, body = get(base + "999999")  # well-formed, no such replica: a note, not an error
    assert code == 200 and orjson.loads(body)["note"], body
    for replica in BAD_REPLICAS:
        code, content_type, body = get(base + urllib.parse.quote(replica))
        assert code == 400 and content_type == "application/json", (replica[:20], code, body)
        assert "replica=INDEX" in orjson.loads(body)["error"]["message"], body
    assert "Traceback" not in up.output()
