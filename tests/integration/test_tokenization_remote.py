"""The engine's /tokenize as the gateway's source of token ids (models whose files it does not
have), against a real sim process: answers equal the engine's, cached per request text, bounded;
an engine that hangs, refuses connections or has no /tokenize gives no ids within the timeout.
Chat answers cached by prefix: a new turn or a new user message under a cached system prompt
is scored at once from the ids of its leading messages, a prefix of the engine's ids for it,
with one more round trip at most; an engine whose ids do not start with them turns that off.
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

from llmplane.gateway.kvcache.index import block_keys
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.tokenization import RemoteTokenizer, Tokenization, tokenize_body
from llmplane.gateway.tokenization.prefix import LeadingIds, chain
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
        for prompt in ([1, 2, 3], [[1, 2, 3]]):  # a list of ids, a batch of one
            req = request("/v1/completions", prompt=prompt)
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


SYSTEM = {"role": "system", "content": " ".join(f"rule {i} of the house" for i in range(40))}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def answered(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    return [*messages, {"role": "assistant", "content": f"answer to {text}"}, user(text)]


def leading_cached(tokenization: Tokenization, messages: list[dict[str, Any]]) -> bool:
    """The answer for ``messages`` but the last is cached (``prefix.chain``'s key)."""
    body = tokenize_body(MODEL, {"messages": messages}, True)
    assert body is not None
    return tokenization.remote.cache.get(chain(body)[0][-2]) is not None


async def test_a_new_turn_is_scored_at_once_from_its_leading_messages(
    processes: Processes,
) -> None:
    """The first request of a system prompt waits for its ids (and its leading messages'
    come along); a new user message under it, then each next turn of a conversation, is
    scored at once (``prepare`` does not wait for the round trip, though it may wait 5 s)
    with ids that are a prefix of the engine's for it, and block keys that are the first of
    the whole request's (fewer blocks, never others); its own answer replaces them once it
    arrives. One more /tokenize ask per request at most; other tools: no reuse."""
    sim = processes.sim(MODEL)
    tokenization = Tokenization(timeout=5, prepare_wait=5)
    await tokenization.learn([Endpoint(address=sim.address, model_name=MODEL)])
    try:
        first = [SYSTEM, user("hello")]
        req = request("/v1/chat/completions", messages=first)
        assert await tokenization.prepare(req) is True
        assert not isinstance(tokenization.token_ids(req), LeadingIds)  # waited: its own ids
        await eventually(lambda: leading_cached(tokenization, first), what="[system] answered")
        assert tokenization.remote.asks == 2  # the whole body and its leading messages
        conversation = [SYSTEM, user("another question entirely")]
        longest = 1  # messages of the longest cached leading run
        for turn in range(4):
            asks = tokenization.remote.asks
            req = request("/v1/chat/completions", messages=conversation)
            assert tokenization.token_ids(req) is not None  # before any round trip
            assert await tokenization.prepare(req) is True
            ids = tokenization.token_ids(req)
            assert isinstance(ids, LeadingIds), (turn, "prepare waited for the whole answer")
            expected = await engine_ids(sim.address, {"model": MODEL, "messages": conversation})
            assert expected[: len(ids)] == ids, turn
            # The leading run's ids, less at least 8 (the safety tail).
            run = tokenize(render_chat(conversation[:longest], False), VOCAB)
            assert len(run) - 24 < len(ids) <= len(run) - 8, (turn, len(ids), len(run))
            assert abs(ids.total - len(expected)) <= len(expected) // 4, (ids.total, expected)
            keys, whole = block_keys(ids, 16), block_keys(expected, 16)
            assert keys and keys == whole[: len(keys)] and len(keys) < len(whole)
            await eventually(
                lambda r=req: not isinstance(tokenization.token_ids(r), LeadingIds),
                what="the whole answer",
            )
            assert tokenization.token_ids(req) == expected
            await eventually(
                lambda c=conversation: leading_cached(tokenization, c), what="leading answer"
            )
            # Its own body, and its leading messages ([system] is cached at the first turn).
            assert tokenization.remote.asks == asks + (1 if turn == 0 else 2), turn
            longest = len(conversation) - 1
            conversation = answered(conversation, f"turn {turn}")
        # Other tools change every token: nothing to reuse.
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        req = request("/v1/chat/completions", messages=conversation, tools=tools)
        assert tokenization.token_ids(req) is None
        assert tokenization.prefix_mismatch.labels(MODEL).value == 0
    finally:
        await tokenization.close()


async def test_a_completion_sharing_a_leading_text_is_scored_at_once(
    processes: Processes,
) -> None:
    """Completion prompts that share a long text: the first two (each waiting for its own
    ids) find their shared leading text (the second asks the longest cut the first had too),
    the third is scored at once from that cut's ids, a prefix of the engine's for it; a prompt
    that extends an earlier one reuses the earlier one's longest cut."""
    sim = processes.sim(MODEL)
    tokenization = Tokenization(timeout=5, prepare_wait=5)
    await tokenization.learn([Endpoint(address=sim.address, model_name=MODEL)])
    shared = " ".join(f"shared{i:03d}" for i in range(100))  # 999 characters

    def completion(text: str) -> InferenceRequest:
        return request("/v1/completions", prompt=text)

    try:
        for who in ("alice", "bob"):
            req = completion(f"{shared} and then {who} asks a question of her or his own, " * 2)
            assert await tokenization.prepare(req) is True
            assert not isinstance(tokenization.token_ids(req), LeadingIds)
            await eventually(lambda: not tokenization.remote.pending, what="the answers")
        assert tokenization.remote.asks == 4  # two prompts, each with one leading text
        for who in ("carol", "dave"):
            text = f"{shared} but {who} wants something else"
            req = completion(text)
            ids = tokenization.token_ids(req)
            assert isinstance(ids, LeadingIds), who
            expected = tokenize(text, VOCAB)
            assert expected[: len(ids)] == ids
            # The cut at 768 characters (192 ids), less the safety tail.
            assert len(ids) == 176, len(ids)
            assert abs(ids.total - len(expected)) <= 2, (ids.total, len(expected))
            assert await tokenization.prepare(req) is True
            await eventually(lambda: not tokenization.remote.pending, what="the answers")
            assert tokenization.token_ids(req) == expected
        # A prompt that extends an earlier one: the earlier one's longest cut (1,024
        # characters: 256 ids, 240 kept).
        story = " ".join(f"story{i:03d}" for i in range(120))  # 1,079 characters
        await tokenization.prepare(completion(story))
        await eventually(lambda: not tokenization.remote.pending, what="the answers")
        longer = f"{story} and the story goes on"
        ids = tokenization.token_ids(completion(longer))
        assert isinstance(ids, LeadingIds) and len(ids) == 240, ids
        assert tokenize(longer, VOCAB)[:240] == ids
        assert tokenization.prefix_mismatch.labels(MODEL).value == 0
    finally:
        await tokenization.close()


async def test_an_engine_whose_ids_do_not_start_with_the_leading_ones_turns_them_off(
    processes: Processes, caplog: pytest.LogCaptureFixture
) -> None:
    """Two engines of one model name that tokenize differently (another vocabulary: what a
    template that renders earlier messages according to later ones looks like from here;
    requests ask them in turn): the leading ids one gave are not a prefix of the other's
    answer. The first failure (counted, logged) leaves the model's chats the run of their
    system messages only: a longer cached run is not used, the system run is asked instead;
    the second failure leaves them whole answers only, also when the endpoints change."""
    sims = [processes.sim(MODEL), processes.sim(MODEL, "--vocab-size", "1000")]
    tokenization = Tokenization(timeout=5, prepare_wait=5)
    await tokenization.learn([Endpoint(address=s.address, model_name=MODEL) for s in sims])
    caplog.set_level(logging.WARNING, "llmplane.gateway.tokenization")
    mode = tokenization.models[MODEL].prefixes
    conversation = answered([SYSTEM, user("hello")], "one")  # [system, user, answer, user]

    async def send(messages: list[dict[str, Any]]) -> InferenceRequest:
        req = request("/v1/chat/completions", messages=messages)
        assert await tokenization.prepare(req) is True
        await eventually(lambda: not tokenization.remote.pending, what="the answers")
        return req

    try:
        await send(conversation)  # its leading run: [system, user, answer]
        follow = [*conversation[:-1], user("two")]
        assert isinstance(
            tokenization.token_ids(request("/v1/chat/completions", messages=follow)), LeadingIds
        )
        await send(follow)
        assert tokenization.prefix_mismatch.labels(MODEL).value == 1
        assert mode == {True: "system", False: "all"}
        assert any("do not start with the ids of its leading" in r.message for r in caplog.records)
        third = [*conversation[:-1], user("three")]
        assert tokenization.token_ids(request("/v1/chat/completions", messages=third)) is None
        asks = tokenization.remote.asks
        await send(third)
        assert tokenization.remote.asks == asks + 2  # its own body and the [system] run
        assert leading_cached(tokenization, [SYSTEM, user("x")])
        fourth = request("/v1/chat/completions", messages=[*conversation[:-1], user("four")])
        assert isinstance(tokenization.token_ids(fourth), LeadingIds)  # the [system] run
        await send([*conversation[:-1], user("four")])
        assert tokenization.prefix_mismatch.labels(MODEL).value == 2
        assert mode == {True: "off", False: "all"}
        fifth = [SYSTEM, user("five")]
        assert tokenization.token_ids(request("/v1/chat/completions", messages=fifth)) is None
        asks = tokenization.remote.asks
        await send(fifth)
        assert tokenization.remote.asks == asks + 1  # and asked no leading part
        # The model's endpoints change: still off.
        await tokenization.learn([Endpoint(address=sims[0].address, model_name=MODEL)])
        assert tokenization.models[MODEL].prefixes == {True: "off", False: "all"}
        assert tokenization.prefix_mismatch.labels(MODEL).value == 2
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
        got = await asyncio.gather(*(remote.fetch(sim.address, bodies[0]) for _ in range(8)))
        assert remote.asks == 1
        assert all(g == tokenize("prompt number 0", VOCAB) for g in got)
        for body in bodies[1:]:
            await remote.fetch(sim.address, body)
        assert len(remote.cache) == 3
        assert remote.cache.get(remote.key(bodies[0])) is None  # the oldest went
        assert remote.cache.get(remote.key(bodies[4])) == tokenize("prompt number 4", VOCAB)
        assert remote.cache.total == sum(len(v) for v in remote.cache.values())
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


async def test_close_cancels_the_round_trips_on_their_way() -> None:
    hanging = socket.socket()  # accepts connections, never answers
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(8)
    tokenization = Tokenization(timeout=60, prepare_wait=0)
    try:
        address = f"127.0.0.1:{hanging.getsockname()[1]}"
        await tokenization.learn([Endpoint(address=address, model_name=MODEL)])
        assert (
            await tokenization.prepare(request("/v1/chat/completions", messages=CHATS[1])) is False
        )
        tasks = list(tokenization.remote.pending.values())
        assert len(tasks) == 2  # the whole body and its leading messages
        await tokenization.close()
        assert all(t.cancelled() for t in tasks) and not tokenization.remote.pending
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
        assert tokenization.remote.asks == 3  # the hanging one, the answer, its leading part
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
        asks = tokenization.remote.asks
        req = request("/v1/chat/completions", messages=CHATS[0])
        assert await tokenization.prepare(req) is False  # nothing to fetch: ids are local
        assert tokenization.remote.asks == asks and tokenization.token_ids(req) is not None
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
