"""The job's performance on each tick: the bottleneck verdict on its cadence and
the goodput ledger, exported and journaled. A subsystem of the coordinator's tick
(``subsystem.py``): never a finding and never in the way of detection, a bug here
is logged rarely and the tick goes on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import logs
from ...contracts.journal.performance import GoodputRecord, VerdictRecord
from ..config import Config
from ..control.loop import JobController
from ..intake.backpressure import Backpressure
from ..journal import event_names as je
from ..metrics import CoordinatorMetrics
from ..subsystem import Out, Tick
from ..view.cluster import ClusterView
from ..vocabularies import SPLIT_CLOCKS, VERDICTS, JobState
from . import cadence, goodput, verdict

GOODPUT_EVERY_S = 60.0  # a goodput record in the journal this often (and one at stop)


class Performance:
    def __init__(
        self,
        cfg: Config,
        ledger: goodput.Ledger,
        pace: cadence.Cadence,
        control: JobController,
        backpressure: Backpressure,
        world_size: Callable[[], int],
        metrics: CoordinatorMetrics,
        out: Out,
    ) -> None:
        """``world_size``: the folded view's, for the goodput record."""
        self.cfg = cfg
        self.goodput = ledger
        self._cadence = pace
        self.control = control
        self.backpressure = backpressure
        self._world_size = world_size
        self.metrics = metrics
        self.out = out
        self.verdict = verdict.Verdict()
        self._summaries = verdict.Summaries()  # per-rank step summaries, refreshed within a budget per tick
        self._goodput_exported = dict.fromkeys(goodput.CATEGORIES, 0.0)
        self._goodput_journaled_at: float | None = None
        self._failed = logs.RateLimited(every_s=600.0)

    def on_tick(self, tick: Tick) -> None:
        # The verdict's turn waits for a tick on which no finding opened (evidence and hang
        # analysis): at 16,384 ranks each costs ~0.1 s, and together they were the tick's p99.
        view, now = tick.view, tick.now
        verdict_due = self._cadence.due(len(view.ranks), busy=bool(tick.faults))
        try:
            if verdict_due:
                self._verdict(view, now)
            self._goodput(view, now)
        except Exception as exc:  # performance reporting must never stop detection
            first, suppressed = self._failed.should_log(type(exc).__name__, now)
            if first:
                self.out.log.error(
                    "performance_failed", error=f"{type(exc).__name__}: {exc}", suppressed=suppressed, exc_info=True
                )

    def _verdict(self, view: ClusterView, now: float) -> None:
        m = verdict.measure(now, view, self.cfg.detectors, self._summaries)
        new = verdict.decide(self.verdict, m, now)
        if new.verdict != self.verdict.verdict:
            self.out.log.info(je.VERDICT, verdict=new.verdict, previous=self.verdict.verdict, reason=new.reason)
            self.out.record(
                VerdictRecord(
                    verdict=new.verdict,
                    previous=self.verdict.verdict,
                    reason=new.reason,
                    shares={k: round(v, 4) for k, v in m.shares.items()},
                    evidence=new.evidence,
                )
            )
        self.verdict = new
        for v in VERDICTS:
            self.metrics.bottleneck.labels(v).set(1 if v == new.verdict else 0)
        for cause, share in m.shares.items():
            self.metrics.bottleneck_share.labels(cause).set(round(share, 4))
        if "clock" in m.evidence:
            for clock in SPLIT_CLOCKS:
                self.metrics.split_clock.labels(clock).set(1 if clock == m.evidence["clock"] else 0)

    def _goodput(self, view: ClusterView, now: float) -> None:
        restarting = self.control.state == JobState.RESTARTING
        self.goodput.tick(now, view, restarting, batched=self.backpressure.steps_batched())
        for cat, secs in self.goodput.seconds.items():
            delta = secs - self._goodput_exported[cat]
            if delta > 0:
                self.metrics.goodput_seconds.labels(cat).inc(delta)
                self._goodput_exported[cat] = secs
        self.metrics.goodput_ratio.set(round(self.goodput.goodput(), 4))
        if self.goodput.started and (
            self._goodput_journaled_at is None or now - self._goodput_journaled_at >= GOODPUT_EVERY_S
        ):
            self._goodput_journaled_at = now
            self.out.record(GoodputRecord(extra=self.goodput_record(final=False)))

    def goodput_record(self, final: bool) -> dict[str, Any]:
        """The journal's goodput record: the ledger so far, and the verdict."""
        rec = self.goodput.summary()
        rec.update(
            final=final,
            summary=goodput.summary_line(rec),
            verdict=self.verdict.verdict,
            verdict_reason=self.verdict.reason,
            verdict_evidence=self.verdict.evidence,
            world_size=self._world_size(),
        )
        return rec
