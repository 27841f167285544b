"""In-flight counts per endpoint seen by every worker: one row of counters per worker in shared
memory, each row written only by its own worker, readers sum the column (no lock: each
counter has one writer, and an 8-byte aligned store is atomic). The same again for the streams
still waiting for their first chunk (``saturation_max_prefilling``)."""

from __future__ import annotations

from llmplane.gateway.registry import EndpointState
from llmplane.gateway.workers.shm import LOCK_ENDPOINTS, Directory, Locks, region
from llmplane.runtime.endpoint import Endpoint


class InflightTable:
    """``workers`` rows x ``capacity`` endpoint columns of int64 counters, twice: requests in
    flight, and streams before their first chunk."""

    def __init__(self, workers: int, capacity: int, locks: Locks) -> None:
        self.workers = workers
        self.capacity = capacity
        self.directory = Directory(capacity, locks, LOCK_ENDPOINTS)
        self.mem = region(workers * capacity * 8)
        self.counts = memoryview(self.mem).cast("q")
        self.prefill_mem = region(workers * capacity * 8)
        self.prefilling = memoryview(self.prefill_mem).cast("q")

    def clear(self, worker: int) -> None:
        """Zero ``worker``'s row: its requests died with it (the supervisor calls this when it
        reaps a worker, before its replacement starts)."""
        start = worker * self.capacity
        zeros = memoryview(bytes(self.capacity * 8)).cast("q")
        self.counts[start : start + self.capacity] = zeros
        self.prefilling[start : start + self.capacity] = zeros

    def state(self, endpoint: Endpoint, worker: int) -> EndpointState:
        """The registry's state for ``endpoint`` whose ``inflight`` is every worker's sum; a
        plain (this worker only) state if the table is full."""
        found = self.directory.row(endpoint.address)
        if found is None:
            return EndpointState(endpoint)
        column = found[0]
        return SharedEndpointState(
            endpoint,
            self.counts,
            self.prefilling,
            worker * self.capacity + column,
            tuple(w * self.capacity + column for w in range(self.workers)),
            column,
        )


class SharedEndpointState(EndpointState):
    """An ``EndpointState`` whose ``inflight`` is the sum of every worker's counter for the
    endpoint; ``add_inflight`` moves this worker's own. The same for ``prefilling``."""

    __slots__ = ("_cells", "_counts", "_mine", "_prefilling", "column")

    def __init__(
        self,
        endpoint: Endpoint,
        counts: memoryview,
        prefilling: memoryview,
        mine: int,
        cells: tuple[int, ...],
        column: int = -1,
    ) -> None:
        self._counts = counts
        self._prefilling = prefilling
        self._mine = mine
        self._cells = cells
        self.column = column  # the endpoint's row in every shared per-endpoint table
        super().__init__(endpoint)

    # Only the dataclass ``__init__`` sets ``inflight`` and ``prefilling`` (to 0): a fresh
    # state adopts the shared counts, and the setters do nothing.

    @property  # type: ignore[override]
    def inflight(self) -> int:
        return sum(self._counts[cell] for cell in self._cells)

    @inflight.setter
    def inflight(self, value: int) -> None:
        pass

    def add_inflight(self, n: int) -> None:
        self._counts[self._mine] += n

    @property  # type: ignore[override]
    def prefilling(self) -> int:
        return sum(self._prefilling[cell] for cell in self._cells)

    @prefilling.setter
    def prefilling(self, value: int) -> None:
        pass

    def add_prefilling(self, n: int) -> None:
        self._prefilling[self._mine] += n
