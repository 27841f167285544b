"""One limit's local buckets (a Tenant's limit, or a route's, held by this process) resolved
once, and the ``x-ratelimit-*`` header lines of its last take.

A take is ``buckets.reserve_local`` and its lines are ``rate_headers`` of the buckets after
it, written as header lines (``hooks.Reservation.response_lines``). The lines are a function
of the levels after the take alone (limits and rates are fixed for a plan's life), so a take
that leaves every level as the last one did reuses the last lines instead of formatting them
again: a tenant well inside its limits finds its buckets full before every request, and
takes the same amounts. A refusal is left to the limiter's general path, which builds the
429."""

from __future__ import annotations

from collections.abc import Sequence

from llmplane.gateway.ratelimit.buckets import TokenBucket, rate_headers, reserve_local


class LocalPlan:
    """One limit's local buckets in the order a request takes them (the amounts of a take
    are given in ``directions``' order). Valid until the limits change (the limiter drops
    its plans then)."""

    __slots__ = ("_levels", "buckets", "directions", "limits", "lines")

    def __init__(self, buckets: dict[str, TokenBucket]) -> None:
        self.directions = tuple(buckets)
        self.buckets = tuple(buckets.values())
        # (direction, the limit: tokens per unit), what a request's amounts are checked against
        self.limits = tuple((d, int(b.burst)) for d, b in buckets.items())
        # The levels the last take left and the lines rendered for them.
        self._levels: list[float] | None = None
        self.lines = b""

    def take(self, amounts: Sequence[int], now: float) -> bytes | None:
        """Every amount taken and the header lines returned, or nothing taken and None
        returned (the request does not fit now)."""
        ok, states = reserve_local(
            list(zip(self.directions, self.buckets, amounts, strict=True)), now
        )
        if not ok:
            return None
        levels = [s.level for s in states]
        if levels != self._levels:
            headers = rate_headers(states)
            self.lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
            self._levels = levels
        return self.lines
