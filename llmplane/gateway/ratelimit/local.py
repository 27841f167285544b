"""The fast path of one limit on local buckets (the common case: a Tenant's limit, or a
route's, held by this process): the buckets resolved once per limit, one call that makes a
request's amounts, refills, checks and takes them all and writes the ``x-ratelimit-*``
headers, and one that settles, without a state object per bucket. These calls are functions
written out per bucket layout from fixed templates (``_straight_*``): a call or a loop costs
the gateway process far more than a micro-benchmark shows (docs/benchmarks.md, issue 15). It gives exactly what ``buckets.reserve_local`` +
``rate_headers`` (and ``settle_deltas`` + ``TokenBucket.adjust``) give for a single limit
(``tests/unit/test_ratelimit_local.py`` compares them); a refusal, the rarer case, is left
to that general path, which builds the 429.

Everything constant per limit is made once: the header lines with their names and limit
values, as a format into which a take puts its remaining/reset values in one call; the
headers go to the client as these lines (``hooks.Reservation.response_lines``). The lines
are a function of the buckets' levels after the take alone (limits and rates are fixed for
a plan's life), so a take that leaves every level as the last one did reuses the last lines
instead of formatting them again: a tenant well inside its limits finds its buckets full
before every request, and takes the same amounts.

Compiled (setup.py's hot path), the buckets' numbers are C doubles and the take and the
settlement are loops over them in C (``buckets.reserve_levels``, ``settle_levels``) and the
header lines are written in C (``buckets.HeaderLines``), which beat the written-out Python
there; ``LOOPS`` says which a new plan uses (the tests
check both against the general path)."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from llmplane.gateway.ratelimit.buckets import (
    COMPILED,
    KINDS,
    HeaderLines,
    PlanState,
    TokenBucket,
    duration,
    reserve_levels,
    settle_levels,
    take_levels,
)
from llmplane.gateway.ratelimit.limits import BUDGET, INPUT, OUTPUT, REQUESTS, output_reservation
from llmplane.gateway.tokens import estimate_tokens

# Whether a new plan of a process's own buckets takes and settles with the compiled loops
# (``buckets.take_levels`` / ``settle_levels``) instead of the written-out functions.
LOOPS = COMPILED

_TOKENS = (
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
)


def _names(direction: str) -> tuple[str, str, str]:
    suffix = "requests" if direction == REQUESTS else f"tokens-{direction}"
    return (
        f"x-ratelimit-limit-{suffix}",
        f"x-ratelimit-remaining-{suffix}",
        f"x-ratelimit-reset-{suffix}",
    )


# ``duration`` of 1 ms .. 1 s (a bucket just taken from is nearly always refilled within a
# second), formatted once.
_MILLISECONDS = [f"{max(1, ms)}ms" for ms in range(1001)]


def _refill_lines(n: int) -> list[str]:
    """``TokenBucket.refill`` of buckets ``b0`` .. ``b{n-1}`` inline, into ``l0`` ..; a level
    above the burst after a limit was lowered is cut to it."""
    lines = []
    for i in range(n):
        lines += [
            f"    l{i} = b{i}.level",
            f"    s = b{i}.stamp",
            "    if now > s:",
            f"        l{i} += (now - s) * b{i}.rate",
            f"        b{i}.stamp = now",
            f"    burst = b{i}.burst",
            f"    if l{i} >= burst:",
            f"        l{i} = burst",
        ]
    return lines


def _made(lines: list[str], name: str, **names: Any) -> Callable[..., Any]:
    namespace: dict[str, Any] = dict(names)
    exec("\n".join(lines), namespace)  # a fixed template (see the callers)
    return namespace[name]  # type: ignore[no-any-return]


@functools.cache
def _straight_take(n: int) -> Callable[..., list[float] | None]:
    """``LocalPlan``'s refill, check and take of ``n`` buckets with its loop written out once
    per bucket (no iterator, no lists but the result: about half the loop's time, which is a
    good part of a limited request's). Made from this fixed template and ``n`` alone, as
    ``dataclasses`` makes an ``__init__``; ``tests/unit/test_ratelimit_local.py`` checks it
    against the general path for one to four buckets. Returns the levels after the take, or
    None (nothing taken; every bucket refilled, as ``reserve_local`` leaves them)."""
    lines = ["def take(buckets, amounts, now):"]
    if n:
        lines.append(f"    {', '.join(f'a{i}' for i in range(n))}, = amounts")
        lines.append(f"    {', '.join(f'b{i}' for i in range(n))}, = buckets")
    lines += _refill_lines(n)
    short = " or ".join(f"l{i} < a{i}" for i in range(n)) or "False"
    lines += [f"    if {short}:"]
    lines += [f"        b{i}.level = l{i}" for i in range(n)]
    lines += ["        return None"]  # (a plan without buckets never gets here)
    lines += [f"    b{i}.level = l{i} = l{i} - a{i}" for i in range(n)]
    lines += [f"    return [{', '.join(f'l{i}' for i in range(n))}]"]
    return _made(lines, "take")


@functools.cache
def _straight_reserve(
    rows: tuple[tuple[str, int], ...], embeddings: bool
) -> Callable[..., list[int] | None]:
    """``LocalPlan.reserve`` for buckets of one process: a request's amounts (what
    ``RateLimiter._amounts`` computes for ``rows``, (direction, limit) in the plan's order)
    and ``_straight_take``'s take in one function, written out per bucket with the limits as
    constants (a plan lives as long as its limits). Returns the amounts taken, or None when
    one is larger than its limit or the request does not fit now (nothing taken: the general
    path then answers with the 429, reusing the input count left in ``counted``). The header lines are rendered into the plan only when
    the levels after the take differ from the last ones."""
    n = len(rows)
    lines = [
        "def reserve(plan, doc, model, sent, now, counted):",
        "    default = plan.default",
    ]
    counted = False
    for i, (direction, limit) in enumerate(rows):
        if direction == REQUESTS:
            lines.append(f"    a{i} = 1")
        elif direction == OUTPUT:
            lines.append(f"    a{i} = out(doc, default, {limit})")
        else:  # INPUT, BUDGET: the input count, made once
            if not counted:
                lines.append("    count = plan.count")
                lines.append("    c = estimate(doc) if count is None else count(doc, model, sent)")
                lines.append("    counted.append(c)")
                counted = True
            if direction == BUDGET and not embeddings:
                lines.append(f"    a{i} = c + out(doc, default, {limit})")
            else:
                lines.append(f"    a{i} = c")
        lines.append(f"    if a{i} > {limit}:")
        lines.append("        return None")
    lines.append(f"    {', '.join(f'b{i}' for i in range(n))}, = plan.bucket_list")
    lines += _refill_lines(n)
    short = " or ".join(f"l{i} < a{i}" for i in range(n))
    lines += [f"    if {short}:"]
    lines += [f"        b{i}.level = l{i}" for i in range(n)]
    lines += ["        return None"]
    lines += [f"    b{i}.level = l{i} = l{i} - a{i}" for i in range(n)]
    levels = ", ".join(f"l{i}" for i in range(n))
    same = " and ".join(f"l{i} == last[{i}]" for i in range(n))
    lines += [
        "    last = plan._levels",
        f"    if last is None or not ({same}):",
        f"        plan._render([{levels}])",
        f"    return [{', '.join(f'a{i}' for i in range(n))}]",
    ]
    return _made(lines, "reserve", out=output_reservation, estimate=estimate_tokens)


@functools.cache
def _straight_settle(directions: tuple[str, ...]) -> Callable[..., Callable[..., None]]:
    """A maker of ``LocalPlan.settle`` for buckets in ``directions``: ``buckets.settle_deltas``
    and ``TokenBucket.adjust`` in one function written out per bucket (the buckets bound when
    the plan is made, the clock read once and only when something moves). Without usage, a
    failed request's amounts all go back (``give``)."""
    n = len(directions)
    params = ", ".join([*(f"b{i}" for i in range(n)), "give"])
    lines = [
        f"def make({params}):",
        "    def settle(amounts, prompt, completion, status, clock):",
        "        if prompt is None and completion is None:",
        "            if status >= 400 and status != 499:  # a failure: all of it back",
        "                give(amounts, clock())",
        "            return",
        "        prompt = prompt or 0",
        "        completion = completion or 0",
        "        now = None",
    ]
    if n:
        lines.append(f"        {', '.join(f'a{i}' for i in range(n))}, = amounts")
    for i, direction in enumerate(directions):
        # The engine's usage replaces what was reserved: a request counts as one, the input
        # (and budget) only when the engine reported prompt tokens.
        if direction == REQUESTS:
            continue
        if direction == OUTPUT:
            lines += [f"        d = a{i} - completion", "        if d:"]
        else:
            used = "prompt" if direction == INPUT else "prompt - completion"
            lines += ["        if prompt:", f"            d = a{i} - {used}", "        else:"]
            lines += ["            d = 0", "        if d:"]
        lines += [
            "            if now is None:",
            "                now = clock()",
            # TokenBucket.adjust, inline: refill, then add up to the burst.
            f"            s = b{i}.stamp",
            f"            burst = b{i}.burst",
            "            if now > s:",
            f"                level = b{i}.level + (now - s) * b{i}.rate",
            "                level = level if level < burst else burst",
            f"                b{i}.stamp = now",
            "            else:",
            f"                level = b{i}.level",
            "                if level > burst:",
            "                    level = float(burst)",
            "            level += d",
            "            cap = float(burst)",
            f"            b{i}.level = level if level < cap else cap",
        ]
    lines += ["    return settle"]
    return _made(lines, "make")


@functools.cache
def _straight_render(rows: tuple[tuple[str, int], ...], fmt: str) -> Callable[..., bytes]:
    """``LocalPlan``'s header lines for buckets at given levels, written out per bucket
    (``rows``: (direction, limit) in the plan's order; ``fmt``: the plan's ``format``): each
    bucket's remaining and reset (``duration`` inline for the common resets under a minute),
    the scarcest token bucket's three values (the first of equal shares), one ``%``."""
    n = len(rows)
    lines = ["def render(buckets, levels):"]
    if n:
        lines.append(f"    {', '.join(f'b{i}' for i in range(n))}, = buckets")
        lines.append(f"    {', '.join(f'l{i}' for i in range(n))}, = levels")
    for i, (_, limit) in enumerate(rows):
        lines += [
            f"    r{i} = l{i} if l{i} > 0 else 0",
            f"    s = ({limit} - l{i}) / b{i}.rate",
            "    if 0 < s < 1:",
            f"        t{i} = MS[ceil(s * 1000)]",
            "    elif 1 <= s < 60:",
            f'        t{i} = f"{{s:.3f}}".rstrip("0").rstrip(".") + "s"',
            "    else:",
            f"        t{i} = duration(s)",
        ]
    values = []
    tokens = [(i, limit) for i, (d, limit) in enumerate(rows) if d != REQUESTS]
    for i, (direction, _) in enumerate(rows):
        if direction != REQUESTS and i == tokens[0][0]:  # the scarcest, before the first
            values += ["ml", "mr", "mt"]
        values += [f"r{i}", f"t{i}"]
    if tokens:
        first, limit = tokens[0]
        lines += [
            f"    share = l{first} / {limit}",
            f'    ml, mr, mt = "{limit}", r{first}, t{first}',
        ]
        for i, limit in tokens[1:]:
            lines += [
                f"    x = l{i} / {limit}",
                "    if x < share:",
                f'        share, ml, mr, mt = x, "{limit}", r{i}, t{i}',
            ]
    lines.append(f"    return (FMT % ({''.join(f'{v}, ' for v in values)})).encode()")
    return _made(lines, "render", MS=_MILLISECONDS, ceil=math.ceil, duration=duration, FMT=fmt)


class LocalPlan(PlanState):
    """One limit's local buckets in the order a request takes them (the amounts of a take
    and a settlement are given in ``directions``' order), with their header names, limit
    values and the headers' template made once. Valid until the limits change (the limiter
    drops its plans then)."""

    __slots__ = (
        "_renderer",
        "_settled",
        "_straight",
        "buckets",
        "directions",
        "format",
        "has_requests",
        "limits",
        "lock",
        "reserve",
        "settle",
        "take",
    )

    def __init__(
        self,
        buckets: dict[str, TokenBucket],
        embeddings: bool = False,
        count: Callable[..., int] | None = None,
        default: int = 256,
    ) -> None:
        self.buckets = buckets  # direction -> bucket, in the order of a take
        # What ``reserve`` counts a request's input tokens with (``RateLimiter``'s counter,
        # bound once; None: ``estimate_tokens``, a counter without tokenizers) and the output
        # reservation's default.
        self.count = count
        self.default = default
        self.directions = tuple(buckets)
        self.bucket_list = tuple(buckets.values())
        # (direction, the limit: tokens per unit), what a request's amounts are checked against
        self.limits = tuple((d, int(b.burst)) for d, b in buckets.items())
        first = next(iter(buckets.values()), None)
        lock = first.lock if first is not None else None
        # None for buckets of one process (entering a null context costs a call per take)
        self.lock: AbstractContextManager[None] | None = (
            None if isinstance(lock, contextlib.nullcontext) else lock
        )
        self.has_requests = REQUESTS in buckets
        # Per bucket, (how its amount is made: 0 one request, 1 the output reservation,
        # 2 the input count, 3 input + output (a budget, not of an embedding); its limit).
        self.amount_kinds = tuple(
            (3 if d == BUDGET and not embeddings else min(KINDS[d], 2), limit)
            for d, limit in self.limits
        )
        # The compiled loops for buckets of this process (TokenBucket itself: a subclass
        # keeps its level elsewhere), the written-out functions otherwise.
        loops = (
            LOOPS and self.lock is None and all(type(b) is TokenBucket for b in self.bucket_list)
        )
        # (the limiter's direct calls: never for a plan without buckets, which takes nothing)
        self.loops = bool(loops and buckets)
        self.kinds = tuple(KINDS[d] for d in self.directions)
        self._straight = take_levels if loops else _straight_take(len(buckets))
        # ``take`` and ``settle``: straight to the work for buckets of this process, inside
        # the lock for buckets shared by worker processes.
        self.take: Callable[[Sequence[int], float], bytes | None] = (
            self._take if self.lock is None else self._take_locked
        )
        self._settled: Callable[
            [Sequence[int], int | None, int | None, int, Callable[[], float]], None
        ] = (
            functools.partial(settle_levels, self.bucket_list, self.kinds, self.give)
            if loops
            else _straight_settle(self.directions)(*self.bucket_list, self.give)
        )
        self.settle = self._settled if self.lock is None else self._settle_locked
        # ``reserve(plan, doc, model, sent, now, counted)``: the amounts (with ``count`` and
        # ``out``) and the take in one call (``_straight_reserve``, or the compiled
        # ``buckets.reserve_levels``), for buckets of this process; the header lines are
        # then in ``lines``. None for shared buckets (amounts made outside their lock) and
        # for a plan without buckets.
        self.reserve: Callable[..., list[int] | None] | None = None
        if self.lock is None and buckets:
            self.reserve = reserve_levels if loops else _straight_reserve(self.limits, embeddings)
        # The header lines in ``rate_headers``' order (requests, the scarcest token bucket,
        # each token bucket) with the limits filled in; a take formats the rest in one go.
        lines = []
        scarcest = f"{_TOKENS[0]}: %s\r\n{_TOKENS[1]}: %d\r\n{_TOKENS[2]}: %s\r\n"
        for d, bucket in buckets.items():  # requests first, if limited at all
            if d != REQUESTS and scarcest not in lines:  # before the first token bucket
                lines.append(scarcest)
            names = _names(d)
            lines.append(f"{names[0]}: {int(bucket.burst)}\r\n{names[1]}: %d\r\n{names[2]}: %s\r\n")
        self.format = "".join(lines)
        self._renderer = _straight_render(self.limits, self.format)
        # With the loops, the lines are written by ``buckets.HeaderLines`` (C arithmetic into
        # a C buffer when compiled; ``_renderer`` for what it leaves to Python).
        self.header_lines = HeaderLines(self.format, self.limits) if loops else None
        # The levels the last take left and the lines rendered for them.
        self._levels: list[float] | None = None
        self.lines = b""

    def _take_locked(self, amounts: Sequence[int], now: float) -> bytes | None:
        assert self.lock is not None
        with self.lock:  # the buckets of one limiter share it
            return self._take(amounts, now)

    def _take(self, amounts: Sequence[int], now: float) -> bytes | None:
        """``take``: every amount taken and the header lines returned (``rate_headers`` of
        the buckets after the take, read under the lock as ``reserve_local`` reads them), or
        nothing taken and None returned (the request does not fit now)."""
        levels = self._straight(self.bucket_list, amounts, now)
        if levels is None:
            return None
        if levels != self._levels:  # the same levels: the same lines
            self._render(levels)
        return self.lines

    def _render(self, levels: list[float]) -> None:
        """``lines``: the header lines of the buckets at ``levels`` (after a take)."""
        h = self.header_lines
        lines = h.render(self.bucket_list, levels) if h is not None else None
        self.lines = lines if lines is not None else self._renderer(self.bucket_list, levels)
        self._levels = levels

    def give(self, deltas: Sequence[int], now: float) -> None:
        """Give back (> 0) or debit (< 0) per bucket (0: nothing), as ``TokenBucket.adjust``
        (the rarer case: what a failed request took, all of it)."""
        for bucket, delta in zip(self.bucket_list, deltas, strict=True):
            if delta:
                bucket.adjust(delta, now)

    def _settle_locked(
        self,
        amounts: Sequence[int],
        prompt: int | None,
        completion: int | None,
        status: int,
        clock: Callable[[], float],
    ) -> None:
        if prompt is None and completion is None:  # give() takes the lock per bucket
            self._settled(amounts, prompt, completion, status, clock)
            return
        assert self.lock is not None
        with self.lock:
            self._settled(amounts, prompt, completion, status, clock)
