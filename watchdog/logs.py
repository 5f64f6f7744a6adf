"""structlog set-up for the daemons (agent, coordinator): one event per line on
stderr, as JSON (default) or logfmt (``--log.format``), filtered by ``--log.level``.

Only daemons call ``configure``; the in-rank hook never touches logging config
(it logs on the stdlib ``watchdog.hook`` logger and leaves handlers to the user).
Log state changes, not ticks.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import structlog

from watchdog.flags import Flag

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("json", "logfmt")


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def convert(text: str) -> str:
        low = text.strip().lower()
        if low not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return low

    return convert


parse_level = _choice(LEVELS)
parse_format = _choice(FORMATS)


def level_flag() -> Flag:
    return Flag("log.level", "info", f"one of {', '.join(LEVELS)}", parse_level, field="log_level")


def format_flag() -> Flag:
    return Flag("log.format", "json", f"log line format: {' or '.join(FORMATS)}", parse_format, field="log_format")


def _renderer(fmt: str) -> structlog.typing.Processor:
    if fmt == "logfmt":
        return structlog.processors.LogfmtRenderer(
            key_order=["timestamp", "level", "event"], drop_missing=True, bool_as_flag=False
        )
    return structlog.processors.JSONRenderer(sort_keys=False)


def configure(level: str = "info", fmt: str = "json") -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _renderer(parse_format(fmt)),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get(name: str) -> Any:
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
