"""Flow control inside ``llmplane up`` (on by default): a sim Playground that saturates at once
(one running sequence, ``saturationMaxInflight: 1``), Tenants with keys made by ``llmplane keys``;
under saturation a Critical tenant's requests overtake a Sheddable tenant's queued before them.
The finer behaviour (fairness, TTL, bounds, a client leaving) is test_gateway_flowcontrol.py."""

from __future__ import annotations

import contextlib
import http.client as httpclient
import socket
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families

from llmplane.testing import Processes, wait_for
from tests.integration.upcli import cli, http, status

FLEET = """
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {name: tiny}
spec:
  familyName: tiny
  source: {uri: "host:///dev/null"}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {name: tiny}
spec:
  replicas: 1
  modelClaim: {modelName: tiny}
  backendRuntimeConfig:
    backendName: sim
    args: ["--time-scale", "1", "--max-num-seqs", "1"]
"""
TENANTS = {"filler": "Default", "bulk": "Sheddable", "urgent": "Critical"}


def tenant(name: str, criticality: str) -> str:
    return (
        "apiVersion: llmplane.io/v1alpha1\nkind: Tenant\n"
        f"metadata: {{name: {name}}}\nspec: {{criticality: {criticality}}}\n"
    )


def metric(url: str, name: str, **labels: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def test_up_queues_by_priority_under_saturation(tmp_path: Path, processes: Processes) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET + "".join("---\n" + tenant(n, c) for n, c in TENANTS.items()))
    config = tmp_path / "gateway.yaml"
    # The in-flight cap, not the queue estimate: a scrape sent while a request is still on its
    # way into the engine reports it neither running nor waiting, and for that moment the
    # estimate lets one more through (harmless in service, but this test counts every queued
    # request).
    config.write_text("gateway:\n  saturationMaxInflight: 1\n")
    up = processes.up(tmp_path / "state", str(fleet), args=["--gateway-config", str(config)])
    state = up.state_dir
    wait_for(
        lambda: status(state, "Playground", "tiny").get("readyReplicas") == 1,
        90,
        what="Playground tiny ready",
    )
    keys = {
        name: cli("keys", "create", name, state_dir=state).stdout.strip().splitlines()[-1]
        for name in TENANTS
    }

    def complete(name: str, tokens: int) -> tuple[int, float]:
        body = {"model": "tiny", "prompt": f"hello from {name}", "max_tokens": tokens}
        code, _, _ = http(f"{up.url}/v1/completions", body, {"x-api-key": keys[name]})
        return code, time.monotonic()

    # The gateway serves with the keys (it has seen the Tenants).
    wait_for(lambda: complete("filler", 1)[0] == 200, 30, what="served with a tenant's key")
    # Two fillers keep the replica busy (one runs, one waits in the gateway) until the test
    # hangs up on them: however slow the machine, nothing is dispatched before that.
    fillers = [Filler(up.url, keys["filler"])]
    try:
        wait_for(lambda: fillers[0].status is not None, 30, what="the first filler answered")
        fillers.append(Filler(up.url, keys["filler"]))
        wait_for(
            lambda: (
                metric(up.url, "llmplane_gateway_endpoint_inflight")
                + metric(up.url, "llmplane_gateway_flow_queue")
                == 2
            ),
            30,
            what="both fillers taken by the gateway",
        )
        with ThreadPoolExecutor(4) as pool:
            bulk = [pool.submit(complete, "bulk", 3) for _ in range(2)]
            wait_for(
                lambda: metric(up.url, "llmplane_gateway_flow_queue", band="Sheddable") == 2,
                30,
                what="two Sheddable requests queued",
            )
            urgent = [pool.submit(complete, "urgent", 3) for _ in range(2)]
            wait_for(
                lambda: (
                    metric(up.url, "llmplane_gateway_flow_queue", band="Critical", tenant="urgent")
                    == 2
                ),
                30,
                what="two Critical requests queued",
            )
            for filler in fillers:  # the running one frees the replica, the queued one leaves
                filler.hang_up()
            bulk_done = [f.result() for f in bulk]
            urgent_done = [f.result() for f in urgent]
    finally:
        for filler in fillers:
            filler.hang_up()
    assert [f.status for f in fillers] == [200, None]  # the second one never left the queue
    assert [c for c, _ in bulk_done + urgent_done] == [200] * 4
    # Queued after the Sheddable ones, served before them.
    assert max(t for _, t in urgent_done) < min(t for _, t in bulk_done)
    assert metric(up.url, "llmplane_gateway_flow_wait_seconds_count", band="Critical") == 2


class Filler:
    """A long streamed completion (minutes at the sim's pace) sent from a thread; ``hang_up``
    closes its connection, which cancels it in the gateway (queued or running)."""

    def __init__(self, url: str, key: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.conn = httpclient.HTTPConnection(parts.hostname, parts.port, timeout=120)
        body = {"model": "tiny", "prompt": "fill", "max_tokens": 20000, "stream": True}
        self.conn.request(
            "POST",
            "/v1/completions",
            orjson.dumps(body),
            {"content-type": "application/json", "x-api-key": key},
        )
        self.status: int | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        # A hang-up ends the read in whichever way http.client reports a closed socket.
        with contextlib.suppress(Exception):
            response = self.conn.getresponse()  # blocks while the request waits in the gateway
            self.status = response.status
            while response.read1(65536):
                pass
        self.conn.close()

    def hang_up(self) -> None:
        sock = self.conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(30)
        assert not self.thread.is_alive(), "a filler's reader did not end after hanging up"
