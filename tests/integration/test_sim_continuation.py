"""The sim continues a generation as vLLM does (what stream migration needs): token ids with
each streamed chunk (``return_token_ids``), a prompt given as token ids, and a chat's final
assistant message continued (``continue_final_message``); prompt + the first k generated
tokens gives exactly the rest of the uninterrupted output. A real ``llmplane.sim`` process."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from llmplane.testing.process import sim

MODEL = "m"


@pytest.fixture(scope="module")
def engine():
    server = sim(MODEL, "--time-scale", "0")
    yield server
    server.stop()


async def stream(session, url, body) -> list[dict]:
    async with session.post(url, json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        events = []
        async for line in resp.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                events.append(orjson.loads(line[6:]))
        return events


@pytest.mark.parametrize("ignore_eos", [True, False])
async def test_completion_continues_from_token_ids(engine, ignore_eos):
    url = f"http://{engine.address}/v1/completions"
    body = {"ignore_eos": ignore_eos, "model": MODEL, "prompt": "tell me a story", "max_tokens": 60, "temperature": 0,
            "seed": 7, "return_token_ids": True}  # fmt: skip
    async with aiohttp.ClientSession() as session:
        whole = await stream(session, url, body)
        choices = [e["choices"][0] for e in whole if e["choices"]]
        prompt_ids = choices[0]["prompt_token_ids"]
        assert prompt_ids and all(c["prompt_token_ids"] is None for c in choices[1:])
        ids = [t for c in choices for t in c["token_ids"]]
        text = "".join(c["text"] for c in choices)
        n = len(ids)
        finish = choices[-1]["finish_reason"]
        # without ignore_eos the EOS (default mean output 10-ish) comes first, and stays put
        assert (n, finish) == ((60, "length") if ignore_eos else (n, "stop")) and n > 3
        for k in (1, n // 2, n - 1):
            rest = await stream(
                session, url, {**body, "prompt": prompt_ids + ids[:k], "max_tokens": 60 - k}
            )
            parts = [e["choices"][0] for e in rest if e["choices"]]
            assert [t for c in parts for t in c["token_ids"]] == ids[k:]
            assert text[: 4 * k] + "".join(c["text"] for c in parts) == text
            assert parts[-1]["finish_reason"] == finish
        # unary: the same ids in the choice, the prompt's too
        async with session.post(url, json=body) as resp:
            choice = (await resp.json())["choices"][0]
            assert choice["token_ids"] == ids and choice["prompt_token_ids"] == prompt_ids
        # without return_token_ids the ids are null, as vLLM's
        plain = await stream(session, url, {**body, "return_token_ids": False})
        assert all(e["choices"][0]["token_ids"] is None for e in plain if e["choices"])


async def test_chat_continues_the_final_message(engine):
    url = f"http://{engine.address}/v1/chat/completions"
    messages = [{"role": "user", "content": "hello there"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 40, "temperature": 0, "seed": 1,
            "ignore_eos": True}  # fmt: skip
    async with aiohttp.ClientSession() as session:
        whole = await stream(session, url, {**body, "return_token_ids": True})
        assert whole[0]["prompt_token_ids"]
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in whole[1:])
        ids = [t for e in whole[1:] for t in e["choices"][0]["token_ids"]]
        assert len(ids) == 40
        async with session.post(url, json={**body, "return_token_ids": True}) as resp:
            unary = await resp.json()
            assert unary["prompt_token_ids"] == whole[0]["prompt_token_ids"]
            assert unary["choices"][0]["token_ids"] == ids
        cont = {
            **body,
            "messages": [*messages, {"role": "assistant", "content": text[:40]}],
            "max_tokens": 30,
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
        rest = await stream(session, url, cont)
        assert (
            text[:40] + "".join(e["choices"][0]["delta"].get("content") or "" for e in rest[1:])
            == text
        )
        async with session.post(
            url, json={**cont, "add_generation_prompt": True}
        ) as resp:  # vLLM refuses both at once
            assert resp.status == 400
            assert "continue_final_message" in (await resp.json())["error"]["message"]
