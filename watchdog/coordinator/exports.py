"""Subsystems of the coordinator's tick (``subsystem.py``) that say what it saw:
the findings that ended, each detector's run, and the job's gauges."""

from __future__ import annotations

from dataclasses import dataclass

from ..contracts.finding import KINDS
from ..contracts.journal.findings import ResolvedRecord
from .analysis import health
from .config import DetectorConfig
from .journal import event_names as je
from .metrics import CoordinatorMetrics
from .subsystem import Out, Tick


@dataclass(frozen=True)
class Resolutions:
    """Each finding that ended: counted, logged and journaled."""

    metrics: CoordinatorMetrics
    out: Out

    def on_tick(self, tick: Tick) -> None:
        for r in tick.resolved:
            self.metrics.resolved.labels(r.finding.kind).inc()
            self.out.log.info(
                je.RESOLVED, kind=r.finding.kind, ranks=list(r.finding.ranks), duration_s=round(r.duration_s, 3)
            )
            self.out.record(
                ResolvedRecord(
                    kind=r.finding.kind,
                    ranks=list(r.finding.ranks),
                    hosts=list(r.finding.hosts),
                    duration_s=round(r.duration_s, 3),
                    reason=r.finding.reason,
                    opened_wall=r.opened.detected_wall,
                )
            )


@dataclass(frozen=True)
class DetectorHealth:
    """Each detector's run: success, duration, errors."""

    metrics: CoordinatorMetrics

    def on_tick(self, tick: Tick) -> None:
        for o in tick.runs:
            self.metrics.det_success.labels(o.name).set(1 if o.ok else 0)
            self.metrics.det_duration.labels(o.name).set(o.duration_s)
            if not o.ok:
                self.metrics.det_errors.labels(o.name).inc()


@dataclass(frozen=True)
class Gauges:
    """The ranks and hosts by state, the open findings by kind, and what the
    detectors computed for their gauges under the runner's isolation."""

    cfg: DetectorConfig
    metrics: CoordinatorMetrics

    def on_tick(self, tick: Tick) -> None:
        m, cfg, view, now = self.metrics, self.cfg, tick.view, tick.now
        hl = health.classify_all(view, now, cfg)
        states = list(hl.values())  # C-level counts, not a generator over 16,384 ranks
        m.ranks_expected.set(health.expected_world(view, now, cfg))
        m.ranks_registered.set(len(states) - states.count(health.RETIRED))
        m.ranks_alive.set(states.count(health.OK) + states.count(health.FROZEN))
        unseen = len(health.unobserved_hosts(view, now, cfg))
        m.hosts.labels("reporting").set(len(view.hosts) - len(tick.lost) - unseen)
        m.hosts.labels("unobserved").set(unseen)
        m.hosts.labels("lost").set(len(tick.lost))
        counts = dict.fromkeys(KINDS, 0)
        for kind, _ in tick.active:
            counts[kind] = counts.get(kind, 0) + 1
        for kind, n in counts.items():
            m.active.labels(kind).set(n)
        for o in tick.runs:  # computed by each detector under the runner's isolation (a failed one has none)
            m.set_detector_gauges(o.gauges)
