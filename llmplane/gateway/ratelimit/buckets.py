"""Token-bucket maths: the local bucket, the state both kinds of bucket report, the
``x-ratelimit-*`` headers and what settling a reservation gives back or debits.

Compiled (setup.py's hot path), ``buckets.pxd`` makes ``TokenBucket`` a C type whose level,
stamp, rate and burst are C doubles, and ``take_levels`` / ``settle_levels`` loops over them in
C: a plan's take and settlement (``local.py`` uses them when ``COMPILED``; in pure Python it
uses its written-out functions instead, which are faster there); ``HeaderLines`` writes a
plan's ``x-ratelimit-*`` lines into a C buffer, the numbers as integers (what a tenant whose
levels change with every request pays on each one). A subclass that keeps its
level elsewhere (``workers/buckets.py``) must override every method that reads it."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from llmplane.gateway.ratelimit.limits import BUDGET, INPUT, REQUESTS, output_reservation
from llmplane.gateway.tokens import estimate_tokens

COMPILED = False

# A bucket's direction as ``settle_levels`` reads it (``KINDS[direction]``).
KINDS = {REQUESTS: 0, "output": 1, INPUT: 2, BUDGET: 3}

# ``HeaderLines``' buffer: the lines' constant text and the largest values must fit.
LINES_CAPACITY = 4096


class TokenBucket:
    """``burst`` tokens at most, refilled at ``rate`` per second. ``level`` may go below zero
    after an overuse debit: requests then wait until it has refilled far enough."""

    __slots__ = ("burst", "level", "rate", "stamp")

    # Held around a read-modify-write of the level: nothing for a bucket of one process; a
    # record lock for one shared by worker processes (``llmplane/gateway/workers/buckets.py``).
    lock: AbstractContextManager[None] = contextlib.nullcontext()

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.level = float(burst)
        self.stamp = now

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
            self.stamp = now
        elif self.level > self.burst:  # the limit was lowered
            self.level = float(self.burst)

    def wait(self, amount: float) -> float:
        """Seconds until ``amount`` tokens are there (0 now); call ``refill`` first."""
        return 0.0 if self.level >= amount else (amount - self.level) / self.rate

    def adjust(self, delta: float, now: float) -> None:
        """Give back (``delta`` > 0, up to the burst) or debit (< 0, may go negative)."""
        self.refill(now)
        self.level = min(float(self.burst), self.level + delta)

    def state(self, direction: str, wait: float = 0.0) -> BucketState:
        return BucketState(direction, int(self.burst), self.rate, self.level, wait)


@dataclass(slots=True)
class BucketState:
    """One bucket as a reservation saw it (one per bucket and request: not frozen, which
    costs a call a field)."""

    direction: str
    limit: int  # the burst: tokens per unit
    rate: float  # tokens per second
    level: float  # tokens available now (after this reservation when it was admitted)
    wait: float = 0.0  # seconds until the request's amount fits (0: it did)

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.level))

    @property
    def reset(self) -> float:
        """Seconds until the bucket is full again (OpenAI's ``x-ratelimit-reset-tokens``)."""
        return max(0.0, (self.limit - self.level) / self.rate)


def reserve_local(
    buckets: list[tuple[str, TokenBucket, int]], now: float
) -> tuple[bool, list[BucketState]]:
    """Take every amount or none: (admitted, the buckets' states)."""
    if not buckets:
        return True, []
    with buckets[0][1].lock:  # the buckets of one limiter share one lock (or none)
        for _, bucket, _ in buckets:
            bucket.refill(now)
        waits = [bucket.wait(amount) for _, bucket, amount in buckets]
        ok = all(w == 0.0 for w in waits)
        if ok:
            for _, bucket, amount in buckets:
                bucket.level -= amount
        return ok, [b.state(d, w) for (d, b, _), w in zip(buckets, waits, strict=True)]


def retry_after(states: Iterable[BucketState]) -> int:
    """Whole seconds until the reservation fits in every bucket (at least 1)."""
    return max(1, math.ceil(max((s.wait for s in states), default=0.0) - 1e-9))


def duration(seconds: float) -> str:
    """OpenAI's (Go's) duration format for ``x-ratelimit-reset-tokens``: ``250ms``, ``6s``,
    ``1.5s``, ``6m0s``, ``2h3m4s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    if seconds < 60:  # what the general case gives (both divmods leave it as it is), faster
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours >= 1:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes >= 1:
        return f"{int(minutes)}m{text}"
    return text


def _share(state: BucketState) -> float:
    return state.level / state.limit


def _values(s: BucketState) -> tuple[str, str, str]:
    """limit, remaining and reset of one bucket as header values (formatted once)."""
    level = s.level
    return str(s.limit), str(int(level) if level > 0 else 0), duration((s.limit - level) / s.rate)


def rate_headers(states: list[BucketState], main: BucketState | None = None) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-{limit,remaining,reset}-requests`` (when requests are limited)
    and ``-tokens`` for ``main`` (by default the token bucket with the smallest share left),
    and the same with ``-input`` / ``-output`` / ``-budget`` per direction. With a route's
    and a tenant's limit in one direction, the scarcer one is reported."""
    if not states:
        return {}
    scarcest: dict[str, BucketState] = {}
    for s in states:
        seen = scarcest.get(s.direction)
        if seen is None or s is main or (seen is not main and _share(s) < _share(seen)):
            scarcest[s.direction] = s
    headers: dict[str, str] = {}
    requests = scarcest.pop(REQUESTS, None)
    if requests is not None:
        limit, remaining, reset = _values(requests)
        headers["x-ratelimit-limit-requests"] = limit
        headers["x-ratelimit-remaining-requests"] = remaining
        headers["x-ratelimit-reset-requests"] = reset
    if not scarcest:
        return headers
    if main is None or main.direction == REQUESTS:
        main = min(scarcest.values(), key=_share)
    per = {d: _values(s) for d, s in scarcest.items()}
    limit, remaining, reset = per[main.direction] if main.direction in per else _values(main)
    headers["x-ratelimit-limit-tokens"] = limit
    headers["x-ratelimit-remaining-tokens"] = remaining
    headers["x-ratelimit-reset-tokens"] = reset
    for d, (limit, remaining, reset) in per.items():
        headers[f"x-ratelimit-limit-tokens-{d}"] = limit
        headers[f"x-ratelimit-remaining-tokens-{d}"] = remaining
        headers[f"x-ratelimit-reset-tokens-{d}"] = reset
    return headers


def settle_deltas(
    amounts: list[tuple[str, int]], prompt: int | None, completion: int | None, status: int
) -> list[tuple[str, int]]:
    """Tokens to give back (> 0) or debit (< 0) per direction once the response is known.

    With usage: reserved - used (input and budget only when the engine reported prompt
    tokens; a request counts as one whatever it used). Without usage: a failed request
    (status >= 400, not a client that went away) gets everything back, its request too;
    otherwise the reservation stands."""
    if prompt is None and completion is None:
        if status >= 400 and status != 499:
            return [(d, a) for d, a in amounts if a]
        return []
    deltas = []
    for direction, amount in amounts:
        if direction == REQUESTS or (direction in (INPUT, BUDGET) and not prompt):
            continue
        if direction == INPUT:
            used = prompt
        elif direction == BUDGET:
            used = (prompt or 0) + (completion or 0)
        else:
            used = completion
        delta = amount - (used or 0)
        if delta:
            deltas.append((direction, delta))
    return deltas


def take_levels(
    buckets: Sequence[TokenBucket], amounts: Sequence[int], now: float
) -> list[float] | None:
    """Refill every bucket of one process (a ``TokenBucket`` itself, not a subclass) and take
    every amount if each fits: the levels after the take, or None (nothing taken, every bucket
    refilled, as ``reserve_local`` leaves them). The same arithmetic as ``local.py``'s
    written-out take, as one loop (over C doubles when compiled)."""
    n = len(buckets)
    short = False
    for i in range(n):
        b = buckets[i]
        level = b.level
        stamp = b.stamp
        if now > stamp:
            level += (now - stamp) * b.rate
            b.stamp = now
        if level >= b.burst:
            level = b.burst
        b.level = level
        a = amounts[i]
        if level < a:
            short = True
    if short:
        return None
    levels = []
    for i in range(n):
        b = buckets[i]
        level = b.level - amounts[i]
        b.level = level
        levels.append(level)
    return levels


class PlanState:
    """What ``reserve_levels`` reads and writes of a plan (``local.LocalPlan`` is one):
    compiled, an extension type whose fields the loop reads as C struct members instead of
    looking each up by name. ``loops``: the plan takes and settles with ``reserve_levels`` /
    ``settle_levels`` (over ``bucket_list``, ``kinds`` their ``KINDS``, ``give_all`` what
    gives a failed request's amounts back), which the limiter then calls directly."""

    __slots__ = (
        "_levels",
        "amount_kinds",
        "bucket_list",
        "count",
        "default",
        "give_all",
        "header_lines",
        "kinds",
        "lines",
        "loops",
    )


def reserve_levels(
    plan: PlanState,
    doc: dict[str, Any],
    model: str,
    sent: str,
    now: float,
    counted: list[int],
) -> list[int] | None:
    """``local.LocalPlan.reserve`` as one loop over the plan's buckets (``TokenBucket`` itself):
    a request's amounts (per ``plan.amount_kinds``: one request, the output reservation
    ``output_reservation(doc, plan.default, limit)``, the input count made once and left in
    ``counted``: ``plan.count(doc, model, sent)``, or ``estimate_tokens(doc)`` when the plan's
    count is None; or both; compiled, both are C calls), each checked against its limit, and the take
    (``take_levels``' arithmetic); the plan's header lines rendered again only when the levels
    after the take differ from the last ones (by its ``header_lines``, a ``HeaderLines``, when
    it has one). Returns the amounts taken, or None (nothing taken: too large, or it does not
    fit now)."""
    amounts = []
    c = None
    default = plan.default
    for kind, limit in plan.amount_kinds:
        if kind == 0:
            a = 1
        elif kind == 1:
            a = output_reservation(doc, default, limit)
        else:  # the input count, made once
            if c is None:
                count = plan.count
                c = estimate_tokens(doc) if count is None else count(doc, model, sent)
                counted.append(c)
            a = c + output_reservation(doc, default, limit) if kind == 3 else c
        if a > limit:
            return None
        amounts.append(a)
    buckets = plan.bucket_list
    n = len(buckets)
    short = False
    for i in range(n):
        b = buckets[i]
        level = b.level
        stamp = b.stamp
        if now > stamp:
            level += (now - stamp) * b.rate
            b.stamp = now
        if level >= b.burst:
            level = b.burst
        b.level = level
        taken = amounts[i]
        if level < taken:
            short = True
    if short:
        return None
    last = plan._levels
    same = last is not None
    levels = []
    for i in range(n):
        b = buckets[i]
        level = b.level - amounts[i]
        b.level = level
        levels.append(level)
        if same and level != last[i]:
            same = False
    if not same:  # ``plan._render``, inline
        h = plan.header_lines
        lines = h.render(buckets, levels) if h is not None else None
        if lines is None:
            plan._render(levels)
        else:
            plan.lines = lines
            plan._levels = levels
    return amounts


def settle_levels(
    buckets: Sequence[TokenBucket],
    kinds: Sequence[int],
    give: Callable[[Sequence[int], float], None],
    amounts: Sequence[int],
    prompt: int | None,
    completion: int | None,
    status: int,
    clock: Callable[[], float],
) -> None:
    """``settle_deltas`` and ``TokenBucket.adjust`` of a plan's buckets (``kinds``: their
    ``KINDS``) in one loop, the clock read once and only when a bucket moves; without usage a
    failed request's amounts all go back (``give``). What ``local.py``'s written-out
    settlement does."""
    if prompt is None and completion is None:
        if status >= 400 and status != 499:  # a failure: all of it back
            give(amounts, clock())
        return
    prompt = prompt or 0
    completion = completion or 0
    now = None
    for i in range(len(kinds)):
        kind = kinds[i]
        if kind == 0:  # a request counts as one whatever it used
            continue
        if kind == 1:
            delta = amounts[i] - completion
        elif not prompt:  # input and budget move only with the prompt's count
            continue
        elif kind == 2:
            delta = amounts[i] - prompt
        else:
            delta = amounts[i] - prompt - completion
        if not delta:
            continue
        if now is None:
            now = clock()
        t = now
        b = buckets[i]
        burst = b.burst
        if t > b.stamp:  # TokenBucket.adjust, inline: refill, then add up to the burst
            level = b.level + (t - b.stamp) * b.rate
            if level >= burst:
                level = burst
            b.stamp = t
        else:
            level = b.level
            if level > burst:
                level = burst
        level += delta
        b.level = level if level < burst else burst


class HeaderLines:
    """A plan's ``x-ratelimit-*`` lines for its buckets at given levels (after a take), as
    ``rate_headers`` renders them: written straight into a buffer of bytes, the remaining
    counts and the resets' text made from integers (compiled: C arithmetic into a C buffer,
    what a tenant whose levels change with every request pays on each one). ``fmt`` is the
    plan's format (``local.LocalPlan.format``: the constant text, ``%d`` / ``%s`` where a value
    goes), ``rows`` its (direction, limit) in the plan's order.

    ``render`` returns None for what it leaves to ``duration`` (resets of an hour or more,
    a reset whose third decimal is a near tie, values too large or not numbers): the caller
    renders those lines in Python (``local._straight_render``)."""

    __slots__ = ("codes", "ends", "limit_texts", "limits", "text")

    def __init__(self, fmt: str, rows: Sequence[tuple[str, int]]) -> None:
        parts = [part.encode() for part in re.split("%[ds]", fmt)]
        # Per value of ``fmt``: -1, -2, -3 the scarcest token bucket's limit, remaining and
        # reset (before the first token bucket's own lines); 2 i bucket i's remaining, 2 i + 1
        # its reset.
        codes: list[int] = []
        first = next((i for i, (d, _) in enumerate(rows) if d != REQUESTS), -1)
        for i in range(len(rows)):
            if i == first:
                codes += [-1, -2, -3]
            codes += [2 * i, 2 * i + 1]
        if len(parts) != len(codes) + 1:
            raise ValueError(f"a plan's format has {len(parts) - 1} values, not {len(codes)}")
        self.text = b"".join(parts)
        ends = []
        end = 0
        for part in parts:
            end += len(part)
            ends.append(end)
        self.ends = tuple(ends)
        self.codes = tuple(codes)
        self.limits = tuple(float(limit) for _, limit in rows)
        # Token buckets' limits as text (None: a requests bucket, never the scarcest).
        self.limit_texts = tuple(
            None if d == REQUESTS else str(limit).encode() for d, limit in rows
        )
        widest = max((len(t) for t in self.limit_texts if t is not None), default=0)
        if len(self.text) + len(codes) * max(widest, 24) > LINES_CAPACITY:
            self.codes = None  # (never rendered here: the caller's Python does it)

    def render(self, buckets: Sequence[TokenBucket], levels: Sequence[float]) -> bytes | None:
        """The lines of ``buckets`` (``TokenBucket`` itself: their ``rate``) at ``levels``,
        or None (see the class)."""
        codes = self.codes
        if codes is None:
            return None
        limits = self.limits
        limit_texts = self.limit_texts
        ends = self.ends
        text = self.text
        buf = bytearray(LINES_CAPACITY)
        scarcest = -1  # the token bucket with the smallest share left (the first of equals)
        share = 0.0
        for i in range(len(limits)):
            if limit_texts[i] is not None:
                level = levels[i]
                limit = limits[i]
                x = level / limit
                if scarcest < 0 or x < share:
                    scarcest = i
                    share = x
        n = 0
        start = 0
        for j in range(len(codes)):
            end = ends[j]
            n = _put_text(buf, n, text, start, end)
            start = end
            code = codes[j]
            if code == -1:
                limit_text = limit_texts[scarcest]
                n = _put_text(buf, n, limit_text, 0, len(limit_text))
                continue
            i = scarcest if code < 0 else code >> 1
            level = levels[i]
            if code == -2 or (code >= 0 and not code & 1):  # remaining: whole tokens, >= 0
                if not level < 1e18:
                    return None
                whole = int(level) if level > 0 else 0
                n = _put_int(buf, n, whole)
            else:
                b = buckets[i]
                limit = limits[i]
                n = _put_reset(buf, n, (limit - level) / b.rate)
                if n < 0:
                    return None
        n = _put_text(buf, n, text, start, len(text))
        return bytes(buf[:n])


def _put_text(buf: Any, n: int, text: bytes, start: int, end: int) -> int:
    """``text[start:end]`` into ``buf`` at ``n``; where it ends."""
    buf[n : n + end - start] = text[start:end]
    return n + end - start


def _put_int(buf: Any, n: int, value: int) -> int:
    """``value`` (>= 0) in decimal into ``buf`` at ``n``; where it ends."""
    start = n
    while True:
        buf[n] = 48 + value % 10
        value //= 10
        n += 1
        if not value:
            break
    end = n
    n -= 1
    while start < n:  # the digits came last first
        c = buf[start]
        buf[start] = buf[n]
        buf[n] = c
        start += 1
        n -= 1
    return end


def _put_seconds(buf: Any, n: int, seconds: float) -> int:
    """``f"{seconds:.3f}".rstrip("0").rstrip(".")`` (0 <= seconds <= 60) into ``buf``; -1
    when the third decimal is a near tie (``seconds * 1000`` carries a rounding error far
    below the margin, so outside it the rounded integer is the exact value's)."""
    m = seconds * 1000.0
    thousandths = int(m)  # (m >= 0: its floor)
    part = m - thousandths
    if 0.4999 <= part <= 0.5001:
        return -1
    if part > 0.5:
        thousandths += 1
    n = _put_int(buf, n, thousandths // 1000)
    thousandths %= 1000
    if thousandths:
        buf[n] = 46  # .
        buf[n + 1] = 48 + thousandths // 100
        n += 2
        tens = thousandths % 100
        if tens:
            buf[n] = 48 + tens // 10
            n += 1
            if tens % 10:
                buf[n] = 48 + tens % 10
                n += 1
    return n


def _put_reset(buf: Any, n: int, seconds: float) -> int:
    """``duration(seconds)`` into ``buf`` at ``n`` for resets under an hour; -1 otherwise
    (and for a near tie: ``_put_seconds``)."""
    if seconds <= 0:  # 0s
        buf[n] = 48
        buf[n + 1] = 115
        return n + 2
    if seconds < 1:  # whole milliseconds, rounded up, at least 1
        m = seconds * 1000.0
        ms = int(m)
        if ms < m:  # (m > 0: its ceiling)
            ms += 1
        n = _put_int(buf, n, ms if ms > 1 else 1)
        buf[n] = 109  # m
        buf[n + 1] = 115  # s
        return n + 2
    if seconds < 60:
        n = _put_seconds(buf, n, seconds)
    elif seconds < 3600:  # divmod(seconds, 60): ``seconds - rest`` is a whole multiple of
        rest = seconds % 60.0  # 60, exact in a double, and so is the quotient
        minutes = int((seconds - rest) / 60.0)
        n = _put_int(buf, n, minutes)
        buf[n] = 109  # m
        n = _put_seconds(buf, n + 1, rest)
    else:  # hours (and what is not a number)
        return -1
    if n < 0:
        return n
    buf[n] = 115  # s
    return n + 1
