"""What each worker reports of itself, readable by every other without asking it: one small
seqlock ``Document`` per worker in shared memory, written only by that worker (and by its
replacement after it died), read by any. The console's request charts read the workers'
request totals here once a second: N writes and N reads a second for N workers, where asking
each peer over its socket cost every console N - 1 round trips a second (N^2 in all)."""

from __future__ import annotations

from llmplane.gateway.workers.shm import Document

REPORT_BYTES = 64 * 1024  # a worker's report at the most (pages are touched only as written)


class WorkerReports:
    """``workers`` documents of up to ``size`` bytes, one per worker."""

    def __init__(self, workers: int, size: int = REPORT_BYTES) -> None:
        self.docs = [Document(size) for _ in range(workers)]

    def write(self, index: int, data: bytes) -> bool:
        """Worker ``index`` publishes ``data`` (False if it does not fit)."""
        return self.docs[index].write(data)


class ReportReader:
    """One process's reader of the other workers' reports: the latest whole copy of each
    (a report being written right now reads as its previous copy)."""

    def __init__(self, reports: WorkerReports, skip: int) -> None:
        self.reports = reports
        self.skip = skip  # our own index
        self._seen: dict[int, tuple[int, bytes]] = {}

    def read(self) -> list[tuple[int, bytes]]:
        """(worker index, latest report) of every other worker that has reported."""
        out = []
        for index, doc in enumerate(self.reports.docs):
            if index == self.skip:
                continue
            seen = self._seen.get(index)
            got = doc.read(seen[0] if seen is not None else 0)
            if got is not None:
                seen = self._seen[index] = got
            if seen is not None:
                out.append((index, seen[1]))
        return out
