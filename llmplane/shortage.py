"""llmplane's own shortages: an operation that failed because this process lacked a resource.

Out of descriptors (EMFILE, ENFILE), memory or socket buffers (ENOMEM, ENOBUFS), local ports
(EADDRNOTAVAIL) or processes (EAGAIN), a probe, an engine start or an upstream connect says
nothing about the engine it was meant for: the engine is never blamed for it (no probe failure,
no crash, no outlier ejection). Such a limit, once reached, is reached again and again, so it is
logged once per burst (:class:`ShortageLog`), not per failure.
"""

from __future__ import annotations

import errno
import logging
import time

OWN_SHORTAGES = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EADDRNOTAVAIL, errno.EAGAIN}
)

SHORTAGE_LOG_INTERVAL = 60.0  # seconds: a shortage is logged at most this often


def own_shortage(err: BaseException) -> bool:
    """Whether ``err`` is llmplane's own lack of a resource rather than the other side's fault."""
    return isinstance(err, OSError) and err.errno in OWN_SHORTAGES


class ShortageLog:
    """Logs a shortage once (``short``: ``message`` with its detail), again only if it comes
    back ``interval`` seconds later (a limit reached is reached again and again, with successes
    in between), and once that things work again (``back``: ``recovered``) after a logged one."""

    __slots__ = ("interval", "logged", "logger", "message", "recovered", "short_now")

    def __init__(
        self,
        logger: logging.Logger,
        message: str,
        recovered: str,
        interval: float = SHORTAGE_LOG_INTERVAL,
    ) -> None:
        self.logger = logger
        self.message = message  # one ``%s``: what failed
        self.recovered = recovered
        self.interval = interval
        self.logged: float | None = None
        self.short_now = False  # a shortage was logged and nothing succeeded since

    def short(self, detail: str) -> None:
        now = time.monotonic()
        if self.logged is None or now - self.logged >= self.interval:
            self.logged = now
            self.short_now = True
            self.logger.error(self.message, detail)

    def back(self) -> None:
        if self.short_now:
            self.short_now = False
            self.logger.warning(self.recovered)
