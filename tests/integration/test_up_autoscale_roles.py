"""Per-role autoscaling of a disaggregated Playground under ``llmplane up``: sim engines as the
roles, real HTTP load through the gateway's prefill/decode pairs, each role on its default
trigger (``autoscaling.ROLE_TRIGGERS``: prefill on prompts queued in its engine, decode on
sequences being generated and KV use) within its own bounds. The prefill signals themselves
(prefill tokens waiting, TTFT) are read at ``/autoscaling/signals`` during a burst and after.

- A prompt-heavy burst (long distinct prompts, two-token answers) queues prompts on the prefill
  replica (its token budget is 512 a step, so a prompt takes several steps): prefill scales up,
  decode stays at one replica. The same with prefill on a trigger of prefill tokens waiting
  alone (the gateway's count of prompt tokens sent and not yet answered).
- A decode-heavy burst (short prompts, 40-80-token answers, 24 clients) keeps about 23
  sequences decoding against a target of 16 a replica: decode scales up, prefill (which batches the
  short prompts in one step) stays at one.

The sims run at time scale 5 (an 8B model on an H100, five times slower) so the load builds
with a few clients; the autoscaler decides every 0.2 s over a 1 s window (``FAST``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from llmplane.store.paths import open_store
from llmplane.testing import Processes, always, wait_for
from tests.integration.elastic_fleets import FAST, Load
from tests.integration.role_bursts import BURSTS, prompt_heavy
from tests.integration.upcli import cli, http, sim_fleet, status

pytestmark = pytest.mark.timeout(240)

MODEL = "tiny-pd"
ROLES = {
    "kvConnector": {"type": "nixl"},
    "prefill": {
        "replicas": 1,
        "args": ["--max-num-batched-tokens", "512"],
        "elasticConfig": {"minReplicas": 1, "maxReplicas": 2},
    },
    "decode": {"replicas": 1, "elasticConfig": {"minReplicas": 1, "maxReplicas": 3}},
}


@pytest.fixture
def bursts() -> Iterator[list[Load]]:
    started: list[Load] = []
    yield started
    for item in started:
        item.stop()


def role_replicas(state: Path) -> tuple[int, int]:
    """(prefill, decode) replicas as declared now (the autoscaler writes them)."""
    with open_store(state) as store:
        dis = store.get("Playground", MODEL, "default")["spec"]["llmplane"]["disaggregation"]
    return dis["prefill"]["replicas"], dis["decode"]["replicas"]


def start_pair(tmp_path: Path, processes: Processes, roles: dict[str, Any]) -> tuple[Path, Any]:
    """``llmplane up`` of the sim pair with ``roles`` (time scale 5), once one replica of each
    role is ready and stays the only one while idle: (state directory, the ``Up``)."""
    path = tmp_path / "pd.yaml"
    path.write_text(sim_fleet(MODEL, 1, time_scale="5", disaggregation=roles))
    state = tmp_path / "state"
    up = processes.up(state, str(path), args=FAST)
    wait_for(
        lambda: status(state, "Playground", MODEL).get("readyReplicas") == 2,
        60,
        what="one ready replica per role",
    )
    always(lambda: role_replicas(state) == (1, 1), 1.0, what="idle: one replica per role")
    return state, up


@BURSTS
def test_a_burst_scales_the_role_it_loads_and_not_the_other(
    tmp_path: Path,
    processes: Processes,
    bursts: list[Load],
    burst: Callable[[int], dict[str, Any]],
    clients: int,
    scaled: str,
    metric: str,
    prefill_trigger: dict[str, Any] | None,
) -> None:
    roles = ROLES
    if prefill_trigger is not None:  # prefill on its own trigger, within the same bounds
        elastic = {**ROLES["prefill"]["elasticConfig"], "scaleTrigger": prefill_trigger}
        roles = {**ROLES, "prefill": {**ROLES["prefill"], "elasticConfig": elastic}}
    state, up = start_pair(tmp_path, processes, roles)

    bursts.append(Load(up.url, MODEL, clients, burst))
    index = 0 if scaled == "prefill" else 1
    wait_for(lambda: role_replicas(state)[index] == 2, 60, what=f"{scaled} scaled up to 2")
    # The other role stays at one replica while the burst goes on (and the loaded one within
    # its own bounds), also once the new replica serves.
    wait_for(
        lambda: status(state, "Playground", MODEL).get("readyReplicas", 0) >= 3,
        60,
        what=f"the new {scaled} replica ready",
    )
    other, bound = 1 - index, roles[scaled]["elasticConfig"]["maxReplicas"]
    always(
        lambda: role_replicas(state)[other] == 1 and role_replicas(state)[index] <= bound,
        3.0,
        what=f"only {scaled} scaled under the burst, within its own maxReplicas",
    )
    bursts[0].stop()
    assert bursts[0].failures == []

    described = cli("describe", "pl", MODEL, state_dir=state).stdout
    assert f"{scaled}: New size: 2" in described, described
    assert metric in described, described  # the event says which signal moved it
    unscaled = "decode" if scaled == "prefill" else "prefill"
    assert f"{unscaled}: New size" not in described, described


def prefill_replicas(url: str) -> list[dict[str, float]]:
    """The ready prefill replicas' signals at the gateway's ``/autoscaling/signals``."""
    code, _, body = http(f"{url}/autoscaling/signals")
    assert code == 200, body
    return list(body["workloads"][f"default/{MODEL}-prefill"]["replicas"].values())


def test_the_prefill_signals_during_a_prompt_heavy_burst_and_after(
    tmp_path: Path, processes: Processes, bursts: list[Load]
) -> None:
    """What the prefill role's triggers read, at ``/autoscaling/signals``: the prompt tokens
    the gateway sent the prefill replica and has not had a first token for (8 clients with
    ~1,500-token prompts: several thousand) and the TTFT its engine's histogram shows; both 0
    once the burst is over (a reading left over would hold replicas up)."""
    fixed = {"kvConnector": ROLES["kvConnector"], "prefill": {"replicas": 1}}
    fixed["decode"] = {"replicas": 1}
    state, up = start_pair(tmp_path, processes, fixed)
    assert [(s["prefill_tokens"], s["ttft"]) for s in prefill_replicas(up.url)] == [(0, 0)]

    bursts.append(Load(up.url, MODEL, 8, prompt_heavy))
    seen = {"prefill_tokens": 0.0, "ttft": 0.0}

    def loaded() -> bool:
        [signals] = prefill_replicas(up.url)
        for key in seen:
            seen[key] = max(seen[key], signals.get(key, 0.0))
        return seen["prefill_tokens"] >= 3000 and seen["ttft"] > 0

    wait_for(loaded, 30, what="prompt tokens waiting and a TTFT on prefill")
    bursts[0].stop()
    assert bursts[0].failures == []

    def idle() -> bool:
        [signals] = prefill_replicas(up.url)
        return all(signals[key] == 0 for key in ("inflight", "prefill_tokens", "ttft"))

    wait_for(idle, 30, what="no prompt tokens waiting and TTFT 0 on the idle prefill replica")
    assert role_replicas(state) == (1, 1)
