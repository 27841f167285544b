"""``RequestContext``: everything one request carries through the gateway's pipeline.

One slotted object per request, created by ``Gateway.handle`` and filled in as the request
moves on: the HTTP request and its parsed body, the routing decision, what the hooks add to the
response, what the proxy saw upstream (endpoint, status, usage, time to first byte) and the
facts the access log reports. Nothing here does I/O; the access-log record is only built when
that log is on.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from llmplane.gateway.clip import MAX_SHOWN, clip
from llmplane.gateway.hooks import Reservation, StreamFilter
from llmplane.gateway.http_server import HttpRequest
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.routing import Decision

if TYPE_CHECKING:
    from llmplane.gateway.flowcontrol.share import Seat


class RequestContext:
    __slots__ = (
        "attempts",
        "bootstrap_room",
        "cached_predicted",
        "decision",
        "end",
        "endpoint",
        "error",
        "events",
        "failures",
        "inference",
        "pd",
        "prefill_endpoint",
        "prefill_ms",
        "profile",
        "request",
        "response_headers",
        "response_lines",
        "sched_ms",
        "scores",
        "seat",
        "sent_model",
        "status",
        "stream_filter",
        "t0",
        "tenant",
        "ttft",
        "upstream_broken",
        "upstream_status",
        "usage",
        "waited",
        "weight",
    )

    def __init__(self, request: HttpRequest) -> None:
        self.t0 = time.perf_counter()
        self.request = request  # the HTTP request as the client sent it
        self.inference: InferenceRequest | None = None  # its body, parsed once
        self.decision: Decision | None = None
        self.status = 500  # what the client got (499: it went away first)
        self.tenant: str | None = None  # the caller's Tenant (gateway/auth.py), never its key
        self.weight = 1  # the tenant's flow-control weight
        self.waited: float | None = None  # seconds in the flow-control queue
        self.seat: Seat | None = None  # counted for its flow's fair share (with a reserve)
        # Added to the response by hooks.
        self.response_headers: dict[str, str] | None = None
        self.response_lines: bytes | None = None  # header lines, as rendered by hooks
        self.stream_filter: StreamFilter | None = None
        # What the proxy saw.
        self.endpoint: str | None = None  # the replica of the last attempt
        self.upstream_status: int | None = None
        self.upstream_broken = False  # the replica broke off a stream
        self.usage: dict[str, Any] | None = None  # the engine's "usage" object
        self.ttft: float | None = None  # seconds from t0 to the first streamed chunk
        self.end = 0.0  # perf_counter when a stream ended
        self.events = 0  # SSE events streamed
        self.error: str | None = None
        # For the access log.
        self.attempts = 0
        self.failures: list[str] | None = None
        self.sent_model: str | None = None
        self.sched_ms: float | None = None
        self.profile: str | None = None
        # Prompt tokens the KV index said the chosen replica holds (precise prefix routing).
        self.cached_predicted: int | None = None
        self.scores: dict[str, float] | None = None
        self.pd: str | None = None
        self.prefill_endpoint: str | None = None
        self.prefill_ms: float | None = None
        self.bootstrap_room: int | None = None

    def adopt(self, reservation: Reservation) -> None:
        """Take a hook reservation's response headers and stream filter."""
        lines = reservation.response_lines
        if lines:
            self.response_lines = self.response_lines + lines if self.response_lines else lines
        elif reservation.response_headers:
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
            record["tenant"] = self.tenant
        # The optional fields one test each (no tuple of pairs built per request).
        if self.sent_model is not None:
            record["sent_model"] = self.sent_model
        if self.sched_ms is not None:
            record["sched_ms"] = self.sched_ms
        if self.waited is not None:
            record["queued_ms"] = round(self.waited * 1000, 3)
        if self.profile is not None:
            record["profile"] = self.profile
        if self.cached_predicted is not None:
            record["cached_tokens_predicted"] = self.cached_predicted
        if self.scores is not None:
            record["scores"] = self.scores
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
        record["status"] = self.status
        record["endpoint"] = self.endpoint
        record["total_ms"] = round(elapsed * 1000, 3)
        if self.ttft is not None:
            record["ttft_ms"] = round(self.ttft * 1000, 3)
        if prompt is not None:
            record["prompt_tokens"] = prompt
            record["completion_tokens"] = completion
        if self.error:
            record["error"] = clip(self.error, 4 * MAX_SHOWN)  # client strings in it are clipped
        return record
