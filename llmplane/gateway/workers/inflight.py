"""In-flight counts per endpoint seen by every worker: one row of counters per worker in shared
memory, each row written only by its own worker, readers sum the column (no lock: each
counter has one writer, and an 8-byte aligned store is atomic). The same again for the streams
still waiting for their first chunk (``saturation_max_prefilling``) and for the prompt tokens of
requests waiting for their first byte (the autoscaling signal of prefill tokens waiting)."""

from __future__ import annotations

from llmplane.gateway.registry import EndpointState
from llmplane.gateway.workers.shm import LOCK_ENDPOINTS, Directory, Locks, region
from llmplane.runtime.endpoint import Endpoint


class InflightTable:
    """``workers`` rows x ``capacity`` endpoint columns of int64 counters, three times: requests
    in flight, streams before their first chunk, prompt tokens before their first byte."""

    def __init__(self, workers: int, capacity: int, locks: Locks) -> None:
        self.workers = workers
        self.capacity = capacity
        self.directory = Directory(capacity, locks, LOCK_ENDPOINTS)
        self.mem = region(workers * capacity * 8)
        self.counts = memoryview(self.mem).cast("q")
        self.prefill_mem = region(workers * capacity * 8)
        self.prefilling = memoryview(self.prefill_mem).cast("q")
        self.prompt_mem = region(workers * capacity * 8)
        self.prompt_tokens = memoryview(self.prompt_mem).cast("q")

    def clear(self, worker: int) -> None:
        """Zero ``worker``'s row: its requests died with it (the supervisor calls this when it
        reaps a worker, before its replacement starts)."""
        start = worker * self.capacity
        zeros = memoryview(bytes(self.capacity * 8)).cast("q")
        self.counts[start : start + self.capacity] = zeros
        self.prefilling[start : start + self.capacity] = zeros
        self.prompt_tokens[start : start + self.capacity] = zeros

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
            self.prompt_tokens,
            worker * self.capacity + column,
            tuple(w * self.capacity + column for w in range(self.workers)),
            column,
        )


class SharedEndpointState(EndpointState):
    """An ``EndpointState`` whose ``inflight`` is the sum of every worker's counter for the
    endpoint; ``add_inflight`` moves this worker's own. The same for ``prefilling`` and
    ``prefill_tokens``."""

    __slots__ = ("_cells", "_counts", "_mine", "_prefilling", "_prompt_tokens", "column")

    def __init__(
        self,
        endpoint: Endpoint,
        counts: memoryview,
        prefilling: memoryview,
        prompt_tokens: memoryview,
        mine: int,
        cells: tuple[int, ...],
        column: int = -1,
    ) -> None:
        self._counts = counts
        self._prefilling = prefilling
        self._prompt_tokens = prompt_tokens
        self._mine = mine
        self._cells = cells
        self.column = column  # the endpoint's row in every shared per-endpoint table
        super().__init__(endpoint)

    # Only the dataclass ``__init__`` sets ``inflight``, ``prefilling`` and ``prefill_tokens``
    # (to 0): a fresh state adopts the shared counts, and the setters do nothing.

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

    @property  # type: ignore[override]
    def prefill_tokens(self) -> int:
        return sum(self._prompt_tokens[cell] for cell in self._cells)

    @prefill_tokens.setter
    def prefill_tokens(self, value: int) -> None:
        pass

    def add_prefill_tokens(self, n: int) -> None:
        self._prompt_tokens[self._mine] += n
