"""The one polling helper for tests that wait on real processes or threads."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout_s: float = 10.0,
    what: str = "condition",
    interval_s: float = 0.05,
    log: Path | None = None,
) -> T:
    """Call ``predicate`` every ``interval_s`` until it returns something truthy,
    and return that. On timeout, fail with ``what``, the last value and the tail
    of ``log`` (a daemon's log says why it never got there)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last value {last!r}\n{tail}".rstrip())
