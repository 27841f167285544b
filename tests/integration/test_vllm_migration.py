"""Stream migration with real vLLM (the CPU build): two replicas of a tiny random Llama under
``llmplane up``; a stream (temperature 0, a seed) whose replica is SIGKILLed as its first
token chunk arrives continues on the other, and the client's full text equals the uninterrupted
run's, on /v1/completions (token level: prompt ids + generated ids) and on chat (the same, as a
completion of the templated prompt's ids). Without a failure the client's stream is vLLM's own.

The random model's generations are limited to tokens of whole ASCII text
(``allowed_token_ids``, which a continuation carries on): left free it generates invalid
UTF-8, and vLLM's detokenizer (tokenizers' ``DecodeStream`` primed with the prompt) then
re-emits part of a continuation's prompt as text when that prompt's text holds replacement
characters, though the continuation's token ids are right."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from tokenizers import Tokenizer

from llmplane.gateway.migration import unfinished
from llmplane.gateway.splice import Splice
from llmplane.gateway.upstream_client import UpstreamPool
from llmplane.testing import Up, wait_for
from llmplane.testing.fleets import vllm_fleet
from llmplane.testing.tiny_model import build_tiny_llama
from tests.integration.metrics_pages import gateway_metric, metric
from tests.integration.upcli import condition, status
from tests.integration.vllm_cpu import require_vllm

require_vllm()
pytestmark = pytest.mark.slow

NAME = "tiny-llama"
TOKENS = 400


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model")


@pytest.fixture(scope="module")
def allowed(model: Path) -> list[int]:
    """The model's tokens that are whole printable ASCII text (not a byte of a character)."""
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    return [
        i
        for i in range(tokenizer.get_vocab_size())
        if (text := tokenizer.decode([i])).isascii()
        and text.isprintable()
        and text
        and not tokenizer.id_to_token(i).startswith("<")
    ]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[Up]:
    root = tmp_path_factory.mktemp("vllm-migration")
    # float32 (the last --dtype wins): no near-ties of bfloat16 logits between a prefill
    # and the decode steps it replaces
    args = ["--dtype", "float32", "--max-num-seqs", "4"]
    (root / "fleet.yaml").write_text(vllm_fleet(model, NAME, 2, args))
    process = Up(root / "state", str(root / "fleet.yaml"))
    try:
        process.start()
        wait_for(
            lambda: (
                condition(process.state_dir, "Playground", NAME, "Available").get("status")
                == "True"
                and status(process.state_dir, "Playground", NAME).get("readyReplicas") == 2
            ),
            600,
            every=1,
            what="both vLLM replicas ready",
        )
        yield process
    finally:
        process.kill_everything()


def engine_pid(up: Up, address: str) -> int:
    """The engine process serving on ``address`` (its command line's --port)."""
    port = address.rsplit(":", 1)[1]
    for pid in up.engine_pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--port" in argv and argv[argv.index(b"--port") + 1].decode() == port:
            return pid
    raise AssertionError(f"no engine process on {address}: {up.engine_pids()}")


async def stream(url: str, path: str, body: dict, kill=None) -> tuple[str, str, list[dict]]:
    """(endpoint, text, events); ``kill(endpoint)`` runs as the response begins (the gateway
    answers once the first chunk is in): the tiny model generates a stream in tens of
    milliseconds, so a kill that waited for a client's read of some chunks found the stream
    over (the gateway's migrations counter says whether it was)."""
    chat = "chat" in path
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
        ) as resp,  # fmt: skip
    ):
        assert resp.status == 200, await resp.text()
        endpoint = resp.headers["x-llmplane-endpoint"]
        if kill is not None:
            kill(endpoint)
        events: list[dict] = []
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            assert "error" not in event, event
            events.append(event)
    text = "".join(
        ((c["delta"].get("content") if chat else c["text"]) or "")
        for e in events
        for c in e.get("choices") or ()
    )
    return endpoint, text, events


def sea(path: str, allowed: list[int]) -> dict:
    """The request of both tests (temperature 0, a seed), as a completion or a chat."""
    body = {"model": NAME, "max_tokens": TOKENS, "temperature": 0, "seed": 5,
            "ignore_eos": True, "stream": True, "allowed_token_ids": allowed,
            "stream_options": {"include_usage": True}}  # fmt: skip
    if "chat" in path:
        body["messages"] = [{"role": "user", "content": "Tell me about the sea."}]
    else:
        body["prompt"] = "The sea is"
    return body


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_stream_never_lost_is_vllms_own_stream(up: Up, path: str, allowed: list[int]):
    """Through the gateway (which asks vLLM for token ids) and straight from the same replica
    (which is not asked): the same text and usage, events of the same shapes with the same
    null fields; no token ids, no ``"delta": {}`` chunk vLLM sends only with ids. (Not the
    same bytes: vLLM puts several tokens in one chunk when its stream falls behind, as it
    happens.)"""
    body = sea(path, allowed)
    runs = []
    async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as session:
        for url in (up.url, None):
            address = url or f"http://{runs[0][0]}"
            async with session.post(address + path, json=body) as resp:
                assert resp.status == 200, await resp.text()
                raw = await resp.read()
                runs.append((resp.headers.get("x-llmplane-endpoint"), raw))
    (_, through), (_, direct) = runs
    assert b'"token_ids":[' not in through and b'"delta":{}' not in through
    parsed = [
        [orjson.loads(e[6:]) for e in r.split(b"\n\n") if e and e != b"data: [DONE]"]
        for r in (through, direct)
    ]
    chat = "chat" in path
    texts = [
        "".join(
            ((c["delta"].get("content") if chat else c["text"]) or "")
            for e in events
            for c in e["choices"]
        )
        for events in parsed
    ]
    assert texts[0] == texts[1]
    assert parsed[0][-1]["usage"] == parsed[1][-1]["usage"]

    def shape(event: dict) -> tuple:
        choices = event["choices"]
        inner = sorted((k, v is None) for c in choices for k, v in c.items())
        return tuple(sorted((k, v is None) for k, v in event.items())), tuple(inner)

    assert {shape(e) for e in parsed[0]} == {shape(e) for e in parsed[1]}
    assert through.endswith(b"data: [DONE]\n\n") and direct.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_stream_whose_replica_is_killed_continues_on_the_other(
    up: Up, path: str, allowed: list[int]
):
    body = sea(path, allowed)
    url = up.url
    _, expected, _ = await stream(url, path, body)
    assert expected.isascii() and expected.isprintable(), expected  # whole ASCII text
    killed: list[str] = []
    pids: list[int] = []

    def kill(endpoint: str) -> None:
        pid = engine_pid(up, endpoint)
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        killed.append(endpoint)
        pids.append(pid)

    # A loaded machine may kill the replica only once its stream is over (nothing migrates):
    # then the case runs again, at most 3 times, until the gateway's counter says it did.
    for _ in range(3):
        killed.clear()
        migrations = migrated(up)
        t = time.monotonic()
        endpoint, text, events = await stream(url, path, body, kill)
        assert killed == [endpoint]
        assert text == expected, f"continued:\n{text!r}\nuninterrupted:\n{expected!r}"
        assert events[-1]["usage"]["completion_tokens"] == TOKENS
        assert len({e["id"] for e in events}) == 1
        print(f"{path}: a stream of {time.monotonic() - t:.1f} s")
        # the killed replica comes back (the runtime restarts it) and the gateway routes to it
        # again before the next case: the status alone can still read 2 from before the kill
        wait_for(lambda: both_serving(up, pids[-1]), 600, every=1, what="the killed replica back")
        if migrated(up) > migrations:  # continued elsewhere, not over before the kill
            return
    raise AssertionError("in 3 tries each stream was over before its replica was killed")


def migrated(up: Up) -> float:
    """Streams the gateway has continued on another replica (its /metrics)."""
    with urllib.request.urlopen(f"{up.url}/metrics", timeout=10) as resp:
        return metric(resp.read().decode(), "llmplane_gateway_stream_migrations_total")


def both_serving(up: Up, killed: int) -> bool:
    """Two engines run, neither is ``killed``, both are ready and the gateway ejects neither."""
    pids = up.engine_pids()
    if killed in pids or len(pids) != 2:
        return False
    if status(up.state_dir, "Playground", NAME).get("readyReplicas") != 2:
        return False
    ejected = gateway_metric(up.url, "llmplane_gateway_endpoint_ejected")
    return len(ejected) == 2 and not any(ejected.values())


async def test_a_stream_lost_in_the_middle_of_a_character_continues_without_garble(up: Up):
    """Left free, the random model generates characters of several byte tokens, whose text
    vLLM holds back until they complete. At every point a stream could be lost, the
    continuation the gateway builds (its ``unfinished`` ids generated again) gives the
    uninterrupted text; without that, a continuation whose prompt ends inside a character
    comes back with the whole prompt's text in front of its own."""
    body = {"model": NAME, "max_tokens": TOKENS, "temperature": 0, "seed": 5, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell me about the sea."}]}  # fmt: skip
    async with aiohttp.ClientSession() as session:
        async with session.post(up.url + "/v1/chat/completions", json=body) as resp:
            address = resp.headers["x-llmplane-endpoint"]
            whole = (await resp.json())["choices"][0]["message"]["content"]
        streamed = orjson.dumps({**body, "stream": True})
        splice, sent = Splice.of(streamed, chat=True)
        async with session.post(f"http://{address}/v1/chat/completions", data=sent,
                                headers={"Content-Type": "application/json"}) as resp:  # fmt: skip
            raw = await resp.read()
        events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
        pool = UpstreamPool()
        cut_inside = 0
        try:
            for cut in range(2, len(events) - 2):
                splice, _ = Splice.of(streamed, chat=True)
                out = b"".join(splice.feed(e) for e in events[:cut])
                assert splice.can_continue() is None
                n = await unfinished(pool, address, {"Content-Type": "application/json"},
                                     NAME, splice.ids)  # fmt: skip
                cut_inside += n > 0
                splice.forget(n)
                path, cont = splice.continuation("/v1/chat/completions")
                rest = {**orjson.loads(cont), "stream": False}
                async with session.post(f"http://{address}{path}", json=rest) as resp:
                    more = (await resp.json())["choices"][0]["text"]
                text = "".join(
                    e["choices"][0]["delta"].get("content") or ""
                    for e in map(orjson.loads, (x[6:] for x in out.split(b"\n\n") if x))
                    if e.get("choices")
                )
                assert text + more == whole, f"lost after event {cut}: {text!r} + {more!r}"
        finally:
            await pool.close()
    assert cut_inside, "no cut fell inside a character: the case is not exercised"
