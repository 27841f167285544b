"""What sharing one worker's scrapes costs the workers of an idle fleet, per second.

    python -m bench.scrape_share [--endpoints 200]

One second of an idle fleet under ``--workers 2``, in one process over the real shared-memory
tables (``llmplane/gateway/workers/scrapes.py``): worker 0's idle ticker (10 ticks) and the
follower's 20 polls, for ``--endpoints`` idle endpoints. Prints the CPU milliseconds that
second costs (the best of 8 repeats of 5 seconds' work). Run it on an older build (its
``PYTHONPATH``) to compare: a build before the scrape heartbeat republished every idle row
at each tick.
"""

from __future__ import annotations

import argparse
import time
import timeit

from llmplane.gateway.scraper import LoadMetrics, apply_metrics
from llmplane.gateway.workers import scrapes
from llmplane.gateway.workers.inflight import InflightTable
from llmplane.gateway.workers.shm import Locks
from llmplane.runtime.endpoint import Endpoint


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--endpoints", type=int, default=200)
    args = p.parse_args(argv)
    n = args.endpoints
    inflight = InflightTable(2, n, Locks())
    endpoints = [Endpoint(f"10.0.{i // 250}.{i % 250}:8000", engine="sim") for i in range(n)]
    writers = [inflight.state(e, 0) for e in endpoints]
    readers = [inflight.state(e, 1) for e in endpoints]
    table = scrapes.ScrapeTable(n)
    heartbeat = hasattr(scrapes, "ScrapePublisher")  # this build; older ones republished rows
    publisher = scrapes.ScrapePublisher(table, lambda: writers, 0.1) if heartbeat else None
    follower = scrapes.ScrapeFollower(table, lambda: readers, 0.05)
    for w in writers:
        apply_metrics(w, LoadMetrics(waiting=0, running=0, kv=0.0), time.monotonic())
        if publisher is not None:
            publisher.publish(w, True)
        else:
            table.publish(w.column, w)  # type: ignore[attr-defined]

    def second() -> None:
        for _ in range(10):
            now = time.monotonic()
            if publisher is not None:
                publisher.flush(now)
            else:
                for w in writers:
                    w.scraped_at = now
                    table.publish(w.column, w)  # type: ignore[attr-defined]
            follower.poll(now)
            follower.poll(now)

    best = min(timeit.repeat(second, number=5, repeat=8)) / 5
    kind = "heartbeat" if heartbeat else "rows republished"
    print(f"{n} idle endpoints, {kind}: {best * 1000:.2f} ms of CPU per second")


if __name__ == "__main__":
    main()
