"""A token source for the precise-prefix scorer, answering for the sim only."""

from __future__ import annotations

from llmplane.gateway.scheduler.framework import SchedulingContext


class Tokens:
    """A token source answering for one engine kind (the protocol the scorer reads)."""

    def __init__(self, ids: list[int] | None) -> None:
        self.ids = ids

    def token_ids(self, ctx: SchedulingContext, engine: str) -> list[int] | None:
        return self.ids if engine == "sim" else None
