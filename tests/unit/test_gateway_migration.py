"""``gateway/splice.py``'s Splice on its own: events in (as vLLM and the sim send them, cut
anywhere), the client's stream out, and the continuation request. No sockets: the streams with
real engines are tests/integration/test_gateway_migration.py."""

from __future__ import annotations

import tracemalloc

import orjson

from llmplane.gateway.splice import KEEP_BYTES, MAX_EVENT, Splice, spliceable
from llmplane.sim.protocol import ChunkWriter


def ev(obj: dict | str) -> bytes:
    return b"data: " + (obj.encode() if isinstance(obj, str) else orjson.dumps(obj)) + b"\n\n"


def completion(rid: str, text: str, ids: list[int], finish=None, prompt_ids=None) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish, "token_ids": ids,
              "prompt_token_ids": prompt_ids}  # fmt: skip
    return ev({"id": rid, "object": "text_completion", "created": 1, "model": "m",
               "choices": [choice]})  # fmt: skip


def usage(rid: str, prompt: int, completion: int) -> bytes:
    return ev({"id": rid, "created": 1, "model": "m", "choices": [],
               "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                         "total_tokens": prompt + completion}})  # fmt: skip


def events(data: bytes) -> list[dict]:
    return [orjson.loads(e[6:]) for e in data.split(b"\n\n") if e and e != b"data: [DONE]"]


def test_a_completion_stream_continues_at_the_token_level():
    body = {"model": "m", "prompt": "hi", "max_tokens": 5, "min_tokens": 3, "seed": 4,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    splice, sent = Splice.of(orjson.dumps(body), chat=False)
    assert orjson.loads(sent) == {**body, "return_token_ids": True}
    first = completion("a", " foo", [7], prompt_ids=[1, 2]) + completion("a", " bar", [8])
    # cut mid-event: only whole events go out
    out = splice.feed(first[:10]) + splice.feed(first[10:])
    sent_events = events(out)
    assert [e["choices"][0]["text"] for e in sent_events] == [" foo", " bar"]
    assert all(e["choices"][0]["token_ids"] is None for e in sent_events)  # not asked for
    assert sent_events[0]["choices"][0]["prompt_token_ids"] is None
    assert splice.feed(completion("a", " ba", [9])[:-3]) == b""  # lost mid-event
    assert splice.can_continue() is None
    path, cont = splice.continuation("/v1/completions")
    cont = orjson.loads(cont)
    assert (
        path == "/v1/completions"
        and cont["prompt"] == [1, 2, 7, 8]
        and cont["max_tokens"] == 3
        and cont["min_tokens"] == 1
    )
    assert cont["seed"] == 4 and cont["temperature"] == 0 and cont["return_token_ids"]
    splice.started()
    rest = (
        completion("b", " baz", [9], prompt_ids=[1, 2, 7, 8])
        + completion("b", " qux", [10])
        + completion("b", "", [11], finish="length")
        + usage("b", 4, 3)
        + b"data: [DONE]\n\n"
    )
    out = events(splice.feed(rest))
    assert {(e["id"], e["created"], e["model"]) for e in out} == {("a", 1, "m")}
    assert out[0]["choices"][0]["prompt_token_ids"] is None
    assert out[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    assert splice.done and splice.tokens == 5


def chunk(rid: str, delta: dict, ids: list[int] | None, **top) -> bytes:
    return ev({"id": rid, "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": delta, "finish_reason": None,
                            "token_ids": ids}], **top})  # fmt: skip


def test_a_chat_stream_continues_as_a_completion_of_its_token_ids():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_completion_tokens": 10, "temperature": 0, "seed": 2, "tools": None}  # fmt: skip
    splice, _ = Splice.of(orjson.dumps(body), chat=True)
    splice.feed(
        chunk("a", {"role": "assistant", "content": ""}, None, prompt_token_ids=[5, 6])
        + chunk("a", {"content": "Hel"}, [1])
    )
    path, cont = splice.continuation("/v1/chat/completions?x=1")
    assert path == "/v1/completions?x=1"
    assert orjson.loads(cont) == {"model": "m", "stream": True, "temperature": 0, "seed": 2,
                                  "prompt": [5, 6, 1], "max_tokens": 9,
                                  "return_token_ids": True}  # fmt: skip
    splice.started()
    out = events(
        splice.feed(
            completion("b", "lo", [2], prompt_ids=[5, 6, 1])
            + completion("b", "!", [3], finish="length")
        )
    )
    assert [e["object"] for e in out] == ["chat.completion.chunk"] * 2
    assert [e["choices"][0]["delta"] for e in out] == [{"content": "lo"}, {"content": "!"}]
    assert all("text" not in e["choices"][0] and e["id"] == "a" for e in out)


def test_a_chat_stream_without_prompt_ids_continues_its_final_message():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_completion_tokens": 10, "return_token_ids": True}  # fmt: skip
    splice, sent = Splice.of(orjson.dumps(body), chat=True)
    assert orjson.loads(sent) == body  # the client asked for ids: they stay

    out = splice.feed(
        chunk("a", {"role": "assistant", "content": ""}, None)
        + chunk("a", {"content": "Hel"}, [1])
        + chunk("a", {"content": "lo"}, [2])
    )
    assert events(out)[1]["choices"][0]["token_ids"] == [1]  # asked for: kept
    path, cont = splice.continuation("/v1/chat/completions")
    cont = orjson.loads(cont)
    assert path == "/v1/chat/completions"
    assert cont["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert cont["continue_final_message"] is True and cont["add_generation_prompt"] is False
    assert cont["max_completion_tokens"] == 8
    splice.started()
    out = events(
        splice.feed(
            chunk("b", {"role": "assistant", "content": ""}, None)
            + chunk("b", {"content": " you"}, [3])
        )
    )
    # the continuation's role chunk is not sent again
    assert len(out) == 1 and out[0]["choices"][0]["delta"] == {"content": " you"}
    assert out[0]["id"] == "a" and out[0]["choices"][0]["token_ids"] == [3]
    # a second migration continues the message the first one continued
    splice.started()
    again = orjson.loads(splice.continuation("/v1/chat/completions")[1])
    assert again["messages"][-1]["content"] == "Hello you"
    assert len(again["messages"]) == 2


def test_a_chat_continuing_its_own_final_message_continues_it_further():
    last = {"role": "assistant", "content": [{"type": "text", "text": "Once"}]}
    body = {"model": "m", "messages": [{"role": "user", "content": "tell"}, last],
            "stream": True, "continue_final_message": True, "add_generation_prompt": False}  # fmt: skip
    splice, _ = Splice.of(orjson.dumps(body), chat=True)
    splice.feed(chunk("a", {"role": "assistant", "content": ""}, None))
    splice.feed(chunk("a", {"content": " upon"}, [5]))
    path, cont = splice.continuation("/v1/chat/completions")
    messages = orjson.loads(cont)["messages"]
    assert path == "/v1/chat/completions" and len(messages) == 2
    assert messages[-1] == {"role": "assistant", "content": "Once upon"}


def test_engine_error_events_and_endless_events_lose_the_stream():
    splice, _ = Splice.of(b'{"prompt": "x", "stream": true}', chat=False)
    # the events before the error event in the same chunk still go out; nothing after it
    out = splice.feed(
        completion("a", " x", [1], prompt_ids=[3])
        + ev({"error": {"message": "boom", "code": 500}})
        + completion("a", " y", [2])
    )
    assert [e["choices"][0]["text"] for e in events(out)] == [" x"]
    assert "boom" in splice.lost and b"boom" in splice.error_event and splice.tokens == 1
    assert splice.feed(completion("a", " z", [4])) == b""
    splice.started()  # a continuation starts clean
    assert splice.lost is None and splice.error_event is None
    assert splice.feed(b"data: " + b"x" * (MAX_EVENT + 1)) == b"" and "longer" in splice.lost
    fresh, _ = Splice.of(b'{"prompt": "x", "stream": true}', chat=False)
    fresh.feed(completion("a", " x", [1], prompt_ids=[3]) + b"data: [DONE]\n\n")
    assert fresh.lost == "the stream ended without a finish reason" and not fresh.done


def test_what_cannot_be_continued():
    assert not spliceable({"prompt": "x", "n": 2}, False)
    assert not spliceable({"messages": [{"role": "user"}], "tools": [{}]}, True)
    assert not spliceable({"prompt": ["a", "b"]}, False)  # several prompts
    assert not spliceable({"prompt": [1, True]}, False)
    assert spliceable({"prompt": [1, 2]}, False) and spliceable({"prompt": "x"}, False)
    assert Splice.of(b"not json", chat=False) is None
    splice, _ = Splice.of(b'{"prompt": "x", "max_tokens": 1}', chat=False)
    assert splice.can_continue() == "nothing was streamed yet"
    splice.feed(completion("a", " x", [1], prompt_ids=[3]))
    assert splice.can_continue() == "no tokens left to generate"
    # lost after the final chunk: only the usage asked for and [DONE] are missing
    splice, _ = Splice.of(
        b'{"prompt": "x", "max_tokens": 1, "stream_options": {"include_usage": true}}', False
    )
    splice.feed(completion("a", " x", [1], finish="length", prompt_ids=[3, 4]))
    end = splice.ending()
    assert events(end)[0]["usage"]["completion_tokens"] == 1 and end.endswith(b"[DONE]\n\n")


def test_a_stream_never_lost_goes_out_as_the_engine_sends_it_unasked():
    """Events in the sim's (vLLM's) exact bytes: with the ids the gateway asked for set back
    to null they are the engine's own unasked stream, byte for byte; a chat chunk that only
    carried ids (vLLM: ``"delta": {}``) is dropped, its ids still counted for a continuation."""
    asked, plain = (ChunkWriter(True, "a", 1, "m", "fp", True) for _ in range(2))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_tokens": 50, "stream_options": {"include_usage": True}}  # fmt: skip
    splice, _ = Splice.of(orjson.dumps(body), chat=True)
    hollow = chunk("a", {}, [9])
    texts = [f" w{k}" for k in range(40)]
    upstream = [asked.role(0, 2, [5, 6]) + asked.token(0, texts[0], ids=[100])]
    upstream += [asked.token(0, t, ids=[100 + k]) for k, t in enumerate(texts[1:20], 1)]
    upstream.insert(5, hollow)
    expected = [plain.role(0, 2) + plain.token(0, texts[0])]
    expected += [plain.token(0, t) for t in texts[1:20]]
    out = [splice.feed(piece) for piece in upstream]
    assert b"".join(out) == b"".join(expected)
    # read lazily: up to the chunk that had to be parsed (the hollow one), the rest kept
    assert len(splice.kept) == 15 and splice.tokens == 6
    # lost: what was sent is read now, the dropped chunk's id included, in order
    path, cont = splice.continuation("/v1/chat/completions")
    assert path == "/v1/completions"
    assert orjson.loads(cont)["prompt"] == [5, 6, 100, *range(101, 105), 9, *range(105, 120)]
    assert orjson.loads(cont)["max_tokens"] == 50 - 21 and not splice.kept
    # the end as the engine sends it: finish, usage, [DONE]
    fresh, _ = Splice.of(orjson.dumps(body), chat=True)
    fresh.feed(asked.role(0, 2, [5, 6]) + asked.token(0, "x", ids=[1]))
    last = asked.last(0, "y", "length", None, ids=[2]) + asked.usage(2, 2) + b"data: [DONE]\n\n"
    assert fresh.feed(last) == plain.last(0, "y", "length", None) + plain.usage(2, 2) + (
        b"data: [DONE]\n\n"
    )
    assert fresh.done and fresh.finished


def test_the_end_of_a_stream_passed_as_bytes_is_still_read():
    """Past the first event a stream goes out unparsed: its finish reason is still seen (a loss
    after it is only a missing end) and a [DONE] without one still loses the stream, after
    what came before it in the chunk went out."""
    body = b'{"prompt": "x", "stream": true}'
    splice, _ = Splice.of(body, chat=False)
    splice.feed(completion("a", " x", [1], prompt_ids=[3]))  # parsed: the head
    splice.feed(completion("a", " y", [2], finish="length"))  # kept as it went out
    assert splice.finished and splice.kept and not splice.done
    assert splice.ending().endswith(b"data: [DONE]\n\n") and splice.done
    cut, _ = Splice.of(body, chat=False)
    cut.feed(completion("a", " x", [1], prompt_ids=[3]))
    cut.feed(completion("a", " y", [2]))
    out = cut.feed(completion("a", " z", [4]) + b"data: [DONE]\n\n")
    assert [e["choices"][0]["text"] for e in events(out)] == [" z"] and not cut.done
    assert cut.lost == "the stream ended without a finish reason"
    assert not cut.kept and cut.ids.tolist() == [1, 2, 4]  # all read, in order


def test_kept_events_are_bounded():
    writer = ChunkWriter(False, "a", 1, "m", "fp", False)
    splice, _ = Splice.of(b'{"prompt": "x", "stream": true, "max_tokens": 100000}', chat=False)
    splice.feed(writer.token(0, "x", ids=[1], prompt_ids=[3]))
    piece = writer.token(0, "y" * 1000, ids=[2])
    for _ in range(3 * KEEP_BYTES // len(piece)):
        splice.feed(piece)
        assert splice.kept_bytes <= KEEP_BYTES
    assert splice.can_continue() is None
    assert splice.tokens == 1 + 3 * KEEP_BYTES // len(piece)


def test_a_long_stream_keeps_bytes_a_token_not_objects():
    """What a stream keeps to continue it elsewhere grows by a few bytes a token (its ids and
    text), not by Python objects (about 90 bytes a token: 9 MB for 100,000 tokens)."""
    writer = ChunkWriter(False, "a", 1, "m", "fp", False)
    splice, _ = Splice.of(b'{"prompt": "x", "stream": true, "max_tokens": 100000}', chat=False)
    splice.feed(writer.token(0, "x", ids=[1], prompt_ids=[3]))
    events = [writer.token(0, f" w{i % 10}", ids=[1000 + i]) for i in range(20_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for event in events:
            splice.feed(event)
        splice.catch_up()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert splice.ids.tolist() == [1] + [1000 + i for i in range(20_000)]
    assert "".join(splice.parts) == "x" + "".join(f" w{i % 10}" for i in range(20_000))
    assert kept < 20 * 20_000, f"{kept} bytes kept for 20,000 tokens"


def test_token_ids_that_are_not_integers_stop_a_continuation_by_ids():
    splice, _ = Splice.of(b'{"prompt": "x", "stream": true, "max_tokens": 10}', chat=False)
    splice.feed(completion("a", " x", [1], prompt_ids=[3]))
    splice.feed(completion("a", " y", ["2"]))
    big = completion("a", " z", [4]).replace(b"[4]", str([2**70]).encode())
    splice.feed(big)
    assert splice.can_continue() == "the engine sent no token ids" and splice.tokens == 3


def test_forgotten_tokens_are_generated_again():
    """Tokens whose text the engine held back (they end inside a character) leave the
    continuation's prompt and count as not generated."""
    body = b'{"prompt": "x", "stream": true, "max_tokens": 10}'
    splice, _ = Splice.of(body, chat=False)
    splice.feed(completion("a", " x", [1], prompt_ids=[3]))
    splice.feed(completion("a", "", [2]))  # its text held back
    assert splice.can_continue() is None
    splice.forget(1)
    cont = orjson.loads(splice.continuation("/v1/completions")[1])
    assert cont["prompt"] == [3, 1] and cont["max_tokens"] == 9 and splice.tokens == 1
