"""Usage per tenant and model (docs/tenants.md, "Usage"): Prometheus counters and the usage
log's records, as a request hook. Label values are our own names only (the tenant from the
Tenant table, the model as the routing table resolved it). The request path only adds to a
dict per (minute, tenant, model); a task writes it to the log in one transaction now and then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmplane.gateway.hooks import Reservation, Usage
from llmplane.gateway.observability import Counter
from llmplane.gateway.ratelimit.usage_filter import ask_stream_usage
from llmplane.store.usage import USAGE_FILENAME, UsageLog

if TYPE_CHECKING:
    from llmplane.gateway.context import RequestContext

log = logging.getLogger("llmplane.gateway")


def usage_log_for(store: Any, setting: str | None) -> UsageLog | None:
    """The usage log: ``setting`` (a path, or ``off``); by default ``usage.db`` beside a
    SQLite store (``llmplane up``, ``llmplane gateway --state-dir``), none on Kubernetes
    (Prometheus holds the counters there)."""
    if setting == "off":
        return None
    if setting:
        return UsageLog(setting)
    path = getattr(store, "path", None)
    if isinstance(path, Path):
        return UsageLog(path.parent / USAGE_FILENAME)
    return None


class TenantUsage:
    """The ``RequestHook`` counting each tenant's usage; ``start`` / ``close`` run the flusher."""

    def __init__(
        self,
        usage_log: UsageLog | None,
        flush_interval: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.log = usage_log
        self.flush_interval = flush_interval
        self.clock = clock
        self.requests = Counter(
            "llmplane_gateway_tenant_usage_requests",
            "Answered requests (status < 400) by tenant and model",
            ("tenant", "model"),
        )
        self.tokens = Counter(
            "llmplane_gateway_tenant_usage_tokens",
            "Tokens the engines reported by tenant, model and direction (input, output)",
            ("tenant", "model", "direction"),
        )
        # (minute, tenant, model) -> [answered requests, input tokens, output tokens]
        self.pending: dict[tuple[int, str, str], list[int]] = {}
        self._task: asyncio.Task[None] | None = None

    async def reserve(self, ctx: RequestContext) -> object:
        """A tenant's stream asks the engine for its usage (dropped again for a client that
        did not ask): the output tokens are counted either way."""
        inference = ctx.inference
        assert inference is not None
        if ctx.tenant is None:
            return None
        if inference.stream and (stream_filter := ask_stream_usage(inference)) is not None:
            return Reservation(stream_filter=stream_filter)
        return None

    def settle(self, ctx: RequestContext, reservation: object, usage: Usage | None) -> None:
        inference, tenant, status = ctx.inference, ctx.tenant_name, ctx.status
        if tenant is None or inference is None:
            return
        model = inference.model
        answered = 1 if status < 400 else 0
        prompt = (usage.prompt_tokens or 0) if usage is not None else 0
        completion = (usage.completion_tokens or 0) if usage is not None else 0
        if answered:
            self.requests.labels(tenant, model).inc()
        if prompt:
            self.tokens.labels(tenant, model, "input").inc(prompt)
        if completion:
            self.tokens.labels(tenant, model, "output").inc(completion)
        if self.log is None or not (answered or prompt or completion):
            return
        minute = int(self.clock() // 60) * 60
        counts = self.pending.setdefault((minute, tenant, model), [0, 0, 0])
        counts[0] += answered
        counts[1] += prompt
        counts[2] += completion

    def metrics(self) -> list[Counter]:
        return [self.requests, self.tokens]

    def start(self) -> None:
        if self.log is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name="usage-flusher")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            await self.flush()

    async def flush(self) -> None:
        """Write what is pending (in a worker thread); kept for the next flush on failure."""
        if self.log is None or not self.pending:
            return
        batch, self.pending = self.pending, {}
        try:
            await asyncio.to_thread(self.log.add, batch)
        except Exception as err:  # a full disk, a locked file: keep the counts, say so
            log.warning("usage log %s: write failed (%s); will retry", self.log.path, err)
            for key, counts in batch.items():
                mine = self.pending.get(key, [0, 0, 0])
                self.pending[key] = [a + b for a, b in zip(mine, counts, strict=True)]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])  # our own cancellation still propagates
            self._task = None
        await self.flush()
