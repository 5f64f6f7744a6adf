"""The one polling helper for tests that wait on real processes or threads."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | None],
    timeout_s: float = 10.0,
    what: str = "condition",
    interval_s: float = 0.05,
    log: Path | None = None,
) -> T:
    """Call ``predicate`` every ``interval_s`` until it returns something truthy,
    and return that (never None). On timeout, fail with ``what``, the last value and the tail
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


def coordinator_counts(url: str) -> tuple[float, float]:
    """(host reports accepted, ticks run) from a coordinator's /metrics at ``url``."""
    import urllib.request

    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=5.0) as resp:
        text = resp.read().decode("utf-8", "replace")
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("watchdog_coordinator_reports_received_total", "watchdog_coordinator_tick_duration_seconds_count"):
            values[name] = float(value)
    return (
        values.get("watchdog_coordinator_reports_received_total", 0.0),
        values.get("watchdog_coordinator_tick_duration_seconds_count", 0.0),
    )


def wait_coordinator(url: str, reports: int, ticks: int = 2, timeout_s: float = 60.0, log: Path | None = None) -> None:
    """Until the coordinator at ``url`` accepted ``reports`` more host reports and then ran ``ticks``
    more ticks on them: "nothing more happened" after that many reports, however slowly a loaded
    machine delivers them (a fixed sleep says nothing when the reports come late)."""
    start_reports, _ = coordinator_counts(url)
    wait_for(
        lambda: coordinator_counts(url)[0] >= start_reports + reports,
        timeout_s,
        f"{reports} more reports at the coordinator",
        interval_s=0.1,
        log=log,
    )
    _, start_ticks = coordinator_counts(url)
    wait_for(
        lambda: coordinator_counts(url)[1] >= start_ticks + ticks,
        timeout_s,
        f"{ticks} more coordinator ticks",
        interval_s=0.1,
        log=log,
    )
