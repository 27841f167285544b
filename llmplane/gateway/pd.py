"""Prefill/decode disaggregation for Kthena ModelServers with ``workloadSelector.pdGroup``.

A request on such a backend is served by two replicas of the same group (the value of the
pod label ``groupKey``): a **prefill** replica computes the prompt's KV cache and a
**decode** replica generates the answer from it. The gateway:

1. schedules the decode replica first (the route's scheduling profile over the decode
   replicas that have at least one prefill replica in their group), then the best prefill
   replica of that decode replica's group (same profile, so prefix-cache affinity lands on
   the replica that actually computes the prompt);
2. sends the prefill request: the client's body without ``stream`` / ``stream_options`` /
   ``min_tokens``, with ``max_tokens: 1`` (and ``max_completion_tokens: 1`` when given);
3. sends the decode request, per KV connector:

   - ``http``, ``lmcache``: after the prefill, the client's body as it is;
   - ``nixl``, ``mooncake``: the prefill body also carries ``kv_transfer_params:
     {do_remote_decode: true, do_remote_prefill: false}``; the prefill response's
     ``kv_transfer_params`` go verbatim into the decode body;
   - SGLang (``inferenceEngine: SGLang``): both bodies carry the same random
     ``bootstrap_room`` and ``bootstrap_host`` = the prefill replica's host, and both are
     sent at once (the decode side pulls the KV from the prefill side while it runs).

The client's response is the decode replica's (status, headers, body or stream), plus
``x-llmplane-prefill-endpoint``. Nothing reaches the client before the decode response
starts, so a failed prefill (connect error, timeout, 5xx) is retried on the group's next
prefill replica (once a group's prefill replicas are used up, on the next decode replica and
its group); a failed decode is retried on the next decode replica, with a new prefill in its
group. Every attempt counts against the route's retry budget. A prefill 4xx is the client's
answer (the decode would refuse the request too).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from llmplane.gateway.errors import GatewayError
from llmplane.gateway.http_server import Request, Response, StreamResponse
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.upstream_client import encode_request

log = logging.getLogger("llmplane.gateway")

PREFILL_HEADER = "x-llmplane-prefill-endpoint"
SGLANG = "sglang"
# KV connectors whose decode request carries the prefill response's kv_transfer_params.
KV_PARAMS_CONNECTORS = frozenset({"nixl", "mooncake"})
MODES = frozenset({"http", "lmcache", "nixl", "mooncake", SGLANG})
# Fields a prefill request must not carry: it answers one token, never streamed.
_PREFILL_DROP = ("stream", "stream_options", "min_tokens")

_background: set[asyncio.Task[Any]] = set()


@dataclass(frozen=True)
class PDBackend:
    """The prefill side of a disaggregated ModelServer (the decode replicas are the
    backend's candidates)."""

    group_key: str
    prefill: tuple[EndpointState, ...]
    mode: str  # http | lmcache | nixl | mooncake | sglang

    def group_of(self, state: EndpointState) -> str | None:
        return state.endpoint.labels.get(self.group_key) or None


def mode_of(engine: str, connector: str | None) -> str:
    """SGLang engines pair by bootstrap room; vLLM ones by their KV connector (default http)."""
    if engine == "SGLang":
        return SGLANG
    return connector or "http"


# --- bodies (pure) ----------------------------------------------------------------------------


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
    """nixl / mooncake: the client's body with the prefill's ``kv_transfer_params``
    (verbatim); without them (a prefill that did not return any) the decode computes the
    prompt itself, so the key is left out rather than sent as null."""
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


# --- serving --------------------------------------------------------------------------------


class PrefillFailed(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind  # connect | timeout | status
        self.detail = detail


class _Relayed(Exception):
    """A prefill answered 4xx (or a 5xx on the last attempt): that is the client's answer."""

    def __init__(self, response: Response) -> None:
        self.response = response


def _groups(gw: Any, pd: PDBackend, now: float) -> dict[str, list[EndpointState]]:
    by_group: dict[str, list[EndpointState]] = {}
    for state in pd.prefill:
        group = pd.group_of(state)
        if group is not None:
            by_group.setdefault(group, []).append(state)
    # Ejection per group, failing open within a group.
    return {g: gw.outliers.available(members, now) for g, members in by_group.items()}


async def serve_pd(
    gw: Any,
    request: Request,
    req: Any,
    decision: Any,
    candidates: Sequence[EndpointState],
    ctx: Any,
    record: dict[str, Any],
    outcome: Any,
    t0: float,
) -> StreamResponse:
    """Serve ``req`` on a prefill + decode pair (see the module docstring)."""
    from llmplane.gateway.server import _Failed, forwarded_headers

    backend = decision.backend
    pd: PDBackend = backend.pd
    groups = _groups(gw, pd, ctx.now)
    decodes = [s for s in candidates if pd.group_of(s) in groups]
    if not decodes:
        raise GatewayError(
            503,
            f"model {req.model!r} has no prefill/decode pair ready ({backend.ref}: no decode "
            f"endpoint has a prefill endpoint with the same {pd.group_key!r} label)",
            "no_ready_endpoint",
        )
    attempts = max(0, backend.retry_attempts)
    width = max(gw.config.fallbacks, attempts + 1)
    ts = time.perf_counter()
    pick = gw.scheduler.pick(ctx, decodes, min(len(decodes), width), backend.profile)
    prefill_orders: dict[str, list[EndpointState]] = {}

    def prefill_order(group: str) -> list[EndpointState]:
        order = prefill_orders.get(group)
        if order is None:
            members = groups[group]
            order = prefill_orders[group] = gw.scheduler.pick(
                ctx, members, min(len(members), width), backend.profile
            ).endpoints
        return order

    prefill_order(pd.group_of(pick.endpoints[0]) or "")
    sched = time.perf_counter() - ts
    gw.metrics.scheduling.observe(sched)
    record["sched_ms"] = round(sched * 1000, 3)
    record["profile"] = pick.profile
    record["scores"] = pick.scores
    record["pd"] = pd.mode
    gw.metrics.pd_requests.labels(req.model, pd.mode).inc()
    headers = forwarded_headers(request)
    profile = gw.scheduler.profile(backend.profile)
    timeout = backend.timeout
    order = pick.endpoints
    last: Any = None
    tried = di = pi = 0
    for attempt in range(attempts + 1):
        if attempt:
            gw.metrics.retries.labels(decision.route).inc()
            if backend.retry_interval > 0:
                await asyncio.sleep(backend.retry_interval)
        tried += 1
        decode = order[di % len(order)]
        prefills = prefill_order(pd.group_of(decode) or "")
        prefill = prefills[pi % len(prefills)]
        pair = _Pair(gw, request, req, decision, ctx, profile, headers, outcome, record, t0)
        try:
            if pd.mode == SGLANG:
                response = await pair.concurrent(prefill, decode, attempt < attempts)
            else:
                response = await pair.sequential(prefill, decode, attempt < attempts)
        except _Relayed as relayed:
            record["attempts"] = tried
            return relayed.response
        except PrefillFailed as failure:
            last = failure
            record.setdefault("failures", []).append(
                f"prefill {backend.address(prefill)}: {failure.detail}"
            )
            pi += 1
            if pi >= len(prefills) and len(order) > 1:
                di, pi = di + 1, 0
            continue
        except _Failed as failure:
            last = failure
            gw.outliers.failure(decode)
            record.setdefault("failures", []).append(f"{backend.address(decode)}: {failure.detail}")
            di, pi = di + 1, 0
            continue
        if (outcome.status or 0) >= 500 or outcome.upstream_broken:
            gw.outliers.failure(decode)
        else:
            gw.outliers.success(decode)
        record["attempts"] = tried
        return response
    record["attempts"] = tried
    assert last is not None
    plural = "s" if tried > 1 else ""
    if last.kind == "timeout":
        raise GatewayError(
            504,
            f"model {req.model!r}: no response within {timeout} s ({tried} attempt{plural}); "
            f"last: {last.detail}",
            "upstream_timeout",
            endpoint=outcome.endpoint,
        )
    raise GatewayError(
        502,
        f"model {req.model!r}: could not get a response from any prefill/decode pair "
        f"({tried} attempt{plural}); last: {last.detail}",
        "bad_gateway",
        endpoint=outcome.endpoint,
    )


class _Pair:
    """One attempt on a (prefill, decode) pair."""

    def __init__(
        self,
        gw: Any,
        request: Request,
        req: Any,
        decision: Any,
        ctx: Any,
        profile: Any,
        headers: dict[str, str],
        outcome: Any,
        record: dict[str, Any],
        t0: float,
    ) -> None:
        self.gw = gw
        self.request = request
        self.req = req
        self.backend = decision.backend
        self.ctx = ctx
        self.profile = profile
        self.headers = headers
        self.outcome = outcome
        self.record = record
        self.t0 = t0

    async def prefill(self, state: EndpointState, body: dict[str, Any], last: bool) -> bytes:
        """Send the prefill request; its response body, or PrefillFailed / _Relayed."""
        gw, backend = self.gw, self.backend
        address = backend.address(state)
        wire = encode_request(
            "POST", self.request.path_qs, address, self.headers, orjson.dumps(body)
        )
        self.profile.on_pick(self.ctx, state)
        state.inflight += 1
        timeout = backend.timeout
        t = time.perf_counter()
        try:
            try:
                status, upstream_headers, data = await gw.pool.request(address, wire, timeout)
            except TimeoutError:
                gw.outliers.failure(state)
                raise PrefillFailed("timeout", f"timed out after {timeout} s") from None
            except (aiohttp.ClientError, OSError) as err:
                gw.outliers.failure(state)
                raise PrefillFailed("connect", f"{type(err).__name__}: {err}") from None
        finally:
            state.inflight -= 1
        elapsed = time.perf_counter() - t
        gw.metrics.pd_prefill.labels(self.req.model).observe(elapsed)
        self.record["prefill_endpoint"] = address
        self.record["prefill_ms"] = round(elapsed * 1000, 3)
        if status >= 500:
            gw.outliers.failure(state)
            if not last:
                raise PrefillFailed("status", f"HTTP {status}")
        else:
            gw.outliers.success(state)
        if status >= 400:
            from llmplane.gateway.server import _relayed

            self.outcome.status = status
            self.outcome.endpoint = address
            raise _Relayed(
                Response(
                    status=status,
                    body=data,
                    **_relayed(upstream_headers, address, {PREFILL_HEADER: address}),
                )
            )
        return data

    async def decode(
        self, state: EndpointState, body: bytes, may_retry: bool, prefill_address: str
    ) -> StreamResponse:
        """The decode request, relayed to the client by the gateway's own proxy paths."""
        gw, outcome = self.gw, self.outcome
        address = self.backend.address(state)
        self.profile.on_pick(self.ctx, state)
        state.inflight += 1
        outcome.endpoint = address
        extra = {PREFILL_HEADER: prefill_address}
        outcome.headers = {**outcome.headers, **extra} if outcome.headers else extra
        wire = encode_request("POST", self.request.path_qs, address, self.headers, body)
        timeout = self.backend.timeout
        # Both release the in-flight count themselves, however they end.
        if self.req.stream:
            return await gw._stream(
                self.request, address, wire, timeout, state, outcome, self.t0, may_retry
            )
        return await gw._unary(address, wire, timeout, state, outcome, may_retry)

    async def sequential(
        self, prefill: EndpointState, decode: EndpointState, may_retry: bool
    ) -> StreamResponse:
        """http / lmcache / nixl / mooncake: prefill, then decode."""
        req = self.req
        mode = self.backend.pd.mode
        data = await self.prefill(prefill, prefill_doc(req.doc, mode), not may_retry)
        if mode in KV_PARAMS_CONNECTORS:
            params = kv_params_of(data)
            if params is None:
                log.warning(
                    "prefill %s returned no kv_transfer_params: the decode computes the prompt",
                    self.backend.address(prefill),
                )
            body = orjson.dumps(decode_doc(req.doc, params))
        else:
            body = req.final_body()
        return await self.decode(decode, body, may_retry, self.backend.address(prefill))

    async def concurrent(
        self, prefill: EndpointState, decode: EndpointState, may_retry: bool
    ) -> StreamResponse:
        """SGLang: both at once, paired by bootstrap room. A prefill failure before the decode
        response starts cancels the decode (it would wait for KV that never comes)."""
        req, outcome = self.req, self.outcome
        prefill_address = self.backend.address(prefill)
        room, host = new_room(), host_of(prefill_address)
        self.record["bootstrap_room"] = room
        prefill_body = with_bootstrap(prefill_doc(req.doc, SGLANG), host, room)
        decode_body = orjson.dumps(with_bootstrap(req.doc, host, room))
        p = asyncio.ensure_future(self.prefill(prefill, prefill_body, not may_retry))
        d = asyncio.ensure_future(self.decode(decode, decode_body, may_retry, prefill_address))
        ok = False
        try:
            await asyncio.wait((p, d), return_when=asyncio.FIRST_COMPLETED)
            if p.done() and p.exception() is not None and outcome.ttft is None and not d.done():
                # Nothing has reached the client yet: abandon this pair.
                raise p.exception()  # type: ignore[misc]
            if not d.done():
                await asyncio.wait((d,))
            response = d.result()
            ok = True
        finally:
            for task in (p, d):
                if not ok and not task.done():
                    task.cancel()
                if task.done():
                    _consume(task)
                else:  # the decode finished first (or was cancelled): let it end on its own
                    _background.add(task)
                    task.add_done_callback(_background.discard)
                    task.add_done_callback(_consume)
        return response


def _consume(task: asyncio.Task[Any]) -> None:
    """Retrieve a finished prefill task's exception so asyncio does not log it."""
    if not task.cancelled() and (err := task.exception()) is not None:
        log.info("a prefill/decode request ended after the response was decided: %s", err)
