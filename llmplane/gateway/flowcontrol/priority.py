"""Engine-side priority: the ``priority`` the gateway adds to a request for an engine that
orders its waiting queue by it (vLLM's ``--scheduling-policy priority``; the sim's too), so
that what flow control knows still counts once the request is in the engine's queue:

    priority = 2 x (band - 1) + (0 if the tenant was under its fair share else 1)

Bands first, and inside a band a tenant under its fair share (``fairshare.py``, decided at
admission) ahead of one over it (docs/gateway.md, "Engine-side priority"). Only for endpoints
whose ``Endpoint.priority_scheduling`` is set: an fcfs engine gets the client's bytes
untouched. A client's own ``priority`` is overridden (a tenant must not rank itself): the field
is appended as the object's last member, and vLLM's JSON parser (pydantic's), like orjson,
keeps the last of duplicate keys; no re-encoding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmplane.gateway.flowcontrol.queue import DEFAULT_BAND, Level, band_of

if TYPE_CHECKING:
    from llmplane.gateway.context import RequestContext


def engine_priority(level: Level, under_share: bool) -> int:
    """The engine priority of a request of ``level`` (a criticality or an integer priority;
    the engine serves lower first)."""
    return 2 * (band_of(level) - DEFAULT_BAND) + (0 if under_share else 1)


def with_priority(body: bytes, priority: int) -> bytes:
    """``body`` (a JSON object, as the gateway parsed it) with ``"priority": priority`` as its
    last member; anything else is returned as it is."""
    end = body.rstrip()
    if not end.endswith(b"}"):
        return body
    head = end[:-1].rstrip()
    sep = b"" if head.endswith(b"{") else b","
    return b'%s%s"priority":%d}' % (head, sep, priority)


def prioritized_body(ctx: RequestContext, body: bytes) -> bytes:
    """The body to send a priority-scheduling engine: the client's with the priority of its
    band and of its seat (a request counted by no seat, flow control off, ranks as under)."""
    seat = ctx.seat
    return with_priority(body, engine_priority(ctx.level, seat is None or seat.under))
