"""Counts per endpoint that every worker sees (docs/gateway.md, "Workers": in-flight counts): a
row of int64 counters per worker, written only by that worker, summed over the rows when read.
No lock: each counter has one writer, and an aligned 8-byte store is atomic."""

from __future__ import annotations

from llmplane.gateway.registry import EndpointState
from llmplane.gateway.workers.shm import LOCK_ENDPOINTS, Directory, Locks, cells
from llmplane.runtime.endpoint import Endpoint


class InflightTable:
    """``workers`` rows x ``capacity`` endpoint columns, three times: requests in flight,
    streams before their first chunk, prompt tokens before their first byte."""

    def __init__(self, workers: int, capacity: int, locks: Locks) -> None:
        self.workers = workers
        self.capacity = capacity
        self.directory = Directory(capacity, locks.held(LOCK_ENDPOINTS))
        self.tables = tuple(cells(workers * capacity) for _ in range(3))

    def clear(self, worker: int) -> None:
        """Zero ``worker``'s rows: its requests died with it (the supervisor reaped it)."""
        row = slice(worker * self.capacity, (worker + 1) * self.capacity)
        for table in self.tables:
            table[row] = memoryview(bytes(self.capacity * 8)).cast("q")

    def state(self, endpoint: Endpoint, worker: int) -> EndpointState:
        """``endpoint``'s state with the counts of every worker; a plain (this worker only)
        state if the table is full."""
        found = self.directory.row(endpoint.address)
        if found is None:
            return EndpointState(endpoint)
        return SharedEndpointState(endpoint, self, worker, found[0])


def _ignored(state: SharedEndpointState, value: int) -> None:
    """Only the dataclass ``__init__`` sets the shared counts (to 0): a new state adopts them."""


class SharedEndpointState(EndpointState):
    """``inflight``, ``prefilling`` and ``prefill_tokens`` summed over every worker's counter;
    ``add_*`` moves this worker's own."""

    __slots__ = ("_cells", "_counts", "_mine", "_prefilling", "_prompt_tokens", "column")

    def __init__(self, endpoint: Endpoint, table: InflightTable, worker: int, column: int) -> None:
        self._counts, self._prefilling, self._prompt_tokens = table.tables
        self._mine = worker * table.capacity + column
        self._cells = tuple(w * table.capacity + column for w in range(table.workers))
        self.column = column  # the endpoint's row in every shared per-endpoint table
        super().__init__(endpoint)

    inflight = property(lambda s: sum(s._counts[c] for c in s._cells), _ignored)
    prefilling = property(lambda s: sum(s._prefilling[c] for c in s._cells), _ignored)
    prefill_tokens = property(lambda s: sum(s._prompt_tokens[c] for c in s._cells), _ignored)

    def add_inflight(self, n: int) -> None:
        self._counts[self._mine] += n

    def add_prefilling(self, n: int) -> None:
        self._prefilling[self._mine] += n

    def add_prefill_tokens(self, n: int) -> None:
        self._prompt_tokens[self._mine] += n
