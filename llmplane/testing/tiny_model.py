"""A tiny random Llama that real vLLM serves on CPU, built offline in seconds.

Tests and benchmarks need a model vLLM can load without a download: :func:`build_tiny_llama`
trains a small byte-level BPE tokenizer on generated text, gives it a chat template, and saves a
randomly initialised 2-layer Llama (hidden size 128) next to it with ``transformers``.
:func:`build_lora_adapter` writes a PEFT-style LoRA adapter for such a model (a few tensors in
safetensors plus ``adapter_config.json``), which vLLM serves with ``--enable-lora``.

The weights are random: the text is nonsense, but every engine code path (tokenising, chat
templates, batching, prefix caching, speculative decoding, LoRA) runs for real.
torch, transformers and tokenizers are imported lazily: they come with vLLM, not with llmplane.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

# Enough to render the OpenAI chat API's messages; the generation prompt opens the answer.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
_WORDS = [
    "the",
    "a",
    "model",
    "token",
    "request",
    "replica",
    "gateway",
    "engine",
    "prefix",
    "cache",
    "route",
    "serve",
    "stream",
    "queue",
    "batch",
    "block",
    "adapter",
    "draft",
    "speculative",
    "decode",
    "prompt",
    "answer",
    "user",
    "system",
    "assistant",
    "metric",
    "latency",
    "throughput",
    "memory",
    "kernel",
    "layer",
    "head",
    "vector",
    "weight",
    "random",
    "tiny",
    "llama",
    "fast",
    "slow",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "hello",
    "world",
    "question",
    "why",
    "how",
    "what",
]


def corpus(lines: int = 2000, seed: int = 0) -> list[str]:
    """Generated sentences over a small word list (also good prompts for tests)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 20))) for _ in range(lines)]


def build_tokenizer(out: Path, vocab_size: int = 512) -> int:
    """Train and save a byte-level BPE tokenizer with the chat template; returns its vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="</s>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return tok.get_vocab_size()


def build_tiny_llama(
    out: Path,
    *,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    max_positions: int = 1024,
    seed: int = 0,
) -> Path:
    """Save a random Llama with its tokenizer under ``out`` (a Hugging Face model directory).

    Models built with the same ``seed``-independent tokenizer share a vocabulary, so one can be
    another's draft model for speculative decoding.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return out


def build_lora_adapter(
    out: Path,
    base: Path,
    *,
    rank: int = 8,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    seed: int = 1,
) -> Path:
    """Save a random LoRA adapter (PEFT layout) for the model saved at ``base``."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((Path(base) / "config.json").read_text())
    hidden = config["hidden_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    out_dims = {"q_proj": hidden, "k_proj": hidden * kv_heads // heads}
    out_dims["v_proj"] = out_dims["k_proj"]
    out_dims["o_proj"] = hidden
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target in targets:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, generator=gen) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(out_dims[target], rank, generator=gen) * 0.02
            )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "base_model_name_or_path": str(base),
                "r": rank,
                "lora_alpha": rank * 2,
                "lora_dropout": 0.0,
                "bias": "none",
                "target_modules": list(targets),
                "fan_in_fan_out": False,
                "inference_mode": True,
            },
            indent=2,
        )
    )
    return out
