"""The gateway's token ids against a real vLLM (the CPU build): the tiny test model with a chat
template that renders tools, tool calls and tool results, served by vLLM from the same files the
gateway reads. For chat requests (content strings and text parts, tools, tool calls with JSON
string arguments, a developer message, no generation prompt, continue_final_message,
chat_template_kwargs, add_special_tokens) and completions, the gateway's ids equal vLLM's
``/tokenize``; the canary check agrees; without the files, the /tokenize fallback gives the same
ids; and a chat completion's ``usage.prompt_tokens`` is the length of the gateway's ids.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.tokenization import ModelTokenizer, Tokenization
from llmplane.runtime.endpoint import Endpoint
from llmplane.runtime.launch import free_port
from llmplane.testing.process import Process
from llmplane.testing.tiny_model import build_tiny_llama, corpus
from tests.chat_templates import CONVERSATIONS, TOOL_CONVERSATION, TOOLS, TOOLS_TEMPLATE
from tests.integration.vllm_cpu import require_vllm

require_vllm()

pytestmark = pytest.mark.slow
NAME = "tiny"
ENGINE_START = 420  # a cold vLLM start on a shared 2-core machine


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_tiny_llama(tmp_path_factory.mktemp("vllm-tok") / "model")
    (path / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return path


@pytest.fixture(scope="module")
def vllm(model: Path) -> Iterator[str]:
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--max-model-len", "512",
    ]  # fmt: skip
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    process = Process(
        argv, name="vllm", env=env, ready=re.compile(r"(Application startup complete)"), grace=20
    )
    process.start(ENGINE_START)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.stop()


def chat_requests() -> list[dict[str, Any]]:
    with_string_arguments = copy.deepcopy(TOOL_CONVERSATION)
    call = with_string_arguments[2]["tool_calls"][0]["function"]
    call["arguments"] = json.dumps(call["arguments"])
    parts = [
        {"role": "system", "content": [{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}]},
        {"role": "developer", "content": "and exact"},
        {"role": "user", "content": [{"type": "text", "text": "one two"}]},
    ]  # fmt: skip
    empty_calls = [
        {"role": "user", "content": "hi", "name": "bob"},
        {"role": "assistant", "content": "ok", "tool_calls": []},
        {"role": "user", "content": "and"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "again"},
    ]
    billing_header = [
        {"role": "system", "content": "x-anthropic-billing-header: cch=1a2b\nbe brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        {"role": "user", "content": "ok"},
    ]
    out: list[dict[str, Any]] = []
    for messages in [*CONVERSATIONS, with_string_arguments, parts, empty_calls, billing_header]:
        out.append({"messages": messages})
        out.append({"messages": messages, "add_generation_prompt": False})
        out.append({"messages": messages, "tools": TOOLS})
    out.append(
        {
            "messages": [*CONVERSATIONS[1], {"role": "assistant", "content": "it is  "}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        }
    )
    out.append({"messages": CONVERSATIONS[0], "add_special_tokens": True})
    out.append({"messages": CONVERSATIONS[0], "chat_template_kwargs": {"unused": 1}})
    return out


async def tokenize(address: str, body: dict[str, Any]) -> list[int]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://{address}/tokenize", json={"model": NAME, **body}) as resp,
    ):
        assert resp.status == 200, await resp.text()
        return (await resp.json())["tokens"]


async def test_chat_and_completion_ids_equal_vllms(vllm: str, model: Path) -> None:
    tokenizer = ModelTokenizer.load(model)
    for body in chat_requests():
        assert tokenizer.chat_ids(body) == await tokenize(vllm, body), body
    for prompt in [*corpus(5, seed=11), "ünïcödé ✓ 漢字 🚀", "<s> special </s> inside"]:
        for special in (True, False):
            body = {"prompt": prompt, "add_special_tokens": special}
            assert tokenizer.completion_ids(body) == await tokenize(vllm, body), body


async def test_canary_matches_and_fallback_gives_the_same_ids(vllm: str, model: Path) -> None:
    local = Tokenization(timeout=30, prepare_wait=30)
    remote = Tokenization(timeout=30, prepare_wait=30)
    try:
        await local.learn([Endpoint(address=vllm, model_name=NAME, model_path=str(model))])
        assert local.models[NAME].canary == "match"
        assert local.mismatch.labels(NAME).value == 0
        await remote.learn([Endpoint(address=vllm, model_name=NAME)])
        for body in chat_requests()[:6]:
            request = InferenceRequest(
                "/v1/chat/completions", {}, json.dumps({"model": NAME, **body}).encode()
            )
            await remote.prepare(request)
            ids = local.token_ids(request)
            assert ids is not None
            assert remote.token_ids(request) == ids
    finally:
        await local.close()
        await remote.close()


async def test_prompt_tokens_of_a_chat_completion(vllm: str, model: Path) -> None:
    body = {"messages": CONVERSATIONS[1], "max_tokens": 1}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://{vllm}/v1/chat/completions", json={"model": NAME, **body}) as resp,
    ):
        assert resp.status == 200, await resp.text()
        usage = (await resp.json())["usage"]
    assert usage["prompt_tokens"] == len(ModelTokenizer.load(model).chat_ids(body))
