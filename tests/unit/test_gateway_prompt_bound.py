"""``InferenceRequest.prompt_bound``: a chat request's body bounds its prompt, so a prompt too
short for one prefix block is never extracted (the prefix scorer then hashes nothing, exactly
as ``block_hashes`` would)."""

from __future__ import annotations

import json

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplane.gateway.registry import EndpointState
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.scheduler.framework import SchedulingContext
from llmplane.gateway.scheduler.prefix import PrefixCacheScorer, block_hashes
from llmplane.runtime.endpoint import Endpoint

PATH = "/v1/chat/completions"


def request(body: bytes) -> InferenceRequest:
    return InferenceRequest(PATH, {}, body)


TRICKY = [
    b'{"model":"m","messages":[]}',
    b'{"model":"m","messages":[{}]}',
    b'{"model":"m","messages":[{},{},{}]}',
    b'{"model":"m","messages":[{"role":"u"}]}',
    b'{"model":"m","messages":[{"role":""},{"role":""}]}',
    b'{"model":"m","messages":[1,"x",null,{"role":"user","content":"hi"}]}',
    b'{"model":"m","messages":[{"content":["a",{"type":"text","text":"b"},{"text":7}]}]}',
    # Escapes decode to fewer bytes (a surrogate pair: 4 from 12).
    b'{"model":"m","messages":[{"role":"user","content":"\\n\\t\\"\\u00e9\\ud83d\\ude00"}]}',
    # Raw UTF-8 stays as long; duplicate keys only make the body longer.
    '{"model":"m","messages":[{"role":"u","role":"user","content":"é€😀"}]}'.encode(),
]


def test_the_body_bounds_a_chat_prompt():
    for body in TRICKY:
        inference = request(body)
        assert 0 <= len(inference.prompt) <= inference.prompt_bound() == len(body), body


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
part = st.one_of(text, st.fixed_dictionaries({"type": st.just("text"), "text": text}))
message = st.one_of(
    st.fixed_dictionaries(
        {"role": text}, optional={"content": st.one_of(text, st.lists(part, max_size=3))}
    ),
    st.dictionaries(text, text, max_size=2),
    st.integers(-(2**63), 2**63 - 1),
    st.none(),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(message, max_size=6), st.booleans())
def test_the_bound_holds_for_any_chat_body(messages, escaped):
    doc = {"model": "m", "messages": messages}
    # Raw UTF-8, or every non-ASCII character escaped as \uXXXX (surrogate pairs included).
    body = json.dumps(doc).encode() if escaped else orjson.dumps(doc)
    inference = request(body)
    assert len(inference.prompt) <= inference.prompt_bound()


def test_no_bound_for_other_prompts_or_a_changed_doc():
    # Token ids render as numbers, nested ones through str(): no bound from the body.
    completion = InferenceRequest("/v1/completions", {}, b'{"model":"m","prompt":[[1e15]]}')
    assert completion.prompt_bound() == -1
    assert len(completion.prompt) > len(b"[[1e15]]")
    chat = request(b'{"model":"m","messages":[{"role":"user","content":"hi"}]}')
    chat.doc["messages"][0]["content"] = "x" * 500  # a hook's change, not yet encoded
    chat.mark_dirty()
    assert chat.prompt_bound() == -1
    chat.final_body()
    assert len(chat.prompt) <= chat.prompt_bound() == len(chat.body)


def test_a_prompt_under_one_block_is_not_extracted():
    scorer = PrefixCacheScorer(block_size=64)
    endpoint = EndpointState(Endpoint("10.0.0.1:8000"))
    seen = set()
    for size in (0, 10, 11, 80, 200):
        body = orjson.dumps({"model": "m", "messages": [{"role": "u", "content": "x" * size}]})
        seen.add(len(body) < 64)
        inference = request(body)
        calls: list[int] = []

        def prompt(inference: InferenceRequest = inference, calls: list[int] = calls) -> bytes:
            calls.append(1)
            return inference.prompt

        ctx = SchedulingContext("m", prompt, prompt_bound=inference.prompt_bound())
        got = scorer.hashes(ctx)
        assert got == block_hashes(inference.prompt, "m", 64)  # what the full path gives
        # Extracted only when the body could hold a full block.
        assert calls == ([] if len(body) < 64 else [1]), size
        scorer.on_pick(ctx, endpoint)
    assert seen == {True, False}
    # Without a bound the prompt is extracted as before.
    calls = []
    ctx = SchedulingContext("m", lambda: calls.append(1) or b"short")
    assert scorer.hashes(ctx) == [] and calls == [1]
