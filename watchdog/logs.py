"""structlog set-up for the daemons (agent, coordinator): JSON lines on stderr.

Only daemons call ``configure``; the in-rank hook never touches logging config
(it logs on the stdlib ``watchdog.hook`` logger and leaves handlers to the user).
Log state changes, not ticks.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "info") -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get(name: str):
    return structlog.get_logger(name)


class RateLimited:
    """Log a recurring problem once, then at most once per ``every_s`` with a count
    of what was suppressed, so a bad input stream cannot flood the log."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def should_log(self, key: str, now: float) -> tuple[bool, int]:
        last = self._last.get(key)
        if last is not None and now - last < self.every_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False, 0
        self._last[key] = now
        return True, self._suppressed.pop(key, 0)
