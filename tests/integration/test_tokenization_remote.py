"""The engine's /tokenize as the gateway's source of token ids (models whose files it does not
have), against a real sim process: answers equal the engine's, cached per request text, bounded;
an engine that hangs, refuses connections or has no /tokenize gives no ids within the timeout.
And the canary check: the tiny model's own tokenizer against the sim's (a different tokenizer)
is a mismatch, counted and logged, after which the model's ids come from the engine."""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.tokenization import RemoteTokenizer, Tokenization
from llmplane.runtime.endpoint import Endpoint
from llmplane.sim.config import SimConfig
from llmplane.sim.tokenizer import render_chat, tokenize
from llmplane.testing import Processes
from llmplane.testing.wait import eventually

MODEL = "sim-model"
VOCAB = SimConfig(MODEL).vocab_size  # the sim's default vocabulary


def request(path: str, **doc: Any) -> InferenceRequest:
    return InferenceRequest(path, {}, json.dumps({"model": MODEL, **doc}).encode())


async def engine_ids(address: str, body: dict[str, Any]) -> list[int]:
    async with aiohttp.ClientSession() as s, s.post(f"http://{address}/tokenize", json=body) as r:
        assert r.status == 200, await r.text()
        return (await r.json())["tokens"]


CHATS = [
    [{"role": "user", "content": "hello there, how are you"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "one two three"},
        {"role": "assistant", "content": "four"},
        {"role": "user", "content": "five"},
    ],
]


async def test_remote_ids_equal_the_engines_and_are_cached(processes: Processes) -> None:
    sim = processes.sim(MODEL)
    tokenization = Tokenization(timeout=5, prepare_wait=5)
    await tokenization.learn([Endpoint(address=sim.address, model_name=MODEL)])
    try:
        for messages in CHATS:
            for agp in (True, False):
                req = request("/v1/chat/completions", messages=messages, add_generation_prompt=agp)
                assert tokenization.token_ids(req) is None  # not fetched yet
                await tokenization.prepare(req)
                ids = tokenization.token_ids(req)
                expected = await engine_ids(
                    sim.address,
                    {"model": MODEL, "messages": messages, "add_generation_prompt": agp},
                )
                assert ids == expected
                # The sim's own rule, so the comparison is not of an answer with itself.
                assert ids == tokenize(render_chat(messages, agp), VOCAB)
        req = request("/v1/completions", prompt="the quick brown fox")
        await tokenization.prepare(req)
        assert tokenization.token_ids(req) == tokenize("the quick brown fox", VOCAB)
        # Token-id prompts pass through without a round trip.
        asks = tokenization.remote.asks
        req = request("/v1/completions", prompt=[1, 2, 3])
        await tokenization.prepare(req)
        assert tokenization.token_ids(req) == [1, 2, 3]
        # The same text again: from the cache, no round trip.
        req = request("/v1/chat/completions", messages=CHATS[1])
        await tokenization.prepare(req)
        assert tokenization.remote.asks == asks
        assert tokenization.token_ids(req) == tokenize(render_chat(CHATS[1], True), VOCAB)
        # Another route's model: nothing known, no ids, no error.
        other = InferenceRequest("/v1/chat/completions", {}, b'{"model": "x", "messages": []}')
        await tokenization.prepare(other)
        assert tokenization.token_ids(other) is None
    finally:
        await tokenization.close()


async def test_remote_cache_is_bounded_and_concurrent_asks_share_a_round_trip(
    processes: Processes,
) -> None:
    import asyncio

    sim = processes.sim(MODEL)
    remote = RemoteTokenizer(timeout=5, max_entries=3)
    try:
        bodies = [{"model": MODEL, "prompt": f"prompt number {i}"} for i in range(5)]
        got = await asyncio.gather(*(remote.tokenize(sim.address, bodies[0]) for _ in range(8)))
        assert remote.asks == 1
        assert all(g == tokenize("prompt number 0", VOCAB) for g in got)
        for body in bodies[1:]:
            await remote.tokenize(sim.address, body)
        assert len(remote.cache) == 3
        assert remote.cached(bodies[0]) is None  # the oldest went
        assert remote.cached(bodies[4]) == tokenize("prompt number 4", VOCAB)
        assert remote.ids == sum(len(v) for v in remote.cache.values())
    finally:
        await remote.close()


async def test_hanging_refusing_and_missing_tokenize_give_no_ids(processes: Processes) -> None:
    hanging = socket.socket()  # accepts connections (the kernel's backlog), never answers
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(8)
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    refused_port = refusing.getsockname()[1]
    refusing.close()
    upstream = processes.upstream(MODEL)  # a vLLM-shaped stand-in without /tokenize
    req = request("/v1/chat/completions", messages=CHATS[0])
    try:
        for address in (
            f"127.0.0.1:{hanging.getsockname()[1]}",
            f"127.0.0.1:{refused_port}",
            upstream.address,
        ):
            tokenization = Tokenization(timeout=0.5, prepare_wait=5)
            await tokenization.learn([Endpoint(address=address, model_name=MODEL)])
            started = time.monotonic()
            await tokenization.prepare(req)
            assert time.monotonic() - started < 5, f"{address}: the timeout did not hold"
            assert tokenization.token_ids(req) is None
            assert tokenization.remote.failures == 1
            assert await tokenization.check_canary(MODEL, address) is None
            await tokenization.close()
    finally:
        hanging.close()


async def test_prepare_waits_at_most_its_bound_and_the_answer_serves_the_next_request(
    processes: Processes,
) -> None:
    """A request waits ``prepare_wait`` at most for the engine's /tokenize; an answer that
    comes later is kept for the next request of the same text."""
    hanging = socket.socket()
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(8)
    sim = processes.sim(MODEL)
    tokenization = Tokenization(timeout=1.0, prepare_wait=0.05)
    try:
        await tokenization.learn([Endpoint(address=f"127.0.0.1:{hanging.getsockname()[1]}",
                                           model_name=MODEL)])  # fmt: skip
        req = request("/v1/chat/completions", messages=CHATS[0])
        started = time.monotonic()
        assert await tokenization.prepare(req) is False
        assert time.monotonic() - started < 0.5, "prepare waited past its bound"
        assert tokenization.token_ids(req) is None
        await eventually(lambda: tokenization.remote.failures == 1, what="the fetch timed out")
        # An engine that answers, later than the request waits (here: not at all).
        await tokenization.learn([Endpoint(address=sim.address, model_name=MODEL)])
        tokenization.prepare_wait = 0
        other = request("/v1/chat/completions", messages=CHATS[1])
        assert await tokenization.prepare(other) is False
        assert tokenization.token_ids(other) is None
        await eventually(lambda: tokenization.token_ids(other) is not None, what="the answer")
        assert tokenization.token_ids(other) == tokenize(render_chat(CHATS[1], True), VOCAB)
        assert await tokenization.prepare(other) is True  # the next request: no round trip
        assert tokenization.remote.asks == 2
    finally:
        hanging.close()
        await tokenization.close()


async def test_canary_mismatch_is_counted_logged_and_falls_back_to_the_engine(
    processes: Processes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("transformers")  # builds the tiny tokenizer (comes with vLLM)
    from llmplane.testing.tiny_model import build_tokenizer

    build_tokenizer(tmp_path / "model")
    sim = processes.sim(MODEL)
    tokenization = Tokenization(timeout=5, prepare_wait=5)
    endpoint = Endpoint(address=sim.address, model_name=MODEL, model_path=str(tmp_path / "model"))
    caplog.set_level(logging.WARNING, "llmplane.gateway.tokenization")
    try:
        await tokenization.learn([endpoint])
        assert tokenization.mismatch.labels(MODEL).value == 1
        assert tokenization.models[MODEL].canary == "mismatch"
        assert any("differ from the engine's /tokenize" in r.message for r in caplog.records)
        assert any(
            f'llmplane_gateway_tokenizer_mismatch_total{{model="{MODEL}"}} 1.0' in line
            for line in _exposition(tokenization).splitlines()
        )
        # From now on the model's ids are the engine's.
        req = request("/v1/chat/completions", messages=CHATS[0])
        await tokenization.prepare(req)
        assert tokenization.token_ids(req) == tokenize(render_chat(CHATS[0], True), VOCAB)
        # The same endpoints again: not loaded or checked twice.
        await tokenization.learn([endpoint])
        assert tokenization.mismatch.labels(MODEL).value == 1
    finally:
        await tokenization.close()


async def test_an_undecided_canary_is_checked_again_when_endpoints_change(
    processes: Processes, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")  # builds the tiny tokenizer (comes with vLLM)
    from llmplane.testing.tiny_model import build_tokenizer

    build_tokenizer(tmp_path / "model")
    files = str(tmp_path / "model")
    upstream = processes.upstream(MODEL)  # no /tokenize
    sim = processes.sim(MODEL)
    tokenization = Tokenization(timeout=5, prepare_wait=5)
    try:
        await tokenization.learn(
            [Endpoint(address=upstream.address, model_name=MODEL, model_path=files)]
        )
        assert tokenization.models[MODEL].canary == "undecided"
        assert tokenization.models[MODEL].tokenizer is not None  # its own files are used
        await tokenization.learn(
            [Endpoint(address=sim.address, model_name=MODEL, model_path=files)]
        )
        assert tokenization.models[MODEL].canary == "mismatch"
        assert tokenization.mismatch.labels(MODEL).value == 1
    finally:
        await tokenization.close()


def _exposition(tokenization: Tokenization) -> str:
    from llmplane.gateway.observability import GatewayMetrics

    metrics = GatewayMetrics()
    metrics.add(tokenization.metrics())
    return metrics.render().decode()


def test_up_checks_the_canary_of_a_model_with_files(tmp_path: Path, processes: Processes) -> None:
    """End to end: the embedded runtime tells the gateway where the model's files are
    (``Endpoint.model_path``), the gateway loads their tokenizer and checks it against the
    engine's /tokenize. The sim's tokenizer is not the files' (a sim stands in for vLLM), so
    the check reports a mismatch on the gateway's /metrics; a model without tokenizer files
    reports nothing."""
    pytest.importorskip("transformers")  # builds the tiny tokenizer (comes with vLLM)
    from prometheus_client.parser import text_string_to_metric_families

    from llmplane.testing import wait_for
    from llmplane.testing.tiny_model import build_tokenizer
    from tests.integration.upcli import sim_fleet, status

    build_tokenizer(tmp_path / "files")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        sim_fleet("with-files", 1, source=f"host://{tmp_path / 'files'}")
        + "---"
        + sim_fleet("no-files", 1)
    )
    up = processes.up(tmp_path / "state", str(fleet))
    for name in ("with-files", "no-files"):
        wait_for(
            lambda name=name: status(up.state_dir, "Playground", name).get("readyReplicas") == 1,
            90,
            what=f"Playground {name} ready",
        )

    def mismatches() -> dict[str, float]:
        import urllib.request

        with urllib.request.urlopen(f"{up.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        return {
            s.labels["model"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "llmplane_gateway_tokenizer_mismatch_total"
        }

    wait_for(lambda: mismatches().get("with-files") == 1, 60, what="the canary's mismatch")
    assert "no-files" not in mismatches()
