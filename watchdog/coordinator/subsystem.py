"""What runs on each tick after detection, behind one protocol: ``on_tick(tick)``.

The coordinator folds reports into the view, runs the detectors and tracks their
findings itself; everything that follows a tick's findings (evidence, the policy's
actions, commands, the findings' ends, gauges, performance) is a subsystem, made
with what it needs at construction and listed in tick order in
``Coordinator.subsystems``, as the detectors are in ``DETECTORS``. Each journals
and logs through the ``Out`` it was given; the order of the list is the order of
their journal lines within a tick.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import Counter

from .. import logs
from ..contracts.finding import Finding
from ..contracts.journal import Record
from .detectors import tracker
from .detectors.runner import DetectorRun
from .journal.jsonl import Journal
from .view.cluster import ClusterView


@dataclass(frozen=True)
class Tick:
    now: float
    wall: float
    view: ClusterView
    runs: tuple[DetectorRun, ...]  # each detector's run on this tick
    seen: frozenset[tracker.Key]  # the findings reported on this tick
    faults: tuple[Finding, ...]  # opened on this tick and not the effect of an action of ours
    resolved: tuple[tracker.Resolved, ...]
    active: Mapping[tracker.Key, tracker.Active]  # the findings open after this tick
    lost: frozenset[str]  # the hosts lost


class Subsystem(Protocol):
    def on_tick(self, tick: Tick) -> None: ...


class Out:
    """The coordinator's journal and its log, as every subsystem writes them."""

    def __init__(self, journal: Journal, errors: Counter, log: Any) -> None:
        self.journal = journal
        self.log = log
        self._errors = errors
        self._failed = logs.RateLimited(every_s=60.0)

    def record(self, event: str | Record, payload: dict[str, Any] | None = None) -> None:
        """Journals a typed record, or an event name and its payload (the events the
        view, dispatch and actions hand the tick)."""
        try:
            self.journal.write(event, payload)
        except OSError as exc:  # a full disk must not stop detection; count it, log it rarely
            self._errors.inc()
            # the clock only spaces an error log line out; no decision reads it
            first, suppressed = self._failed.should_log("journal", time.monotonic())  # noqa: TID251
            if first:
                self.log.error("journal_write_failed", path=self.journal.path, error=str(exc), suppressed=suppressed)
