"""Workload generators for the routing benchmark (pure: a seeded ``random.Random`` in, a list
of requests out). Lengths are in tokens of the simulator's tokenizer: 4 characters a token
(``llmplane.sim.tokenizer``), so a text of ``4 * n`` ASCII characters is ``n`` prompt tokens
(plus a few for the chat template).

- ``shared_prefix``: G groups x R requests; each group has one long system prompt, each
  request its own short question (SGLang's generated-shared-prefix dataset); groups shuffled.
- ``multi_round``: U users x N rounds of chat; round k sends the system prompt and the whole
  history so far (k user turns, k - 1 assistant turns), so each request's prompt extends the
  user's previous one; all users' round k come before any round k + 1.
- ``mixed``: prompt and output lengths drawn from wide ranges (short chat to long documents);
  pair it with bursty arrivals.
- ``lora_mix``: requests spread over A adapters with Zipf-like weights (adapter k has weight
  1 / (k + 1)), to be run with fewer adapter slots than adapters (``--max-loras 4``).

Arrivals: ``poisson_arrivals`` (open loop, exponential gaps), optionally bursty (the rate is
multiplied by ``burst`` during every other ``period``-second window).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

CHARS_PER_TOKEN = 4
_WORDS = ("alpha", "bravo", "delta", "gamma", "kilo", "lima", "omega", "sigma", "tango", "zulu")


def text(rng: random.Random, tokens: int) -> str:
    """Random ASCII text of exactly ``tokens * 4`` characters."""
    n = tokens * CHARS_PER_TOKEN
    parts: list[str] = []
    size = 0
    while size < n:
        w = rng.choice(_WORDS) + " "
        parts.append(w)
        size += len(w)
    return "".join(parts)[:n]


@dataclass
class Request:
    messages: list[dict[str, str]]
    max_tokens: int
    model: str = ""
    group: int = -1  # shared-prefix group, user (multi-round) or adapter index
    round: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def prompt_chars(self) -> int:
        return sum(len(m["content"]) for m in self.messages)

    def body(self, model: str, stream: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "model": self.model or model,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
        if stream:
            doc["stream"] = True
            doc["stream_options"] = {"include_usage": True}
        return doc


def shared_prefix(
    rng: random.Random,
    groups: int = 32,
    per_group: int = 16,
    system_tokens: int = 2000,
    question_tokens: int = 64,
    output_tokens: int = 64,
    salt: str = "",
) -> list[Request]:
    systems = [f"[{salt}:{g}] " + text(rng, system_tokens) for g in range(groups)]
    out = []
    for g in range(groups):
        for _r in range(per_group):
            out.append(
                Request(
                    [
                        {"role": "system", "content": systems[g]},
                        {"role": "user", "content": text(rng, question_tokens)},
                    ],
                    output_tokens,
                    group=g,
                    meta={"system_chars": len(systems[g])},
                )
            )
    rng.shuffle(out)
    return out


def multi_round(
    rng: random.Random,
    users: int = 24,
    rounds: int = 6,
    system_tokens: int = 500,
    user_tokens: int = 150,
    output_tokens: int = 64,
    salt: str = "",
) -> list[Request]:
    histories: list[list[dict[str, str]]] = [
        [{"role": "system", "content": f"[{salt}:u{u}] " + text(rng, system_tokens)}]
        for u in range(users)
    ]
    out = []
    for k in range(rounds):
        order = list(range(users))
        rng.shuffle(order)
        for u in order:
            h = histories[u]
            if k:
                # The previous answer, as a client would append it (synthetic text).
                h.append({"role": "assistant", "content": text(rng, output_tokens)})
            h.append({"role": "user", "content": text(rng, user_tokens)})
            out.append(Request([dict(m) for m in h], output_tokens, group=u, round=k))
    return out


def mixed(
    rng: random.Random,
    n: int = 300,
    prompt_range: tuple[int, int] = (32, 3000),
    output_range: tuple[int, int] = (8, 256),
    salt: str = "",
) -> list[Request]:
    """Log-uniform prompt and output lengths (many short, some long)."""
    out = []
    for i in range(n):
        p = round(_log_uniform(rng, *prompt_range))
        o = round(_log_uniform(rng, *output_range))
        out.append(
            Request(
                [{"role": "user", "content": f"[{salt}:{i}] " + text(rng, p)}],
                o,
                meta={"prompt_tokens": p},
            )
        )
    return out


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    import math

    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def lora_weights(adapters: int) -> list[float]:
    total = sum(1.0 / (k + 1) for k in range(adapters))
    return [1.0 / (k + 1) / total for k in range(adapters)]


def lora_mix(
    rng: random.Random,
    adapter_names: list[str],
    n: int = 300,
    prompt_tokens: int = 400,
    output_tokens: int = 64,
    salt: str = "",
) -> list[Request]:
    weights = lora_weights(len(adapter_names))
    out = []
    for i in range(n):
        k = rng.choices(range(len(adapter_names)), weights)[0]
        out.append(
            Request(
                [{"role": "user", "content": f"[{salt}:{i}] " + text(rng, prompt_tokens)}],
                output_tokens,
                model=adapter_names[k],
                group=k,
            )
        )
    return out


def poisson_arrivals(
    rng: random.Random, n: int, rate: float, burst: float = 1.0, period: float = 0.0
) -> list[float]:
    """``n`` arrival times (seconds from 0) of a Poisson process of ``rate`` per second; with
    ``burst > 1`` and ``period > 0`` the rate is ``rate * burst`` during odd windows
    [period, 2 period), [3 period, 4 period)... and ``rate`` otherwise."""
    times = []
    t = 0.0
    for _ in range(n):
        r = rate
        if burst > 1 and period > 0 and int(t // period) % 2 == 1:
            r = rate * burst
        t += rng.expovariate(r)
        times.append(t)
    return times
