"""The gateway's token ids against a real vLLM (the CPU build): the tiny test model with a chat
template that renders tools, tool calls and tool results, served by vLLM from the same files the
gateway reads. For chat requests (content strings and text parts, tools, tool calls with JSON
string arguments, a developer message, no generation prompt, continue_final_message,
chat_template_kwargs, add_special_tokens) and completions, the gateway's ids equal vLLM's
``/tokenize``; the canary check agrees; without the files, the /tokenize fallback gives the same
ids, and the ids of a request's leading messages it reuses (less the safety tail) are a prefix
of vLLM's ids for the requests that continue them, under several templates; and a chat
completion's ``usage.prompt_tokens`` is the length of the gateway's ids.
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
from llmplane.gateway.tokenization.prefix import LeadingIds, cuts, kept
from llmplane.runtime.endpoint import Endpoint
from llmplane.runtime.launch import free_port
from llmplane.testing.process import Process
from llmplane.testing.tiny_model import CHAT_TEMPLATE, build_tiny_llama, corpus
from llmplane.testing.wait import eventually
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
        "--trust-request-chat-template",  # the templates of the leading-ids test
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
            assert await remote.prepare(request)
            ids = local.token_ids(request)
            assert ids is not None
            # A request under a leading part asked before gets that part's ids at once
            # (``LeadingIds``: a prefix of the whole, by design not waiting); the engine's
            # whole answer follows.
            first = remote.token_ids(request)
            assert first is not None and list(first) == ids[: len(first)], (first, ids)
            await eventually(
                lambda request=request: not isinstance(remote.token_ids(request), LeadingIds),
                30,
                what="the engine's whole ids",
            )
            assert remote.token_ids(request) == ids
    finally:
        await local.close()
        await remote.close()


# Templates of other shapes (the test model's tokenizer has none of their markers as special
# tokens: they are text, so the joins between messages are plain BPE).
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
PLAIN = (  # no markers: a conversation so far ends in " ", which the next " user" takes
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
# Assistant messages after the last user message open with an empty reasoning block (as Qwen3's
# template renders them): a conversation so far ending in an answer renders that answer
# otherwise than the next request does, which no safety tail covers; the gateway's check of each
# whole answer against the leading ids turns the reuse off for such a model.
REASONING_LAST = (
    "{% set ns = namespace(last=0) %}{% for m in messages %}"
    "{% if m['role'] == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and loop.index0 > ns.last %}<think>\n\n</think>\n\n"
    "{% endif %}{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SYSTEM = "the model serves the gateway well " * 6
TURNS = [
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "why is it fast?"}],
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "why is the prefix cache fast?"},
        {"role": "assistant", "content": "  one block two block  "},
        {"role": "user", "content": "and the </s> token <|user|> inside text?"},
    ],
    [
        {"role": "user", "content": "ünïcödé ✓ 漢字 emoji 🚀 and\ttabs\n\nnew lines " * 2},
        {"role": "assistant", "content": "ok then\n"},
        {"role": "user", "content": "more"},
    ],
]


def continuations(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Requests that start with ``messages`` but the last: another last message, and the
    next turn."""
    return [
        [*messages[:-1], {"role": "user", "content": "something else entirely, 42?"}],
        [*messages, {"role": "assistant", "content": "fine."}, {"role": "user", "content": "go"}],
    ]


async def test_leading_ids_are_a_prefix_of_vllms_for_the_requests_that_follow(
    vllm: str,
) -> None:
    """Through the gateway's /tokenize fallback (the served tools template): after a request,
    each request continuing its leading messages (another user message under the same ones,
    the next turn; with tools, without a generation prompt) gets ``LeadingIds`` at once, and
    vLLM's ids for it start with them. Directly against vLLM's /tokenize with other templates
    (ChatML, Llama 3 style, plain text, the test model's own): the rule (the leading answer
    less at least 8 ids, down to a multiple of 16) is a prefix of vLLM's ids for the
    continuations, and for the plain one the untrimmed answer is not (the tail is needed);
    a template rendering the answers after the last user message otherwise breaks the rule
    (the runtime check's case) but for the system prompt's run (what the model keeps)."""
    remote = Tokenization(timeout=30, prepare_wait=30)
    try:
        await remote.learn([Endpoint(address=vllm, model_name=NAME)])
        reused = 0
        shapes = [*TURNS, TOOL_CONVERSATION]
        for messages in shapes:
            for extra in ({}, {"tools": TOOLS}, {"add_generation_prompt": False}):
                first = {"model": NAME, "messages": messages, **extra}
                await remote.prepare(
                    InferenceRequest("/v1/chat/completions", {}, json.dumps(first).encode())
                )
                await eventually(lambda: not remote.remote.pending, what="the answers")
                for follow in continuations(messages):
                    doc = {**first, "messages": follow}
                    request = InferenceRequest("/v1/chat/completions", {}, json.dumps(doc).encode())
                    ids = remote.token_ids(request)
                    if ids is None:  # leading messages shorter than the safety tail
                        continue
                    assert isinstance(ids, LeadingIds)
                    whole = await tokenize(vllm, {k: v for k, v in doc.items() if k != "model"})
                    assert whole[: len(ids)] == ids, (doc, len(ids), len(whole))
                    reused += 1
        assert reused >= 12, reused
        assert remote.prefix_mismatch.labels(NAME).value == 0

        trimmed_needed = broken = 0
        for template in (CHATML, LLAMA3, PLAIN, CHAT_TEMPLATE, REASONING_LAST):
            for messages in TURNS:
                leading = await tokenize(
                    vllm,
                    {"messages": messages[:-1], "add_generation_prompt": False,
                     "chat_template": template},
                )  # fmt: skip
                n = kept(leading)
                assert n > 0
                for follow in continuations(messages):
                    whole = await tokenize(vllm, {"messages": follow, "chat_template": template})
                    if template is REASONING_LAST and messages[-2]["role"] != "system":
                        broken += whole[:n] != leading[:n]
                        continue
                    assert whole[:n] == leading[:n], (template, follow)
                    trimmed_needed += whole[: len(leading)] != leading
        assert trimmed_needed, "no template here needs the safety tail: the test lost its case"
        assert broken, "the reasoning template did not break the rule"
    finally:
        await remote.close()


async def test_leading_texts_are_a_prefix_of_vllms_for_prompts_that_share_them(
    vllm: str,
) -> None:
    """Completion prompts: at every cut the gateway may ask (multiples of 64 characters, some
    through words and multi-byte characters), vLLM's ids for the leading text less the safety
    tail are a prefix of its ids for the whole prompt, while untrimmed they are not always.
    Through the /tokenize fallback: two prompts sharing a text find their shared cut, and a
    third is scored at once with ids vLLM's start with."""
    untrimmed_differs = 0
    texts = [" ".join(corpus(8, seed=5)), "ünïcödé ✓ 漢字 🚀 tabs\tand  spaces " * 4]
    for text in texts:
        for special in (True, False):
            whole = await tokenize(vllm, {"prompt": text, "add_special_tokens": special})
            for cut in cuts(len(text)):
                leading = await tokenize(
                    vllm, {"prompt": text[:cut], "add_special_tokens": special}
                )
                n = kept(leading)
                assert whole[:n] == leading[:n], (text, cut, special)
                untrimmed_differs += whole[: len(leading)] != leading
    assert untrimmed_differs, "no cut here needs the safety tail: the test lost its case"

    remote = Tokenization(timeout=30, prepare_wait=30)
    try:
        await remote.learn([Endpoint(address=vllm, model_name=NAME)])
        shared = " ".join(corpus(6, seed=7))
        assert len(shared) > 200
        for own in ("one question", "another question"):
            doc = {"model": NAME, "prompt": f"{shared} {own}"}
            await remote.prepare(InferenceRequest("/v1/completions", {}, json.dumps(doc).encode()))
            await eventually(lambda: not remote.remote.pending, what="the answers")
        doc = {"model": NAME, "prompt": f"{shared} a third one"}
        ids = remote.token_ids(InferenceRequest("/v1/completions", {}, json.dumps(doc).encode()))
        assert isinstance(ids, LeadingIds)
        whole = await tokenize(vllm, {"prompt": doc["prompt"]})
        assert whole[: len(ids)] == ids
    finally:
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
