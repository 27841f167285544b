"""Streams that survive their replica (docs/gateway.md): ``Migrator`` does a migration's I/O
for the proxy (``splice.py`` the bookkeeping): another replica from the scheduler, never one
that failed this request, the continuation opened there within the route's timeout, counted."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import orjson

from llmplane.aio import PAGE_MAX_BYTES
from llmplane.gateway.context import RequestContext, milliseconds
from llmplane.gateway.observability import Counter, Histogram
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.framework import Scheduler
from llmplane.gateway.splice import Splice
from llmplane.gateway.upstream_client import UpstreamPool, UpstreamResponse, encode_request

# Engines that can continue a generation (a prompt as token ids, continue_final_message).
CONTINUABLE = frozenset({"vllm", "sim"})
NO_REPLICA = "no other replica is available"
RECENT = 1000  # migrations whose time to resume the console's percentiles read
DETOKENIZE_TIMEOUT = 2.0  # seconds for an engine's /detokenize at a migration


class Migrator:
    """Moves lost streams to another replica (the proxy calls ``continue_on``)."""

    def __init__(self, scheduler: Scheduler, outliers: Outliers, max_sequence: int) -> None:
        self.scheduler = scheduler
        self.outliers = outliers
        self.max_sequence = max_sequence  # prompt + generated tokens beyond which no migration
        self.migrations = Counter(
            "llmplane_gateway_stream_migrations_total",
            "Streams continued on another replica after theirs was lost, by reason",
            ("route", "reason"),
        )
        self.failures = Counter(
            "llmplane_gateway_stream_migration_failures_total",
            "Lost streams that could not be continued (limit, no replica left, not continuable)",
            ("route",),
        )
        self.resume = Histogram(
            "llmplane_gateway_stream_resume_seconds",
            "From a lost stream to the first chunk of its continuation",
            ("route",),
            (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )
        self.recent: deque[tuple[str, float]] = deque(maxlen=RECENT)  # route, time to resume

    def metrics(self) -> list[Counter | Histogram]:
        return [self.migrations, self.failures, self.resume]

    def summary(self) -> list[dict[str, Any]]:
        """Per route, for the console's fleet page: migrations by reason and lost streams
        not continued since the gateway started, and the time to resume (p50, p99) of the
        last ``RECENT`` migrations."""
        routes: dict[str, dict[str, Any]] = {}

        def of(route: str) -> dict[str, Any]:
            return routes.setdefault(route, {"route": route, "byReason": {}, "failed": 0})

        for (route, reason), child in list(self.migrations.children.items()):
            of(route)["byReason"][reason] = int(child.value)
        for (route,), child in list(self.failures.children.items()):
            of(route)["failed"] = int(child.value)
        for route, entry in routes.items():
            resumed = sorted(t for r, t in self.recent if r == route)
            at = (min(len(resumed) - 1, int(q * len(resumed))) for q in (0.5, 0.99))
            entry["resumeMs"] = [round(resumed[i] * 1000, 1) for i in at] if resumed else None
        return sorted(routes.values(), key=lambda e: e["route"])

    @staticmethod
    def splice(
        ctx: RequestContext, state: EndpointState, body: bytes
    ) -> tuple[Splice, bytes] | None:
        """A streamed request's splice (and its body) when its route and engine allow a
        migration (Responses, Messages: their own events, never spliced); else None."""
        assert ctx.decision is not None and ctx.inference is not None
        backend, path = ctx.decision.backend, ctx.inference.path
        if (
            backend.migration_limit < 1
            or backend.pd is not None
            or state.endpoint.engine not in CONTINUABLE
            or not path.endswith("/completions")
        ):
            return None
        return Splice.of(body, path.endswith("/chat/completions"))

    async def continue_on(
        self,
        pool: UpstreamPool,
        ctx: RequestContext,
        splice: Splice,
        reason: str,
        failed: EndpointState,
        headers: dict[str, str],
    ) -> tuple[EndpointState, UpstreamResponse, bytes] | str:
        """(replica, response, its first chunk) of the continuation, or why there is none."""
        decision, sched = ctx.decision, ctx.scheduling
        assert decision is not None and sched is not None
        backend = decision.backend
        route = decision.route
        t0 = time.perf_counter()
        why = splice.can_continue()
        if why is None and splice.sequence > self.max_sequence:
            why = f"{splice.sequence} tokens exceed the migration limit of {self.max_sequence}"
        exclude = splice.failed
        exclude.add(failed.endpoint.address)
        while why is None:
            if splice.migrations >= backend.migration_limit:
                why = f"the route's migration limit ({backend.migration_limit}) was reached"
                break
            available = self.outliers.available(backend.candidates, time.monotonic())
            rest = [s for s in available if s.endpoint.address not in exclude]
            pick = self.scheduler.pick(sched, rest, 1, backend.profile) if rest else None
            if pick is None or not pick.endpoints:
                why = NO_REPLICA
                break
            state = pick.endpoints[0]
            self.scheduler.profile(backend.profile).on_pick(sched, state)  # the prefix index
            address = backend.address(state)
            exclude.add(state.endpoint.address)
            if state.endpoint.engine == "vllm" and splice.ids:
                model = splice.request.get("model")
                splice.forget(await unfinished(pool, address, headers, model, splice.ids))
            path, body = splice.continuation(ctx.request.path_qs)
            wire = encode_request("POST", path, address, headers, body)
            state.add_inflight(1)
            resp: UpstreamResponse | None = None
            try:
                with pool.deadlines.after(backend.timeout):
                    resp = await pool.open(address, wire)
                    if resp.status != 200:  # (its body unread: release closes it)
                        raise aiohttp.ClientError(f"HTTP {resp.status}")
                    first = await resp.readany()
                if not first:
                    raise aiohttp.ClientError("an empty response")
            except BaseException as err:
                state.add_inflight(-1)
                if resp is not None:
                    resp.release()
                if not isinstance(err, TimeoutError | aiohttp.ClientError | OSError):
                    raise  # cancelled (the client went away, the gateway stops)
                ctx.failed(address, f"continuation: {type(err).__name__}: {err}")
                splice.migrations += 1  # a failed try counts against the limit
                continue
            splice.started()
            self.migrations.labels(route, reason).inc()
            resumed = time.perf_counter() - t0
            self.resume.labels(route).observe(resumed)
            self.recent.append((route, resumed))
            note = {"reason": reason, "from": failed.endpoint.address, "to": address,
                    "resume_ms": milliseconds(resumed)}  # fmt: skip
            ctx.migrations = [*ctx.migrations, note] if ctx.migrations else [note]
            ctx.endpoint = address
            return state, resp, first
        self.failures.labels(route).inc()
        return why


async def unfinished(
    pool: UpstreamPool, address: str, headers: Mapping[str, str], model: Any, ids: Sequence[int]
) -> int:
    """How many of the last ``ids`` end in the middle of a character, by the engine's own
    /detokenize (0 when it cannot say). vLLM holds such tokens' text back; and a continuation
    whose prompt ends there comes back with the prompt's whole text before its own (vLLM's
    detokenizer, tokenizers' ``DecodeStream`` primed with the prompt, emits it all once the
    character completes), so they are generated again instead."""
    tail = list(ids[-8:])
    for n in range(4):  # a UTF-8 character has at most 4 bytes
        body = orjson.dumps({"model": model, "tokens": tail[: len(tail) - n]})
        wire = encode_request("POST", "/detokenize", address, headers, body)
        try:
            status, _, data = await pool.request(address, wire, DETOKENIZE_TIMEOUT, PAGE_MAX_BYTES)
            text = orjson.loads(data).get("prompt") if status == 200 else None
        except (OSError, TimeoutError, ValueError, AttributeError):  # (BodyTooLarge: a ValueError)
            return 0
        if not isinstance(text, str):
            return 0
        if not text.endswith("\ufffd"):
            return n
    return 0
