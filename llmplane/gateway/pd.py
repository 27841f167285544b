"""Prefill/decode disaggregation (docs/gateway.md, "Prefill/decode disaggregation"): a request
is served by a prefill replica, which computes the prompt's KV cache, and a decode replica of
the same group, which generates the answer from it. The decode replica is scheduled first, then
the best prefill replica of its group with the same profile, so prefix affinity lands where the
prompt is computed. Nothing reaches the client before the decode response starts, so a failed
prefill or decode is retried on another pair within the route's retry budget.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.context import RequestContext, milliseconds
from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.http_server import Response, StreamResponse
from llmplane.gateway.observability import GatewayMetrics
from llmplane.gateway.outliers import Outliers
from llmplane.gateway.proxy import AttemptFailed, Proxy, forwarded_headers, relayed_headers
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.routing import SGLANG
from llmplane.gateway.scheduler.framework import Profile, Scheduler, SchedulingContext
from llmplane.gateway.tokens import sent_prompt_tokens
from llmplane.gateway.upstream_client import encode_request

log = logging.getLogger("llmplane.gateway")

PREFILL_HEADER = "x-llmplane-prefill-endpoint"
# KV connectors whose decode request carries the prefill response's kv_transfer_params.
KV_PARAMS_CONNECTORS = frozenset({"nixl", "mooncake"})
# Fields a prefill request must not carry: it answers one token, never streamed.
_PREFILL_DROP = ("stream", "stream_options", "min_tokens")

_background: set[asyncio.Task[Any]] = set()


def prefill_doc(doc: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """The prefill request's body: one token, not streamed (``min_tokens`` would exceed it)."""
    out = {k: v for k, v in doc.items() if k not in _PREFILL_DROP}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    if mode in KV_PARAMS_CONNECTORS:
        out["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
    return out


def decode_doc(doc: Mapping[str, Any], kv_transfer_params: Any) -> dict[str, Any]:
    """nixl / mooncake: the client's body with the prefill's ``kv_transfer_params``; None
    (the prefill sent none: the decode computes the prompt) leaves the key out, not null."""
    out = dict(doc)
    if kv_transfer_params is None:
        out.pop("kv_transfer_params", None)
    else:
        out["kv_transfer_params"] = kv_transfer_params
    return out


def with_bootstrap(doc: Mapping[str, Any], host: str, room: int) -> dict[str, Any]:
    """SGLang: the same ``bootstrap_room`` in both requests, the prefill's host."""
    return {**doc, "bootstrap_host": host, "bootstrap_room": room}


def new_room() -> int:
    """A random bootstrap room (SGLang uses non-negative 63-bit integers)."""
    return random.getrandbits(63)


def host_of(address: str) -> str:
    host = address.rpartition(":")[0] or address
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def kv_params_of(data: bytes) -> Any:
    """``kv_transfer_params`` of a prefill response body; None when absent or unreadable."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return doc.get("kv_transfer_params") if isinstance(doc, dict) else None


class PrefillFailed(AttemptFailed):
    """The prefill of an attempt failed (retried on the group's next prefill replica)."""


class _Relayed(Exception):
    """A prefill answered 4xx (or a 5xx on the last attempt): that is the client's answer."""

    def __init__(self, response: Response) -> None:
        self.response = response


@dataclass(eq=False)
class PrefillDecode:
    """Serves requests whose backend has a ``PDBackend`` (see the module docstring)."""

    config: GatewayConfig
    proxy: Proxy
    scheduler: Scheduler
    outliers: Outliers
    metrics: GatewayMetrics

    async def serve(self, ctx: RequestContext) -> StreamResponse:
        """Serve the request on a prefill + decode pair: the admitted candidates are the
        decode replicas, each paired within its group."""
        sched, decision, inference = ctx.scheduling, ctx.decision, ctx.inference
        assert decision is not None and inference is not None and sched is not None
        backend, model = decision.backend, inference.model
        pd = backend.pd
        assert pd is not None
        by_group: dict[str, list[EndpointState]] = {}
        for state in pd.prefill:
            if (group := pd.group_of(state)) is not None:
                by_group.setdefault(group, []).append(state)
        # Ejection per group, failing open within a group.
        groups = {g: self.outliers.available(ms, sched.now) for g, ms in by_group.items()}
        decodes = [s for s in ctx.candidates if pd.group_of(s) in groups]
        if not decodes:
            raise GatewayError(
                503,
                f"model {model!r} has no prefill/decode pair ready ({backend.ref}: no decode "
                f"endpoint has a prefill endpoint with the same {pd.group_key!r} label)",
                ErrorCode.NO_READY_ENDPOINT,
            )
        width = max(self.config.fallbacks, max(0, backend.retry_attempts) + 1)
        scheduler = self.scheduler
        ts = time.perf_counter()
        pick = ctx.pick = scheduler.pick(sched, decodes, min(len(decodes), width), backend.profile)

        @functools.cache  # each group's prefill replicas ordered once, when first needed
        def prefill_order(group: str) -> list[EndpointState]:
            members = groups[group]
            return scheduler.pick(
                sched, members, min(len(members), width), backend.profile
            ).endpoints

        prefill_order(pd.group_of(pick.endpoints[0]) or "")
        elapsed = time.perf_counter() - ts
        self.metrics.scheduling.observe(elapsed)
        ctx.sched_ms = milliseconds(elapsed)
        ctx.pd = pd.mode
        self.metrics.pd_requests.labels(model, pd.mode).inc()
        pair = _Pair(self, ctx, sched, scheduler.profile(backend.profile))
        order = pick.endpoints
        di = pi = 0
        attempts = self.proxy.attempts(ctx, "any prefill/decode pair")
        async for _ in attempts:
            decode = order[di % len(order)]
            prefills = prefill_order(pd.group_of(decode) or "")
            prefill = prefills[pi % len(prefills)]
            try:
                run = pair.concurrent if pd.mode == SGLANG else pair.sequential
                response = await run(prefill, decode, attempts.may_retry)
            except _Relayed as relayed:
                return relayed.response
            except PrefillFailed as failure:
                attempts.failed(failure, f"prefill {backend.address(prefill)}")
                pi += 1
                if pi >= len(prefills) and len(order) > 1:
                    di, pi = di + 1, 0
                continue
            except AttemptFailed as failure:
                self.outliers.attempt_failed(decode, failure)
                attempts.failed(failure, backend.address(decode))
                di, pi = di + 1, 0
                continue
            self.proxy.judge(ctx, decode)
            return response
        raise attempts.exhausted()


class _Pair:
    """Attempts on (prefill, decode) pairs for one request."""

    def __init__(
        self, pd: PrefillDecode, ctx: RequestContext, sched: SchedulingContext, profile: Profile
    ) -> None:
        assert ctx.decision is not None and ctx.inference is not None
        self.pd, self.ctx, self.sched, self.profile = pd, ctx, sched, profile
        self.inference, self.backend = ctx.inference, ctx.decision.backend
        self.headers = forwarded_headers(ctx.request, ctx.tenant is not None)

    async def prefill(self, state: EndpointState, body: dict[str, Any], last: bool) -> bytes:
        """Send the prefill request; its response body, or PrefillFailed / _Relayed."""
        pd, ctx = self.pd, self.ctx
        address = self.backend.address(state)
        wire = encode_request(
            "POST", ctx.request.path_qs, address, self.headers, orjson.dumps(body)
        )
        self.profile.on_pick(self.sched, state)
        state.add_inflight(1)
        tokens = sent_prompt_tokens(self.inference, self.sched)  # its answer is the first token
        state.add_prefill_tokens(tokens)
        t = time.perf_counter()
        try:
            status, upstream_headers, data = await pd.proxy.fetch(
                address, wire, self.backend.timeout, PrefillFailed
            )
        except PrefillFailed as failure:
            pd.outliers.attempt_failed(state, failure)
            raise
        finally:
            state.add_inflight(-1)
            state.add_prefill_tokens(-tokens)
        elapsed = time.perf_counter() - t
        pd.metrics.pd_prefill.labels(self.inference.model).observe(elapsed)
        ctx.prefill_endpoint = address
        ctx.prefill_ms = milliseconds(elapsed)
        if status >= 500:
            pd.outliers.failure(state)
            if not last:
                raise PrefillFailed("status", f"HTTP {status}")
        else:
            pd.outliers.success(state)
        if status >= 400:
            ctx.upstream_status, ctx.endpoint = status, address
            headers = relayed_headers(upstream_headers, address, {PREFILL_HEADER: address})
            raise _Relayed(Response(status=status, body=data, **headers))
        return data

    async def decode(
        self, state: EndpointState, body: bytes, may_retry: bool, prefill_address: str
    ) -> StreamResponse:
        """The decode request, relayed to the client by the proxy like any other."""
        self.profile.on_pick(self.sched, state)
        self.ctx.add_headers({PREFILL_HEADER: prefill_address})
        address = self.backend.address(state)
        return await self.pd.proxy.send(self.ctx, state, address, self.headers, body, may_retry)

    async def sequential(
        self, prefill: EndpointState, decode: EndpointState, may_retry: bool
    ) -> StreamResponse:
        """http / lmcache / nixl / mooncake: prefill, then decode."""
        inference = self.inference
        mode = self.backend.pd.mode  # type: ignore[union-attr]
        data = await self.prefill(prefill, prefill_doc(inference.doc, mode), not may_retry)
        if mode in KV_PARAMS_CONNECTORS:
            params = kv_params_of(data)
            if params is None:
                log.warning(
                    "prefill %s returned no kv_transfer_params: the decode computes the prompt",
                    self.backend.address(prefill),
                )
            body = orjson.dumps(decode_doc(inference.doc, params))
        else:
            body = inference.final_body()
        return await self.decode(decode, body, may_retry, self.backend.address(prefill))

    async def concurrent(
        self, prefill: EndpointState, decode: EndpointState, may_retry: bool
    ) -> StreamResponse:
        """SGLang: both at once, paired by bootstrap room. A prefill failure before the decode
        response starts cancels the decode (it would wait for KV that never comes)."""
        inference, ctx = self.inference, self.ctx
        prefill_address = self.backend.address(prefill)
        room, host = new_room(), host_of(prefill_address)
        ctx.bootstrap_room = room
        prefill_body = with_bootstrap(prefill_doc(inference.doc, SGLANG), host, room)
        decode_body = orjson.dumps(with_bootstrap(inference.doc, host, room))
        p = asyncio.ensure_future(self.prefill(prefill, prefill_body, not may_retry))
        d = asyncio.ensure_future(self.decode(decode, decode_body, may_retry, prefill_address))
        ok = False
        try:
            await asyncio.wait((p, d), return_when=asyncio.FIRST_COMPLETED)
            if p.done() and p.exception() is not None and ctx.ttft is None and not d.done():
                # Nothing has reached the client yet: abandon this pair.
                raise p.exception()  # type: ignore[misc]
            if not d.done():
                await asyncio.wait((d,))
            response = d.result()
            ok = True
        finally:
            for task in (p, d):  # a prefill still running after the decode ends on its own
                if not ok:
                    task.cancel()
                _background.add(task)
                task.add_done_callback(_background.discard)
                task.add_done_callback(_consume)
        return response


def _consume(task: asyncio.Task[Any]) -> None:
    """Retrieve a finished task's exception so asyncio does not log it."""
    if not task.cancelled() and (err := task.exception()) is not None:
        log.info("a prefill/decode request ended after the response was decided: %s", err)
