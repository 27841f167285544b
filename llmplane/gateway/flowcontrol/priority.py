"""Engine-side priority: the ``priority`` the gateway adds to a request for an engine that
orders its waiting queue by it (vLLM's ``--scheduling-policy priority``; the sim's too).

Flow control orders requests while they wait in the gateway; once sent, an fcfs engine serves
them in arrival order, so a small tenant's or a Critical request still waits behind every
request already in that engine's queue (docs/benchmarks.md, "Overload": the engine queue was
most of the small tenant's slowest TTFTs). A priority engine orders its waiting queue by
(priority, arrival), lower first, so the gateway tells it what flow control knows:

    priority = 2 x (band - 1) + (0 if the tenant was under its fair share else 1)

with band Critical 0, Default 1, Sheddable 2: Critical -2 / -1, Default 0 / 1, Sheddable
2 / 3. An InferenceObjective's integer priority p is band 1 - p (``queue.py``): -2p / -2p + 1. Bands first (Critical before Default before Sheddable), and inside a band a tenant
under its fair share of the backend's recent dispatches (``share.py``, decided when the
request is admitted) ahead of one over it. A client that reaches the engine directly sends
vLLM's default 0: it ranks with an under-share Default request.

Only for endpoints whose ``Endpoint.priority_scheduling`` is set (the control plane derives it
from the engine's ``--scheduling-policy priority``; an external Endpoint says
``schedulingPolicy: priority``): the default path relays the client's bytes untouched, and an
fcfs engine never gets a priority from the gateway. A client's own ``priority`` is overridden
(a tenant must not rank itself): the field is appended as the object's last member, and vLLM's
JSON parser (pydantic's), like orjson, keeps the last of duplicate keys; no re-encoding.
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


def request_priority(ctx: RequestContext) -> int:
    """The engine priority of the request ``ctx`` carries: its band (``ctx.level``) and
    whether its tenant was under its fair share when admitted (its seat; a request counted by
    no seat, flow control off, ranks as under)."""
    seat = ctx.seat
    return engine_priority(ctx.level, seat is None or seat.under)


def prioritized_body(ctx: RequestContext, body: bytes) -> bytes:
    """The body to send a priority-scheduling engine: the client's with its priority."""
    return with_priority(body, request_priority(ctx))
