"""What the gateway's tokenization of a chat request costs (issue 29's goal: a 6,000-token chat
under 1 ms at p99 on one core, prefix caching allowed).

    python -m bench.tokenization [--requests 400] [--groups 16] [--no-write]

Two tokenizers, both built offline: the tiny test model's (a 512-token byte-level BPE, so a
6,000-token chat is mostly single characters and short merges) and a 32,000-token byte-level
BPE trained on generated text of made-up words (closer to a real model's vocabulary size; its
6,000 tokens are about 5x more text). Each request is a chat in the issue's shape: one of
``--groups`` system prompts (~90 % of the tokens, shared by the group), then a question of its
own (~10 %), rendered with the tiny model's chat template and encoded as vLLM would. Per
tokenizer, request by request (``time.thread_time``, CPU of this thread only: other processes
on a shared machine do not inflate it):

- ``warm``: the group's system prompt was seen before (the steady state: pieces cached);
- ``cold``: the first request of each group (everything encoded);
- ``whole``: the same warm requests encoded without the piece cache (the tokenizer alone).

``TOKENIZERS_PARALLELISM=false`` keeps the tokenizers library on one core. Writes the
``tokenization`` section of docs/benchmarks.md and bench/results/tokenization.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.common import RESULTS, machine, machine_line, percentile, table, write_section
from llmplane.gateway.tokenization import ModelTokenizer
from llmplane.testing.tiny_model import CHAT_TEMPLATE, build_tokenizer, corpus

TARGET_TOKENS = 6_000


def made_up_words(rng: random.Random, n: int) -> list[str]:
    syllables = [a + b for a in "bcdfghklmnprstvz" for b in "aeiou"] + ["th", "st", "qu", "ng"]
    vocabulary = [
        "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(20_000)
    ]
    weights = [1 / (i + 1) for i in range(len(vocabulary))]  # Zipf-like, as in real text
    return rng.choices(vocabulary, weights, k=n)


def build_large(out: Path) -> Path:
    """A 32,000-token byte-level BPE with the tiny model's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(1)
    words = made_up_words(rng, 2_000_000)
    lines = [
        " ".join(words[i : i + 20]) + rng.choice([".", ",", "?", "!"])
        for i in range(0, len(words), 20)
    ]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=32_000,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE})
    )
    return out


def text_of_tokens(tokenizer: ModelTokenizer, rng: random.Random, tokens: int, words: Any) -> str:
    """Generated text of about ``tokens`` tokens under ``tokenizer``."""
    text = ""
    while True:
        chunk = " ".join(words(rng, 400))
        text += chunk + "\n"
        if len(tokenizer.tokenizer.encode(text, add_special_tokens=False).ids) >= tokens:
            return text


def requests(tokenizer: ModelTokenizer, words: Any, groups: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(3)
    systems = [
        text_of_tokens(tokenizer, rng, int(TARGET_TOKENS * 0.9), words) for _ in range(groups)
    ]
    out = []
    for i in range(n):
        question = text_of_tokens(tokenizer, rng, int(TARGET_TOKENS * 0.1), words)
        out.append(
            {
                "messages": [
                    {"role": "system", "content": systems[i % groups]},
                    {"role": "user", "content": question},
                ]
            }
        )
    return out


def measure(tokenizer: ModelTokenizer, docs: list[dict[str, Any]], groups: int) -> dict[str, Any]:
    warm, cold, whole, lengths = [], [], [], []
    for i, doc in enumerate(docs):
        started = time.thread_time()
        ids = tokenizer.chat_ids(doc)
        spent = time.thread_time() - started
        (cold if i < groups else warm).append(spent)
        lengths.append(len(ids))
        if i >= groups:
            started = time.thread_time()
            text = tokenizer.render_chat(doc)
            full = tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
            whole.append(time.thread_time() - started)
            assert full == ids, "pieces and whole encoding differ"
    ms = lambda values, q: round(percentile(values, q) * 1000, 3)  # noqa: E731
    return {
        "tokens_mean": round(sum(lengths) / len(lengths)),
        **{
            f"{name}_p{q}_ms": ms(values, q)
            for name, values in (("warm", warm), ("cold", cold), ("whole", whole))
            for q in (50, 99)
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    info = machine()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tiny = Path(tmp) / "tiny"
        build_tokenizer(tiny)
        pool = " ".join(corpus(500)).split()
        tiny_words = lambda rng, n: rng.choices(pool, k=n)  # noqa: E731
        large = build_large(Path(tmp) / "large")
        for name, path, words in (
            ("tiny (512)", tiny, tiny_words),
            ("BPE 32k", large, made_up_words),
        ):
            tokenizer = ModelTokenizer.load(path)
            docs = requests(tokenizer, words, args.groups, args.requests + args.groups)
            results[name] = measure(tokenizer, docs, args.groups)
            print(name, results[name], flush=True)
    rows = [
        [name, r["tokens_mean"], r["warm_p50_ms"], r["warm_p99_ms"], r["cold_p50_ms"], r["cold_p99_ms"], r["whole_p50_ms"], r["whole_p99_ms"]]
        for name, r in results.items()
    ]  # fmt: skip
    text = (
        f"{machine_line(info)}\n\n"
        + table(
            [
                "tokenizer",
                "tokens",
                "warm p50 ms",
                "warm p99 ms",
                "cold p50 ms",
                "cold p99 ms",
                "whole p50 ms",
                "whole p99 ms",
            ],
            rows,
        )
        + "\n"
    )
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "tokenization.json").write_text(
            json.dumps({"machine": info, "results": results}, indent=2)
        )
        write_section("tokenization", text)


if __name__ == "__main__":
    main()
