"""The engine loop: one asyncio task steps the whole batch.

Each turn asks the scheduler for a step, sleeps for the step's modelled duration times
``time_scale`` (measured from the step's start, so the loop's own cost is not added on
top), then applies the step and wakes the HTTP handlers whose sequences got tokens. With
``time_scale`` 0 a step only yields to the event loop once.
"""

from __future__ import annotations

import asyncio
import time

from llmplane.aio import cancel, wait_event
from llmplane.sim.config import SimConfig
from llmplane.sim.kvevents import KVEventPublisher
from llmplane.sim.metrics import SimMetrics
from llmplane.sim.scheduler import Scheduler, Sequence


class Group:
    """The sequences of one HTTP request and the future its handler waits on."""

    __slots__ = ("max_tokens", "n", "remaining", "seqs", "stream", "waiter", "woken")

    def __init__(self, stream: bool, n: int = 1, max_tokens: int | None = None) -> None:
        self.stream = stream
        self.n = n  # the request's n and max_tokens, for vLLM's request_params_* histograms
        self.max_tokens = max_tokens
        self.seqs: list[Sequence] = []
        self.remaining = 0
        self.waiter: asyncio.Future | None = None
        # A wake while the handler was not waiting (a stream's write blocked on a slow
        # client): its next wait returns at once instead of missing the last tokens.
        self.woken = False

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)
        else:
            self.woken = True

    async def wait(self) -> None:
        if self.woken:
            self.woken = False
            return
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class Engine:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.sched = Scheduler(cfg)
        self.metrics = SimMetrics(self)
        self._kick = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.steps = 0
        self.kv_events: KVEventPublisher | None = None
        if cfg.kv_events is not None and cfg.kv_events.enabled:
            self.kv_events = KVEventPublisher(cfg.kv_events, cfg.kv_events_wire)
            self.sched.pool.events = []

    def start(self) -> None:
        if self.kv_events is not None:
            self.kv_events.start()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel(task)
        if self.kv_events is not None:
            self.kv_events.close()
            self.kv_events = None

    def submit(self, group: Group) -> None:
        now = time.perf_counter()
        group.remaining = len(group.seqs)
        add = self.sched.add
        for seq in group.seqs:
            seq.group = group
            seq.arrival = now
            add(seq)
        self.metrics.request_arrived(group.n, max(1, len(group.seqs) // max(1, group.n)))
        self._kick.set()

    def abort(self, group: Group) -> None:
        """Drop a request's unfinished sequences (client went away)."""
        for seq in group.seqs:
            if not seq.finished:
                self.sched.abort(seq)
                self.metrics.success["abort"] += 1

    async def _run(self) -> None:
        # Timestamps come from perf_counter: the loop clock of uvloop has 1 ms resolution.
        clock = time.perf_counter
        sched = self.sched
        metrics = self.metrics
        scale = self.cfg.time_scale
        kick = self._kick
        success = metrics.success
        e2e = metrics.e2e
        deadline = 0.0  # planned end of the previous step
        while True:
            if not sched.has_work():
                kick.clear()
                await kick.wait()
                deadline = 0.0
                continue
            t0 = clock()
            # Steps follow each other on a planned timeline so that timer granularity and
            # wake-up jitter do not add up; a step that is late by more than 5 ms restarts
            # the timeline (the event loop was busy, as a GPU host's CPU can be).
            start = deadline if t0 - 0.005 < deadline else t0
            step = sched.schedule(t0)
            if not step.scheduled:
                # Only sequences waiting for a KV transfer (or for room held by them).
                kick.clear()
                t = sched.next_transfer_at()
                timeout = 0.001 if t is None else max(0.0, t - clock())
                await wait_event(kick, timeout)
                deadline = 0.0
                continue
            delay = step.duration * scale
            if delay > 0:
                deadline = start + delay
                await asyncio.sleep(max(0.0, deadline - clock()))
            else:
                await asyncio.sleep(0)
            now = clock()
            emitted, finished = sched.complete(step, now)
            self.steps += 1
            records = sched.pool.events
            if records and self.kv_events is not None:
                faults = self.cfg.faults
                send = faults.kv_events_drop <= 0
                if not send:
                    faults.kv_events_drop -= 1
                self.kv_events.publish(records, send)
                records.clear()
            metrics.iteration_tokens.observe(step.prefill_tokens + step.decode_seqs)
            if step.ttfts:
                metrics.ttft.observe_all(step.ttfts)
            if step.itls:
                metrics.itl.observe_all(step.itls)
            for seq in finished:
                success[seq.finish_reason] += 1
                e2e.observe(now - seq.arrival)
                g = seq.group
                metrics.sequence_finished(seq, now, g.max_tokens)
                g.remaining -= 1
                if g.remaining == 0:
                    metrics.request_finished(g.seqs)
                if not g.stream and g.remaining == 0:
                    g.wake()
            for seq in emitted:
                g = seq.group
                if g.stream:
                    g.wake()
