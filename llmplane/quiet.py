"""One warning for a failure that repeats, instead of a traceback every time a loop retries.

Loops that retry on their own (the controller writing status, the autoscaler, the process
record of engines) meet failures that last for a while and are not bugs: a full disk, a store
another process holds locked. Each such failure is worth one line when it starts, one when it
ends, and silence in between.
"""

from __future__ import annotations

import logging


class QuietRetries:
    """For a loop that retries on its own: the first failure is one warning line (no traceback),
    the same failure again is silent, and the first success after it says so once."""

    def __init__(self, logger: logging.Logger, what: str):
        self.logger = logger
        self.what = what
        self.failing: str | None = None

    def failed(self, error: Exception) -> None:
        message = str(error)
        if message != self.failing:
            self.logger.warning("%s: %s; retrying quietly until that changes", self.what, message)
            self.failing = message

    def succeeded(self) -> None:
        if self.failing is not None:
            self.logger.warning("%s works again", self.what)
            self.failing = None
