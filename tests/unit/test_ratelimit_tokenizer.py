"""Input tokens counted with a model's own tokenizer (``tokenizer.json``; needs the optional
``tokenizers`` package): a tiny word-level tokenizer built here, no download."""

from __future__ import annotations

import orjson
import pytest

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.ratelimit import RateLimiter
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.tokens import TokenCounter
from tests.ratelimit_requests import hook_ctx

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture
def tokenizer_dir(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "user": 1, "hello": 2, "world": 3, "system": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def test_counts_with_the_tokenizer_of_the_model(tokenizer_dir):
    counter = TokenCounter({"m": str(tokenizer_dir)})  # a directory holding tokenizer.json
    doc = {"messages": [{"role": "user", "content": "hello world hello"}]}
    assert counter.count(doc, "m") == 4  # user + 3 words
    long = {"messages": [{"role": "user", "content": "x" * 400}]}
    assert counter.count(long, "m") == 2  # user + one unknown word, not 101
    # Another model, or a file that is not there: the chars / 4 estimate.
    assert counter.count(long, "other") == 101
    missing = TokenCounter({"m": str(tokenizer_dir / "nope.json")})
    assert missing.count(long, "m") == 101


def test_tokenizers_are_read_at_start_not_on_a_request(tokenizer_dir):
    """A request never reads a tokenizer file (that would stall the worker's event loop): the
    counter made at the gateway's start has it already."""
    counter = TokenCounter({"m": str(tokenizer_dir)})
    (tokenizer_dir / "tokenizer.json").unlink()
    assert counter.count({"prompt": "hello world"}, "m") == 2  # the tokenizer's count, not 3


def test_completion_prompt_and_token_ids(tokenizer_dir):
    counter = TokenCounter({"m": str(tokenizer_dir / "tokenizer.json")})
    assert counter.count({"prompt": "hello world"}, "m") == 2
    assert counter.count({"prompt": [5, 6, 7]}, "m") == 3
    assert counter.count({"prompt": ["hello", "world world"]}, "m") == 3


async def test_the_limiter_uses_the_configured_tokenizer(tokenizer_dir):
    limiter = RateLimiter(GatewayConfig(rate_limit_tokenizers={"m": str(tokenizer_dir)}))
    limiter.update(
        [
            {
                "kind": "ModelRoute",
                "metadata": {"name": "r", "namespace": "default"},
                "spec": {
                    "modelName": "r",
                    "rules": [{"targetModels": [{"modelServerName": "s"}]}],
                    "rateLimit": {"inputTokensPerUnit": 10},
                },
            }
        ]
    )

    class D:
        route = "ModelRoute/default/r#0"
        model = "m"

    body = {"model": "r", "messages": [{"role": "user", "content": "hello " * 5}]}
    req = InferenceRequest("/v1/chat/completions", {}, orjson.dumps(body))
    res = await limiter.reserve(hook_ctx(req, D()))
    assert [a for part in res.taken for a in part.amounts] == [("input", 6)]
