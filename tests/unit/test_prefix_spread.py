"""The prefix-spread scorer: new prompt heads spread evenly, known ones left to affinity (pure)."""

from __future__ import annotations

import copy
import random

import pytest

from llmplane.gateway.discovery import Endpoint
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler import prefix_spread
from llmplane.gateway.scheduler.config import DEFAULT_CONFIG, ConfigError, build_scheduler
from llmplane.gateway.scheduler.framework import SchedulingContext
from llmplane.gateway.scheduler.prefix_spread import PrefixSpreadScorer

NOW = 1000.0


def endpoints(n: int) -> list[EndpointState]:
    return [EndpointState(Endpoint(f"10.0.0.{i}:8000", {}, "m")) for i in range(n)]


def group(g: int, user: int = 0) -> bytes:
    """A group's shared system prompt (its head), then a user's own text."""
    return f"[group {g}] ".encode() + b"shared instructions " * 20 + f"user {user}".encode()


def ctx(prompt: bytes, now: float = NOW) -> SchedulingContext:
    return SchedulingContext("m", prompt=prompt, now=now)


def send(scorer: PrefixSpreadScorer, prompt: bytes, endpoint: EndpointState, now: float = NOW):
    scorer.on_pick(ctx(prompt, now), endpoint)


def test_new_head_prefers_fewest_heads_known_head_is_neutral() -> None:
    a, b, _ = eps = endpoints(3)
    s = PrefixSpreadScorer()
    assert s.score(ctx(group(1)), eps) == [1.0, 1.0, 1.0]  # nothing sent yet
    send(s, group(1), a)
    send(s, group(2), a)
    send(s, group(3), b)
    assert s.score(ctx(group(4)), eps) == [0.0, 0.5, 1.0]
    # A head sent before (another user of group 1) is affinity's to place: no preference.
    assert s.score(ctx(group(1, user=7)), eps) == [1.0, 1.0, 1.0]
    # The same head sent again to its replica is one head there, not two.
    send(s, group(1, user=7), a)
    assert s.counts == {a.key: 2, b.key: 1}
    assert s.score(ctx(b"short"), eps) == [1.0, 1.0, 1.0]  # no full head: no opinion


def test_heads_expire_after_the_window_and_memory_is_bounded(monkeypatch) -> None:
    a, b = eps = endpoints(2)
    s = PrefixSpreadScorer(window=60)
    send(s, group(1), a, now=NOW)
    send(s, group(2), a, now=NOW + 30)
    assert s.score(ctx(group(9), NOW + 59), eps) == [0.0, 1.0]
    # Group 1 last sent 61 s ago: new again, and a holds one head.
    assert s.score(ctx(group(1), NOW + 61), eps) == [0.0, 1.0]
    assert s.counts[a.key] == 1
    assert s.score(ctx(group(2), NOW + 91), eps) == [1.0, 1.0]  # all gone
    assert s.counts[a.key] == 0 and not s.recent and not s.seen
    monkeypatch.setattr(prefix_spread, "MAX_ENTRIES", 5)
    for g in range(20):
        send(s, group(g), eps[g % 2], now=NOW + 100)
        s.expire(NOW + 100)
        assert len(s.recent) <= 5 and len(s.seen) <= 5
    assert sum(s.counts.values()) == len(s.recent)
    s.on_remove(b)
    assert b.key not in s.counts and all(k[0] != b.key for k in s.recent)
    s.expire(NOW + 1000)
    assert s.counts == {a.key: 0}


def without_spread(config: dict) -> dict:
    """``config`` without prefix-spread (the default profile before it was added)."""
    out = copy.deepcopy(config)
    out["plugins"] = [p for p in out["plugins"] if p["type"] != "prefix-spread-scorer"]
    refs = out["schedulingProfiles"][0]["plugins"]
    refs[:] = [p for p in refs if p["pluginRef"] != "prefix-spread-scorer"]
    return out


def test_the_default_profile_places_groups_evenly_whatever_the_load() -> None:
    """64 groups arrive one by one at 8 replicas whose requests in flight differ at random (the
    first requests of groups placed earlier, other traffic): the least-request scorer alone
    places the groups by that noise; with prefix-spread (in the default profile) each replica
    gets 8, and a group's later requests follow it."""

    def place(config: dict) -> dict[int, str]:
        rng = random.Random(7)
        sched, eps = build_scheduler(config), endpoints(8)
        placed = {}
        for g in range(64):
            for e in eps:
                e.inflight = rng.randrange(6)
            x = ctx(group(g))
            chosen = sched.pick(x, eps, 1).endpoints[0]
            sched.profile(None).on_pick(x, chosen)
            placed[g] = chosen.key
        for g in range(64):  # every group's other users go where it is
            assert sched.pick(ctx(group(g, user=3)), eps, 1).endpoints[0].key == placed[g]
        return placed

    def most(placed: dict[int, str]) -> int:
        return max(list(placed.values()).count(k) for k in set(placed.values()))

    assert most(place(DEFAULT_CONFIG)) == 8
    assert most(place(without_spread(DEFAULT_CONFIG))) > 8  # what the scorer mends


@pytest.mark.parametrize("window", [0, -5, "nan", "inf", "soon"])
def test_a_window_that_is_not_a_positive_number_is_refused(window) -> None:
    config = {"plugins": [{"type": "prefix-spread", "parameters": {"window": window}}]}
    with pytest.raises((ValueError, ConfigError), match=r"window|could not convert"):
        build_scheduler(config)
