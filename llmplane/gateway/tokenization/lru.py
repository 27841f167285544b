"""The one bounded cache of the tokenization: least recently used out first."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(OrderedDict[K, V]):
    """At most ``max_entries`` entries and ``max_weight`` in total (each entry's ``weight``);
    an entry of more than a quarter of ``max_weight`` is not kept (one may not push out most
    of the cache). ``get`` makes an entry the newest."""

    def __init__(
        self,
        max_entries: int = sys.maxsize,
        max_weight: int = sys.maxsize,
        weight: Callable[[K, V], int] = lambda key, value: 0,
    ) -> None:
        super().__init__()
        self.max_entries = max_entries
        self.max_weight = max_weight
        self.weight = weight
        self.total = 0  # the entries' weight

    def get(self, key: K) -> V | None:  # type: ignore[override]
        try:
            self.move_to_end(key)
        except KeyError:
            return None
        return self[key]

    def put(self, key: K, value: V) -> None:
        if key in self:
            self.move_to_end(key)
            return
        weight = self.weight(key, value)
        if weight > self.max_weight // 4:
            return
        self[key] = value
        self.total += weight
        while len(self) > self.max_entries or self.total > self.max_weight:
            old, value = self.popitem(last=False)
            self.total -= self.weight(old, value)

    def clear(self) -> None:
        super().clear()
        self.total = 0
