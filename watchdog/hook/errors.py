"""Logging of errors the hook swallowed: once per place, then rarely.

A bug in a hooked path can fire every step; logging each one would flood the
user's logs (and cost more than the step). The first error from each place is
logged with its traceback; after that at most one summary line per
``interval_s``. The logger is ``watchdog.hook``, never configured here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("watchdog.hook")


class ErrorLog:
    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._seen: set[str] = set()
        self._interval_s = interval_s
        self._clock = clock
        self._next_summary = 0.0
        self._suppressed = 0

    def report(self, where: str, exc: BaseException, total: int) -> None:
        if where not in self._seen:
            self._seen.add(where)
            self._next_summary = max(self._next_summary, self._clock() + self._interval_s)
            log.warning(
                "watchdog.hook error where=%s total_errors=%d (swallowed; training continues)",
                where,
                total,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
            return
        now = self._clock()
        self._suppressed += 1
        if now >= self._next_summary:
            self._next_summary = now + self._interval_s
            log.warning(
                "watchdog.hook errors continue where=%s last=%r total_errors=%d suppressed=%d",
                where,
                exc,
                total,
                self._suppressed,
            )
            self._suppressed = 0
