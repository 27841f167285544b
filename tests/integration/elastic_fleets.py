"""``llmplane up`` with elastic sim fleets: the autoscaler's fast flags, a scale-to-zero trigger,
the Playground's replicas in the store, a value from the gateway's /metrics."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmplane.store.paths import open_store
from tests.integration.upcli import http, sim_fleet

FAST = ["--autoscale-interval", "0.2", "--autoscale-window", "1"]


def elastic_fleet(
    tmp_path: Path, elastic: str, name: str = "tiny", replicas: int = 1, time_scale: str = "5"
) -> str:
    """The sim fleet of upcli with ``elastic`` (YAML lines under spec) added; the sim is slowed
    (time scale 5: about 2 s per 60-token request) so requests stay in flight."""
    text = sim_fleet(name, replicas, time_scale=time_scale) + "  elasticConfig:\n" + elastic
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return str(path)


def spec_replicas(state: Path, name: str = "tiny") -> int:
    with open_store(state) as store:
        obj = store.get("Playground", name, "default") or {}
    return int((obj.get("spec") or {}).get("replicas", -1))


def metric(url: str, name: str) -> float:
    """One sample's value from the gateway's /metrics (0 when absent)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


SCALE_TO_ZERO = """    minReplicas: 0
    maxReplicas: 2
    scaleToZeroAfterSeconds: 2
    scaleTrigger:
      hpa:
        metrics:
        - type: Pods
          pods:
            metric: {name: llmplane_gateway_endpoint_inflight}
            target: {type: AverageValue, averageValue: 4}
        behavior:
          scaleDown: {stabilizationWindowSeconds: 1}
"""


class Load:
    """``clients`` threads sending completions back to back until ``stop()``: ``body(n)`` is
    the n-th request (default: a short prompt, 60 tokens answered)."""

    def __init__(
        self,
        url: str,
        model: str,
        clients: int,
        body: Callable[[int], dict[str, Any]] | None = None,
    ) -> None:
        self.url, self.model = url, model
        self.body = body or (lambda _n: {"prompt": "hello there", "max_tokens": 60})
        self.sent = itertools.count()
        self.done = threading.Event()
        self.failures: list[int] = []
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _loop(self) -> None:
        while not self.done.is_set():
            body = {"model": self.model, **self.body(next(self.sent))}
            code, _, _ = http(f"{self.url}/v1/completions", body)
            if code != 200:
                self.failures.append(code)

    def stop(self) -> None:
        self.done.set()
        for t in self.threads:
            t.join(timeout=60)
