"""``llmplane up``'s live status on the terminal.

On a terminal: while a model downloads or a replica is not ready yet, a live panel shows each
OpenModel's progress and each workload's replicas by phase; once all is ready it folds into one
status line (workloads, replicas ready, requests per second, TTFT, in flight). Without a
terminal (a pipe, CI, systemd) nothing is redrawn: one plain line per change (a model's load
progress in 10 % steps, a replica changing phase, a workload becoming ready) and a status line
a minute while requests are being served.

The picture is ``llmplane.console.fleet.snapshot``, the one the web console's Fleet page shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from llmplane.console.fleet import snapshot

REFRESH = 0.5  # seconds between looks on a terminal
PLAIN_REFRESH = 1.0
STATUS_EVERY = 60.0  # seconds between plain status lines while traffic flows
_PERCENT = re.compile(r"(\d+)%")


def _stats(gateway: Any) -> Any:
    for extension in getattr(gateway, "extensions", ()):
        stats = getattr(extension, "stats", None)
        if stats is not None:
            return stats
    return None


def traffic(gateway: Any, seconds: int = 10) -> tuple[float, float | None, int]:
    """(requests per second, TTFT p50 in ms, requests in flight) over the last seconds."""
    inflight = sum(s.inflight for s in gateway.view().endpoints)
    stats = _stats(gateway)
    if stats is None or not stats.points:
        return 0.0, None, inflight
    recent = list(stats.points)[-seconds:]
    rate = sum(p.requests for p in recent) / len(recent)
    ttft = recent[-1].ttft[0]
    return rate, None if ttft is None else ttft * 1000, inflight


def status_line(fleet: dict[str, Any], gateway: Any) -> str:
    workloads = fleet["workloads"]
    ready = sum(w["ready"] for w in workloads)
    desired = sum(w["desired"] for w in workloads)
    rate, ttft, inflight = traffic(gateway)
    parts = [
        f"{len(workloads)} workload{'s' if len(workloads) != 1 else ''}",
        f"{ready}/{desired} replicas ready",
        f"{rate:.1f} req/s",
    ]
    if ttft is not None:
        parts.append(f"TTFT p50 {ttft:.0f} ms")
    parts.append(f"{inflight} in flight")
    return " · ".join(parts)


def settled(fleet: dict[str, Any]) -> bool:
    """Every model loaded and every workload at its desired ready count."""
    return all(
        m["status"] == "True" for m in fleet["models"] if m["reason"] != "NotClaimed"
    ) and all(w["ready"] >= w["desired"] for w in fleet["workloads"])


def _phase_counts(w: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for r in w["replicas"]:
        counts[r["phase"]] = counts.get(r["phase"], 0) + 1
    return ", ".join(f"{n} {phase}" for phase, n in sorted(counts.items())) or "no replicas yet"


def panel(fleet: dict[str, Any], gateway: Any) -> Group:
    """The terminal's live view while things are starting."""
    rows: list[Any] = []
    models = [m for m in fleet["models"] if m["reason"] not in ("NotClaimed", "Loaded")]
    if models:
        table = Table(box=None, show_header=False, pad_edge=False)
        for m in models:
            match = _PERCENT.search(m["message"])
            done = int(match.group(1)) if match else None
            bar = Text("")
            if done is not None:
                filled = done * 24 // 100
                bar = Text("█" * filled, style="green") + Text("░" * (24 - filled), style="dim")
            style = "yellow" if m["reason"] == "Loading" else "red"
            table.add_row(
                Text(f"model {m['name']}", style="bold"),
                bar,
                Text(m["message"] or m["reason"], style=style),
            )
        rows.append(table)
    table = Table(box=None, show_header=False, pad_edge=False)
    for w in fleet["workloads"]:
        ok = w["ready"] >= w["desired"]
        worst = next((r for r in w["replicas"] if r["phase"] != "Ready"), None)
        detail = ""
        if worst is not None and (worst["reason"] or worst["message"]):
            detail = f"replica {worst['index']}: {worst['reason'] or worst['phase']}"
        table.add_row(
            Text(f"{w['kind'].lower()} {w['namespace']}/{w['name']}", style="bold"),
            Text(f"{w['ready']}/{w['desired']} ready", style="green" if ok else "yellow"),
            Text(_phase_counts(w), style="dim"),
            Text(detail, style="yellow"),
        )
    rows.append(table)
    rows.append(Text(status_line(fleet, gateway), style="cyan"))
    return Group(*rows)


class UpStatus:
    """Watches the platform and tells the terminal (see the module docstring)."""

    def __init__(self, platform: Any, console: Console, interactive: bool | None = None) -> None:
        self.platform = platform
        self.console = console
        self.interactive = console.is_terminal if interactive is None else interactive
        self._seen: dict[str, Any] = {}
        self._last_status = 0.0
        self._last_requests = 0.0

    def fleet(self) -> dict[str, Any]:
        p = self.platform
        view = p.gateway.view() if p.gateway is not None else None
        return snapshot(p.store, p.runtime, view, events=False)

    async def run(self) -> None:
        if self.interactive:
            await self._live()
        else:
            while True:
                with contextlib.suppress(Exception):  # a status line never stops ``up``
                    self.changes(self.fleet())
                await asyncio.sleep(PLAIN_REFRESH)

    async def _live(self) -> None:
        with Live(Text(""), console=self.console, refresh_per_second=4, transient=False) as live:
            while True:
                with contextlib.suppress(Exception):
                    fleet = self.fleet()
                    gateway = self.platform.gateway
                    live.update(
                        Text(status_line(fleet, gateway), style="cyan")
                        if settled(fleet)
                        else panel(fleet, gateway)
                    )
                await asyncio.sleep(REFRESH)

    # --- plain lines ------------------------------------------------------------------------

    def _say(self, key: str, value: Any, line: str) -> None:
        if self._seen.get(key) != value:
            self._seen[key] = value
            self.console.print(line, markup=False, highlight=False)

    def changes(self, fleet: dict[str, Any]) -> None:
        """Print a line for each change since the last look."""
        for m in fleet["models"]:
            if not m["reason"]:
                continue  # not reconciled yet
            match = _PERCENT.search(m["message"])
            step = int(match.group(1)) // 10 if match else None
            self._say(
                f"model/{m['name']}",
                (m["reason"], step),
                f"model {m['name']}: {m['reason']}: {m['message']}".rstrip(": "),
            )
        for w in fleet["workloads"]:
            name = f"{w['kind'].lower()} {w['namespace']}/{w['name']}"
            for r in w["replicas"]:
                why = f" ({r['reason']}: {r['message']})" if r["reason"] else ""
                self._say(
                    f"{name}/{r['index']}",
                    (r["phase"], r["reason"], r["restarts"]),
                    f"{name} replica {r['index']}: {r['phase']}{why}",
                )
            self._say(
                f"{name}/ready",
                (w["ready"], w["desired"]),
                f"{name}: {w['ready']}/{w['desired']} replicas ready",
            )
        gateway = self.platform.gateway
        now = time.monotonic()
        requests = sum(gateway.view().requests.values())
        if requests != self._last_requests and now - self._last_status >= STATUS_EVERY:
            self._last_status, self._last_requests = now, requests
            self.console.print(status_line(fleet, gateway), markup=False, highlight=False)
