"""``RequestContext``: one request's whole state, which ``Gateway.handle`` makes and each stage
fills in, in the order of its fields; hooks receive it. Nothing here does I/O; the access-log
record is only built when that log is on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmplane.gateway.clip import MAX_SHOWN, clip
from llmplane.gateway.hooks import RequestHook, Reservation, StreamFilter
from llmplane.gateway.http_server import HttpRequest
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.routing import RouteDecision

if TYPE_CHECKING:
    from llmplane.gateway.auth import TenantAccess
    from llmplane.gateway.flowcontrol.fairshare import FlowSeat
    from llmplane.gateway.flowcontrol.queue import Level
    from llmplane.gateway.registry import EndpointState
    from llmplane.gateway.scheduler.framework import Pick, SchedulingContext


def milliseconds(seconds: float) -> float:
    """``seconds`` in milliseconds to the microsecond, for the access log: ``round(x, 3)``
    goes through decimal digits and costs several times as much."""
    return round(seconds * 1e6) / 1000


@dataclass(slots=True, eq=False)
class RequestContext:
    request: HttpRequest  # as the client sent it
    t0: float = field(default_factory=time.perf_counter)
    status: int = 500  # what the client got (499: it went away first)
    # Filled in by the stages, in this order.
    inference: InferenceRequest | None = None  # parse: its body, parsed once
    tenant: TenantAccess | None = None  # authenticate: the caller (None: auth is off)
    decision: RouteDecision | None = None  # route: the routing table's answer
    # route: the flow-control level, the objective's priority else the criticality (the
    # route's, else the tenant's, else Default).
    level: Level = "Default"
    # reserve: each request hook with what it reserved, handed back when it settles.
    reservations: list[tuple[RequestHook, object]] = field(default_factory=list)
    seat: FlowSeat | None = None  # admit: counted for its flow's fair share
    waited: float | None = None  # admit: seconds in the flow-control queue
    candidates: Sequence[EndpointState] = ()  # admit: the endpoints it may use
    scheduling: SchedulingContext | None = None  # admit: what plugins read
    pick: Pick | None = None  # schedule: the endpoints in order, their scores
    # Added to the response by hooks.
    response_headers: dict[str, str] | None = None
    stream_filter: StreamFilter | None = None
    # What the proxy saw.
    deadline: float | None = None  # monotonic: the route's timeout, for every attempt
    endpoint: str | None = None  # the replica of the last attempt
    upstream_status: int | None = None
    upstream_broken: bool = False  # the replica broke off a stream
    usage: dict[str, Any] | None = None  # the engine's "usage" object
    ttft: float | None = None  # seconds from t0 to the first streamed chunk
    end: float = 0.0  # perf_counter when a stream ended
    events: int = 0  # SSE events streamed
    error: str | None = None
    # For the access log.
    attempts: int = 0
    failures: list[str] | None = None
    # One per stream migration: reason, from, to, resume_ms (gateway/migration.py).
    migrations: list[dict[str, Any]] | None = None
    sent_model: str | None = None
    sched_ms: float | None = None
    # Prompt tokens the KV index said the chosen replica holds (precise prefix routing).
    cached_predicted: int | None = None
    pd: str | None = None
    prefill_endpoint: str | None = None
    prefill_ms: float | None = None
    bootstrap_room: int | None = None

    @property
    def tenant_name(self) -> str | None:
        tenant = self.tenant
        return tenant.name if tenant is not None else None

    def adopt(self, reservation: Reservation) -> None:
        """Take a hook reservation's response headers and stream filter."""
        if reservation.response_headers:
            self.add_headers(reservation.response_headers)
        if reservation.stream_filter is not None:
            self.stream_filter = reservation.stream_filter

    def add_headers(self, extra: dict[str, str]) -> None:
        self.response_headers = (
            {**self.response_headers, **extra} if self.response_headers else extra
        )

    def failed(self, where: str, detail: str) -> None:
        """Note an attempt that failed (and was retried or ended the request)."""
        if self.failures is None:
            self.failures = []
        self.failures.append(f"{where}: {detail}")

    def access_record(self, elapsed: float, prompt: int | None, completion: int | None) -> dict:
        """The access-log line of this request (``elapsed`` seconds since t0)."""
        request = self.request
        record: dict[str, Any] = {"method": request.method, "path": clip(request.path)}
        inference = self.inference
        if inference is not None:
            record["model"] = clip(inference.model)
            record["stream"] = inference.stream
        if self.decision is not None:
            record["route"] = self.decision.route
        if self.tenant is not None:
            record["tenant"] = self.tenant.name
        # The optional fields one test each (no tuple of pairs built per request).
        if self.sent_model is not None:
            record["sent_model"] = self.sent_model
        if self.sched_ms is not None:
            record["sched_ms"] = self.sched_ms
        if self.waited is not None:
            record["queued_ms"] = milliseconds(self.waited)
        if self.pick is not None:
            record["profile"] = self.pick.profile
        if self.cached_predicted is not None:
            record["cached_tokens_predicted"] = self.cached_predicted
        if self.pick is not None:
            record["scores"] = self.pick.scores
        if self.pd is not None:  # the prefill/decode fields are only set with it
            record["pd"] = self.pd
            if self.prefill_endpoint is not None:
                record["prefill_endpoint"] = self.prefill_endpoint
            if self.prefill_ms is not None:
                record["prefill_ms"] = self.prefill_ms
            if self.bootstrap_room is not None:
                record["bootstrap_room"] = self.bootstrap_room
        if self.failures is not None:
            record["failures"] = self.failures
        if self.attempts:
            record["attempts"] = self.attempts
        if self.migrations is not None:
            record["migrations"] = self.migrations
        record["status"] = self.status
        record["endpoint"] = self.endpoint
        record["total_ms"] = milliseconds(elapsed)
        if self.ttft is not None:
            record["ttft_ms"] = milliseconds(self.ttft)
        if prompt is not None:
            record["prompt_tokens"] = prompt
            record["completion_tokens"] = completion
        if self.error:
            record["error"] = clip(self.error, 4 * MAX_SHOWN)  # client strings in it are clipped
        return record
