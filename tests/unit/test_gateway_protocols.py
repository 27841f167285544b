"""What the gateway reads from Responses and Messages bodies: the prompt text the prefix
scorers see, the input-token estimate a token limit reserves, and usage in either API's
fields."""

from __future__ import annotations

import orjson

from llmplane.gateway.hooks import Usage
from llmplane.gateway.ratelimit.usage_filter import ask_stream_usage
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.response_usage import StreamScanner
from llmplane.gateway.tokens import estimate_tokens

RESPONSES = {
    "model": "m",
    "instructions": "S" * 40,
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "Q" * 40}]}],
}
MESSAGES = {
    "model": "m",
    "max_tokens": 4,
    "system": [{"type": "text", "text": "S" * 40}],
    "messages": [{"role": "user", "content": "Q" * 40}],
}


def test_prompt_text_carries_the_system_prompt_first() -> None:
    for path, doc in (("/v1/responses", RESPONSES), ("/v1/messages", MESSAGES)):
        prompt = InferenceRequest(path, {}, orjson.dumps(doc)).prompt
        assert prompt.startswith(b"system:" + b"S" * 40), (path, prompt)
        assert b"user:" + b"Q" * 40 in prompt, (path, prompt)


def test_input_estimate_counts_instructions_system_and_items() -> None:
    assert estimate_tokens(RESPONSES) == 20  # 80 characters
    assert estimate_tokens(MESSAGES) == 21  # 80 characters and the role
    assert estimate_tokens({"model": "m", "input": "Q" * 40, "instructions": "S" * 40}) == 20


def test_usage_in_either_api() -> None:
    assert Usage.of({"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}) == Usage(7, 3)
    # Anthropic counts cached input apart from input_tokens.
    cached = {"input_tokens": 2, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 1}
    assert Usage.of({**cached, "output_tokens": 4}) == Usage(8, 4)
    assert Usage.of({"prompt_tokens": 7, "completion_tokens": 3}) == Usage(7, 3)


def test_a_messages_stream_has_its_input_and_output_in_two_events() -> None:
    # As Anthropic sends them: message_delta carries the output only (vLLM repeats the input).
    scanner = StreamScanner()
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}}
    delta = {"type": "message_delta", "usage": {"output_tokens": 5}}
    for kind, data in (("message_start", start), ("message_delta", delta)):
        scanner.feed(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n")
    assert Usage.of(scanner.usage) == Usage(9, 5)


def test_their_streams_go_upstream_as_sent() -> None:
    # Their streams always carry usage: a token limit asks for nothing (chat's does).
    for path, doc in (("/v1/responses", RESPONSES), ("/v1/messages", MESSAGES)):
        body = orjson.dumps({**doc, "stream": True})
        inference = InferenceRequest(path, {}, body)
        assert ask_stream_usage(inference) is None
        assert inference.final_body() == body
    chat = InferenceRequest("/v1/chat/completions", {}, orjson.dumps({**MESSAGES, "stream": True}))
    assert ask_stream_usage(chat) is not None
    assert orjson.loads(chat.final_body())["stream_options"] == {"include_usage": True}
