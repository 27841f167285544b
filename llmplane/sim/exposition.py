"""Prometheus text exposition built for scrapes that cost next to nothing.

A replica's ``/metrics`` page is fixed text around a few numbers, and a fleet of hundreds is
scraped all the time, so the text is formatted once: HELP/TYPE lines, label sets and bucket
bounds go into a template at start, a scrape fills in the values. A histogram's lines are
rendered again only after it observed something, and the whole page is reused while none of
its values changed (an idle replica's scrape is one tuple comparison). The output is what
``prometheus_client.generate_latest`` writes for the same families, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from prometheus_client.utils import floatToGoString


class Observations(Protocol):
    """A histogram's state: counts per bucket (the last one +Inf), their total and sum."""

    counts: list[int]
    total: int
    sum: float


def _escape_help(doc: str) -> str:
    return doc.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def labels(pairs: dict[str, str]) -> str:
    """``{a="1",b="2"}``, names sorted and values escaped as prometheus_client does."""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(pairs.items())) + "}"


def header(name: str, doc: str, kind: str) -> str:
    return f"# HELP {name} {_escape_help(doc)}\n# TYPE {name} {kind}\n"


class Template:
    """Static text with value slots, filled by ``render(values)`` (one ``str.format``)."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self.slots = 0

    def text(self, s: str) -> None:
        self._parts.append(s.replace("{", "{{").replace("}", "}}"))

    def slot(self) -> None:
        self._parts.append("{}")
        self.slots += 1

    def compile(self) -> str:
        return "".join(self._parts)


class HistogramText:
    """One histogram family's lines, rendered again only when its observation count moved
    (several families may share one histogram: vLLM exports the ITL histogram twice)."""

    __slots__ = ("_count_at", "_created", "_head", "_prefixes", "_tail", "_text", "hist")

    def __init__(
        self,
        hist: Observations,
        name: str,
        doc: str,
        bounds: Sequence[float],
        base: dict[str, str],
        created: float,
    ) -> None:
        self.hist = hist
        les = [repr(float(b)) for b in bounds] + ["+Inf"]
        self._prefixes = [f"{name}_bucket{labels({**base, 'le': le})} " for le in les]
        lab = labels(base)
        self._tail = (f"{name}_count{lab} ", f"{name}_sum{lab} ")
        self._created = (
            header(name + "_created", doc, "gauge")
            + f"{name}_created{lab} {floatToGoString(created)}\n"
        )
        self._head = header(name, doc, "histogram")
        self._count_at = -1
        self._text = ""

    def text(self) -> str:
        h = self.hist
        total = h.total
        if total != self._count_at:
            lines = [self._head]
            acc = 0
            for prefix, c in zip(self._prefixes, h.counts, strict=True):
                acc += c
                lines.append(f"{prefix}{floatToGoString(acc)}\n")
            count, sum_ = self._tail
            lines.append(f"{count}{floatToGoString(total)}\n")
            lines.append(f"{sum_}{floatToGoString(h.sum)}\n")
            lines.append(self._created)
            self._text = "".join(lines)
            self._count_at = total
        return self._text
