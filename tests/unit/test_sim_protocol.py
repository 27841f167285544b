"""Tokenizer, output planning and SSE chunk bytes of the simulator (pure)."""

import orjson

from llmplane.sim.protocol import ChunkWriter, parse_sampling, plan_output, token_text
from llmplane.sim.tokenizer import (
    WORDS,
    eos_length,
    render_chat,
    sequence_seed,
    tokenize,
    words,
)


def test_tokenizer_is_four_characters_per_token_and_deterministic():
    assert len(tokenize("a" * 16, 1000)) == 4
    assert len(tokenize("abcdefghi", 1000)) == 3
    assert tokenize("", 1000) == []
    assert tokenize("hello world", 50000) == tokenize("hello world", 50000)
    assert all(0 <= t < 50 for t in tokenize("x" * 100, 50))
    # non-ASCII text is cut by characters, not bytes
    assert len(tokenize("héllo wörld!", 1000)) == 3
    # a prefix of the text gives a prefix of the ids (at 4-character boundaries)
    assert tokenize("abcdefgh" * 10, 999)[:8] == tokenize("abcdefgh" * 4, 999)


def test_generated_words_are_one_token_each():
    assert all(len(w) == 4 and len(tokenize(w, 100)) == 1 for w in WORDS)
    text = "".join(words(123, 0, 50))
    assert len(tokenize(text, 1000)) == 50


def test_chat_template():
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    assert render_chat(msgs) == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    assert render_chat(msgs, add_generation_prompt=False).endswith("hi\n")


def test_sequence_seed_depends_on_content_only():
    a = sequence_seed(1, [1, 2, 3], "k", 0)
    assert a == sequence_seed(1, [1, 2, 3], "k", 0)
    assert len({a, sequence_seed(2, [1, 2, 3], "k", 0), sequence_seed(1, [1, 2], "k", 0),
                sequence_seed(1, [1, 2, 3], "k", 1)}) == 4  # fmt: skip


def test_eos_length_has_roughly_the_requested_mean():
    lens = [eos_length(s * 7919, 100) for s in range(4000)]
    assert min(lens) >= 1
    assert 85 < sum(lens) / len(lens) < 115


def test_plan_output_length_stop_and_ignore_eos():
    sp = parse_sampling({"max_tokens": 10, "ignore_eos": True}, chat=False)
    plan = plan_output(5, 10, sp, 2)
    assert (plan.length, plan.finish_reason, plan.text_cut) == (10, "length", None)
    sp = parse_sampling({"max_tokens": 1000}, chat=False)
    plan = plan_output(5, 1000, sp, 2)
    assert plan.finish_reason == "stop" and plan.length < 1000
    assert plan.text_cut == (plan.length - 1) * 4  # the EOS token has no text
    # a stop string cuts the text before it and ends the sequence at its token
    seed = 42
    text = "".join(words(seed, 0, 20))
    stop = text[21:24]
    p = text.find(stop)
    sp = parse_sampling({"max_tokens": 20, "ignore_eos": True, "stop": stop}, chat=False)
    plan = plan_output(seed, 20, sp, 256)
    assert plan.finish_reason == "stop" and plan.stop_reason == stop
    assert plan.text_cut == p and plan.length == (p + len(stop) - 1) // 4 + 1
    assert token_text(0, plan.length - 1, plan.text_cut) == WORDS[0][: p - (plan.length - 1) * 4]


def test_max_tokens_defaults():
    assert parse_sampling({}, chat=False).max_tokens == 16
    assert parse_sampling({}, chat=True).max_tokens is None
    assert parse_sampling({"max_completion_tokens": 7, "max_tokens": 3}, chat=True).max_tokens == 7


def _event(b: bytes) -> dict:
    assert b.startswith(b"data: ") and b.endswith(b"\n\n")
    return orjson.loads(b[6:-2])


def test_chat_chunks_match_vllm_shapes():
    # Shapes of vLLM 0.32's chat chunks (see docs/sim-vs-vllm.md).
    w = ChunkWriter(True, "chatcmpl-1", 123, "m", "vllm-x-1", include_usage=True)
    role = _event(w.role(0))
    assert role == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 123,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "prompt_token_ids": None,
        "prompt_text": None,
    }
    tok = _event(w.token(1, ' a"b'))
    assert tok["choices"][0] == {
        "index": 1, "delta": {"content": ' a"b'}, "logprobs": None, "finish_reason": None,
        "token_ids": None,
    }  # fmt: skip
    assert "usage" not in tok and "system_fingerprint" not in tok
    last = _event(w.last(0, " z", "stop", "END"))
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["choices"][0]["stop_reason"] == "END"
    # With a usage chunk to come, the fingerprint goes there, not on the finish chunk.
    assert "system_fingerprint" not in last
    usage = _event(w.usage(5, 3))
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 5, "total_tokens": 8, "completion_tokens": 3}
    assert usage["system_fingerprint"] == "vllm-x-1"
    no_usage = ChunkWriter(True, "chatcmpl-1", 123, "m", "vllm-x-1", include_usage=False)
    assert _event(no_usage.last(0, "", "length", None))["system_fingerprint"] == "vllm-x-1"


def test_completion_chunks_match_vllm_shapes():
    w = ChunkWriter(False, "cmpl-1", 1, "m", "vllm-x-1", include_usage=False)
    tok = _event(w.token(0, " ab"))
    assert tok["object"] == "text_completion" and "usage" not in tok
    assert tok["choices"][0] == {
        "index": 0, "text": " ab", "logprobs": None, "finish_reason": None, "stop_reason": None,
        "prompt_token_ids": None, "token_ids": None,
    }  # fmt: skip
    last = _event(w.last(0, "", "length", None))
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["system_fingerprint"] == "vllm-x-1"


def test_continuous_usage_stats_put_each_choice_usage_on_every_chunk():
    chat = ChunkWriter(True, "c", 1, "m", "fp", include_usage=True, continuous=True)
    assert _event(chat.role(1, 7))["usage"] == {
        "prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0,
        "completion_tokens_details": None,
    }  # fmt: skip
    assert _event(chat.token(1, "x", 7, 1))["usage"]["completion_tokens"] == 1
    last = _event(chat.last(1, "y", "length", None, 7, 2))
    assert last["usage"]["total_tokens"] == 9 and "system_fingerprint" not in last
    comp = ChunkWriter(False, "c", 1, "m", "fp", include_usage=True, continuous=True)
    assert _event(comp.token(0, "x", 2, 1))["usage"] == {
        "prompt_tokens": 2, "total_tokens": 3, "completion_tokens": 1,
    }  # fmt: skip
    # Without include_usage vLLM sends no usage at all.
    off = ChunkWriter(False, "c", 1, "m", "fp", include_usage=False, continuous=True)
    assert "usage" not in _event(off.token(0, "x", 2, 1))


def test_priority_is_checked_as_vllm_checks_it():
    import pytest

    from llmplane.sim.protocol import ApiError

    def priority(value):
        return parse_sampling({"max_tokens": 1, "priority": value}, chat=False).priority

    assert parse_sampling({"max_tokens": 1}, chat=False).priority == 0
    # pydantic's lax integers, as vLLM 0.32 answered them (checked against the real server)
    assert [priority(v) for v in (-3, 5, True, 2.0, "5", (1 << 63) - 1)] == [
        -3, 5, 1, 2, 5, (1 << 63) - 1
    ]  # fmt: skip
    for bad, kind in ((1.5, "int_from_float"), (None, "int_type"), ("x", "int_parsing"),
                      (1 << 63, "less_than_equal"), (-(1 << 63) - 1, "greater_than_equal"),
                      ([1], "int_type")):  # fmt: skip
        with pytest.raises(ApiError) as err:
            priority(bad)
        assert err.value.code == 400 and kind in str(err.value), bad
        assert err.value.param == "body.priority"
