"""The coordinator's state and its two entry points: ``accept`` (a report
arrived) and ``tick`` (run the detectors). Both take the time as arguments; the
daemon (``daemon.py``) is what reads the clock. What follows a tick's findings
is its ``subsystems``, in order, behind one protocol (``subsystem.py``).

The view is immutable and swapped under a lock, so ``tick`` runs the detectors
on the view it read without blocking reports.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CollectorRegistry

from .. import logs
from ..contracts.finding import BLAMELESS_KINDS, Finding
from ..contracts.journal import Record
from ..contracts.journal.findings import ExpectedFindingRecord, FindingRecord
from ..contracts.journal.lifecycle import CoordinatorStalledRecord
from ..contracts.journal.ranks import HostBackRecord, HostLostRecord, HostSeenRecord, LauncherExitedRecord, StateRecord
from ..report import HostReport
from ..stepstats import stats
from .analysis import health
from .config import Config
from .control import fingerprint
from .control import replay as recover
from .control.loop import JobController
from .control.steering import Steering
from .detectors import build, tracker
from .detectors.dead_rank import DeadRank
from .detectors.runner import DetectorRun, Runner
from .evidence import stack_gather
from .evidence.collect import Collector
from .evidence.command_log import CommandLog
from .evidence.dispatch import Dispatch, DispatchConfig
from .exports import DetectorHealth, Gauges, Resolutions
from .intake import status
from .intake.backpressure import Backpressure
from .intake.coordinator_protocol import WrongJob
from .journal import event_names as je
from .journal.jsonl import Journal, iter_records
from .metrics import CoordinatorMetrics
from .own_stall import StallGuard
from .performance import cadence, goodput
from .performance.reporting import Performance
from .performance.verdict import Verdict
from .subsystem import Out, Subsystem, Tick
from .view import columns, unjudged
from .view.cluster import ClusterView, Folder, LauncherExit, empty


@dataclass(frozen=True)
class TickResult:
    opened: tuple[Finding, ...]
    resolved: tuple[tracker.Resolved, ...]
    outcomes: tuple[DetectorRun, ...]


class Coordinator:
    def __init__(
        self,
        cfg: Config,
        journal: Journal,
        registry: CollectorRegistry | None = None,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        """``wall_clock``: the daemon's (``time.time``), to see how old reports are on
        arrival (back-pressure); in-process tests on virtual time leave it out."""
        self.cfg = cfg
        self._wall_clock = wall_clock
        self.journal = journal
        self.registry = registry if registry is not None else CollectorRegistry()
        self.goodput = goodput.Ledger()
        pace = cadence.Cadence(cfg.performance_ranks_per_tick)
        # The ledger's steps name the ranks that stall now and then (intermittent_stalls.py); the
        # straggler's rescoring keeps off the verdict's turn; dead_rank says which deaths it waits on.
        self._dead_rank = DeadRank(cfg.detectors)
        self.detectors = build(cfg.detectors, self.goodput.stalls, pace.upcoming, self._dead_rank)
        self.metrics = CoordinatorMetrics(self.registry, tuple(d.name for d in self.detectors))
        self.runner = Runner(self.detectors)
        self.log = logs.get("watchdog.coordinator")
        self.out = Out(journal, self.metrics.journal_errors, self.log)
        self._lock = threading.Lock()
        self._folder = Folder(empty(cfg.job, cfg.world_size))  # reports fold in place; views are snapshots
        self._unjudged = unjudged.Unjudged()  # replaced deaths shown until a tick judged them; under _lock
        self._judge_failed = logs.RateLimited(every_s=600.0)
        self.backpressure = Backpressure(self.metrics)
        self._active: dict[tracker.Key, tracker.Active] = {}
        self._lost: set[str] = set()
        self._mismatch = logs.RateLimited(every_s=600.0)
        self.dispatch = Dispatch(cfg.token, DispatchConfig(give_up_s=cfg.commands_give_up_s))
        self.stacks = stack_gather.StackGather(wait_s=cfg.commands_give_up_s + 30.0)
        self.control = JobController(cfg.policy)
        # After the coordinator itself was stopped, the hosts' silence is ours: hold detection (own_stall.py).
        self.stall_guard = StallGuard(cfg.detectors)
        if cfg.job:
            self.metrics.info.labels(cfg.job).set(1)
        self.metrics.ranks_expected.set(cfg.world_size)
        self.evidence = Collector(cfg, self.dispatch, self.stacks, self.out)
        self.steering = Steering(self.control, self.dispatch, self.stacks, self.metrics, self.out, self._lock)
        self.commands = CommandLog(
            self.dispatch,
            self.stacks,
            self.metrics,
            self.out,
            self.control.note,
            lambda trigger, rec: self.control.stacks(trigger, fingerprint.culprit_frames(rec)),
        )
        self.performance = Performance(
            cfg,
            self.goodput,
            pace,
            self.control,
            self.backpressure,
            lambda: self._folder.world_size,
            self.metrics,
            self.out,
        )
        # In tick order: their journal lines follow each other in this order within a tick.
        self.subsystems: tuple[Subsystem, ...] = (
            self.evidence,  # after the finding lines: evidence follows, never delays them
            self.steering,
            self.commands,
            Resolutions(self.metrics, self.out),
            DetectorHealth(self.metrics),
            Gauges(cfg.detectors, self.metrics),
            self.performance,
        )

    @property
    def view(self) -> ClusterView:
        return self.view_at(time.monotonic())  # noqa: TID251 - for callers outside a tick; ticks use view_at(now)

    def view_at(self, now: float) -> ClusterView:
        """The view as of ``now``: a snapshot of the folded reports, with the
        coordinator's own lag (back-pressure) for the silence limits."""
        with self._lock:
            view = self._folder.snapshot()
            if self._unjudged:
                view = self._unjudged.overlay(view)
        behind = self.backpressure.behind(now)
        if view.hosts:
            interval = stats.median([hv.interval_s for hv in view.hosts.values()])
            # Hosts not heard from yet count too: under load their first report is still queued.
            hosts = len(view.hosts)
            if view.ranks and view.world_size > len(view.ranks):
                hosts = max(hosts, -(-view.world_size * hosts // len(view.ranks)))
            behind = max(behind, self.backpressure.deficit(now, hosts, interval))
        advised = self.backpressure.advised_in_effect(now)
        if behind <= 0 and advised <= 0:
            return view
        # The same ranks: the snapshot's columns are this view's too.
        return columns.attach(replace(view, behind_s=behind, advised_interval_s=advised), columns.cached(view))

    @property
    def active(self) -> dict[tracker.Key, tracker.Active]:
        return dict(self._active)

    # -- start on an existing journal -----------------------------------------------

    def recover(self, now: float, wall: float) -> recover.Recovered:
        """Rebuild the restart budget, cooldown, open findings and the action in
        flight from this job's journal (control/replay.py), before the first report or tick.
        A journal that cannot be read is a fresh start, said loudly."""
        ignored: list[int] = []
        try:
            records = iter_records(self.journal.path, self.cfg.token, ignored)
            rec = recover.replay(records, now, wall, self.cfg.job, self.cfg.policy, self.cfg.run_id)
        except (OSError, ValueError) as exc:
            self.log.error("recover_failed", journal=self.journal.path, error=str(exc))
            return recover.Recovered()
        if ignored:
            self.log.error(
                "journal_lines_ignored",
                journal=self.journal.path,
                lines=len(ignored),
                first=ignored[:8],
                detail="lines without a valid MAC for this job's token (appended by someone without the token, "
                "or written with another token) were not replayed",
            )
        if rec.empty:
            return rec
        with self._lock:
            self._active = dict(rec.active)
            self.steering.spent = rec.spent
        self.control.restore(rec, now)
        self.metrics.set_job_state(self.control.state)
        for outcome in rec.interrupted:
            self.log.warning(je.ACTION_OUTCOME, **outcome.payload())
            self._record(outcome)
        summary = rec.record(now)
        self.log.warning(je.RECOVERED, **summary.payload())
        self._record(summary)
        return rec

    # -- reports ---------------------------------------------------------------

    def accept(self, report: HostReport, now: float) -> dict[str, Any]:
        with self._lock:
            view = self._folder
            if not view.job:
                view.set_job(report.job)
                self.metrics.info.labels(report.job).set(1)
                self.log.info("job_adopted", job=report.job, host=report.host)
            elif report.job != view.job:
                raise WrongJob(f"this coordinator serves job {view.job!r}, report is for {report.job!r}")
            if view.world_size_fixed and any(r.world_size != view.world_size for r in report.ranks):
                first, suppressed = self._mismatch.should_log(report.host, now)
                if first:  # elastic jobs resize; say so, but keep the configured expectation
                    self.log.warning(
                        "world_size_mismatch",
                        host=report.host,
                        expected=view.world_size,
                        reported=sorted({r.world_size for r in report.ranks}),
                        suppressed=suppressed,
                    )
            tally = view.step_summaries
            used, computed = tally
            events = view.fold(report, now, self.cfg.detectors)
            replaced = view.take_replaced()
            if replaced:
                self._unjudged.hold(replaced, now)
            if tally[0] != used:
                self.metrics.step_summaries.labels("used").inc(tally[0] - used)
            if tally[1] != computed:
                self.metrics.step_summaries.labels("computed").inc(tally[1] - computed)
            if self._wall_clock is not None:
                self.backpressure.note_delay(report.host, self._wall_clock() - report.sent_wall, now)
            for rec in events:
                name, payload = rec.event, rec.payload()
                if (
                    isinstance(rec, StateRecord)
                    and rec.changed
                    and rec.changed.get("alive") == [True, False]
                    and rec.rank is not None
                    and rec.pid is not None
                ):
                    self._unjudged.died(rec.rank, rec.pid, now)
                if isinstance(rec, HostSeenRecord) and not rec.agent_restarted:
                    self.metrics.host_culprits.seen(view.job, report.host)  # at 0 from the start
                self.log.info(name, **payload)
                self._record(rec)
                self.steering.fold(name, payload, now)
        self.metrics.received.inc()
        # Outside the lock: evidence lines can be large. Fsync'd with the next tick's
        # records, not here on the request loop (journal.py: group commit).
        done = self.dispatch.acked(report.host, report.acks, now) if report.acks else []
        outgoing, sent = self.dispatch.outgoing(report.job, report.host, report.sent_wall, report.interval_s, now)
        with self.journal.deferred():
            self.commands.events(done + sent)
        return {"ok": True, "commands": outgoing}

    def launcher_exited(self, job: str, host: str, pid: int, status: int, now: float) -> None:
        """A host's launcher (under ``watchdog run``) says it exited: evidence about that
        host's ranks while its agent is silent (analysis/silence.py). Journaled once per call."""
        with self._lock:
            if self._folder.job and job != self._folder.job:
                raise WrongJob(f"this coordinator serves job {self._folder.job!r}, the exit is for {job!r}")
            self._folder.launcher_exited(host, LauncherExit(pid=pid, status=status, at=now))
        rec = LauncherExitedRecord(host=host, pid=pid, status=status)
        (self.log.info if status == 0 else self.log.warning)(je.LAUNCHER_EXITED, **rec.payload())
        self._record(rec)

    # -- tick ------------------------------------------------------------------

    def tick(self, now: float, wall: float) -> TickResult:
        view = self.view_at(now)
        if self.stall_guard.holding(now, view):  # every host looks silent for as long as we were stopped
            return TickResult((), (), ())
        self._hosts(view, now)
        outcomes = self.runner.run(now, view)
        self._judged(view, now, outcomes)
        findings = [
            replace(f, onset_wall=wall - (now - f.onset_mono), detected_wall=wall) for o in outcomes for f in o.findings
        ]
        # Before any agent reported (a coordinator just restarted on its journal), no
        # detector saw anything: the open findings it recovered are not resolved by that.
        ran = [o.name for o in outcomes if o.ok] if view.hosts else []
        self._active, opened, resolved = tracker.update(self._active, findings, now, ran, self.cfg.resolve_grace_s)
        faults = []
        for f in opened:
            caused = self.control.caused_by(f, now, view)
            if caused:  # the workers an action stopped, found dead: its effect, not a fault
                self.log.info(je.EXPECTED_FINDING, kind=f.kind, ranks=list(f.ranks), caused_by_action=caused)
                self._record(ExpectedFindingRecord.from_dict({**f.to_dict(), "caused_by_action": caused}))
                continue
            faults.append(f)
            self.metrics.findings.labels(f.kind).inc()
            for host in () if f.kind in BLAMELESS_KINDS else f.hosts:  # culprit hosts only
                self.metrics.host_culprits.inc(view.job, host, f.kind)
            self.log.warning(je.FINDING, kind=f.kind, ranks=list(f.ranks), hosts=list(f.hosts), reason=f.reason)
            self._record(FindingRecord.from_dict(f.to_dict()))
        done = Tick(
            now,
            wall,
            view,
            tuple(outcomes),
            frozenset(f.key for f in findings),
            tuple(faults),
            tuple(resolved),
            self._active,
            frozenset(self._lost),
        )
        for sub in self.subsystems:
            sub.on_tick(done)
        return TickResult(tuple(opened), tuple(resolved), tuple(outcomes))

    def _judged(self, view: ClusterView, now: float, outcomes: list[DetectorRun]) -> None:
        """The replaced deaths ``view`` showed are judged once its dead_rank check ran and
        waited for none of its deaths (view/unjudged.py)."""
        with self._lock:
            if not self._unjudged:
                return
        dead = self._dead_rank
        ran = any(o.name == DeadRank.name and o.ok for o in outcomes)
        try:
            judged = ran and not dead.waiting(now, view)
        except Exception:  # noqa: BLE001 - as the detector's own check: never raised into the tick
            first, suppressed = self._judge_failed.should_log("waiting", now)
            if first:
                self.log.error("dead_rank_waiting_failed", suppressed=suppressed, exc_info=True)
            judged = False  # held on: HOLD_MAX_S bounds it
        with self._lock:
            self._unjudged.release(view, now, judged)

    def stalled(self, now: float, gap_s: float, wall: float) -> None:
        """The daemon's loop was not running for ``gap_s`` until ``now`` (``wall``): hold detection (own_stall.py)."""
        stall = self.stall_guard.begin(now, gap_s, self.view_at(now), wall)
        rec = CoordinatorStalledRecord(
            gap_s=round(gap_s, 3), hold_max_s=round(stall.limit_s, 3), hosts=sorted(stall.seqs)
        )
        self.log.warning(je.COORDINATOR_STALLED, **rec.payload())
        self._record(rec)

    def _hosts(self, view: ClusterView, now: float) -> None:
        """Journal host loss and return as state changes (the finding is dead_rank's)."""
        lost_now = health.lost_hosts(view, now, self.cfg.detectors)
        for host, hv in view.hosts.items():
            lost = host in lost_now
            if lost and host not in self._lost:
                self._lost.add(host)
                self.log.warning(je.HOST_LOST, host=host, silent_s=round(now - hv.received_at, 3))
                self._record(HostLostRecord(host=host, agent_id=hv.agent_id, silent_s=round(now - hv.received_at, 3)))
            elif not lost and host in self._lost:
                self._lost.discard(host)
                self.log.info(je.HOST_BACK, host=host)
                self._record(HostBackRecord(host=host, agent_id=hv.agent_id))

    # -- status ----------------------------------------------------------------

    def status(self, now: float, wall: float) -> dict[str, Any]:
        doc = status.build(self.view_at(now), self._active, now, wall, self.cfg)
        # Added fields: the bottleneck with its evidence, and goodput so far.
        v = self.performance.verdict
        doc["bottleneck"] = {
            "verdict": v.verdict,
            "reason": v.reason,
            "since_s": round(now - v.since, 3) if v.since else None,
            "evidence": v.evidence,
        }
        g = self.goodput.summary()
        doc["goodput"] = {**g, "summary": goodput.summary_line(g)}
        for f in doc["findings"]:  # added field: where every rank's stack put the ranks, once known
            line = self.commands.stack_summary.get((f["kind"], tuple(f["ranks"])))
            if line:
                f["stacks"] = line
        return doc

    # -- journal ---------------------------------------------------------------

    def _record(self, event: str | Record, payload: dict[str, Any] | None = None) -> None:
        self.out.record(event, payload)

    @property
    def verdict(self) -> Verdict:
        return self.performance.verdict

    def goodput_record(self, final: bool) -> dict[str, Any]:
        """The journal's goodput record: the ledger so far, and the verdict."""
        return self.performance.goodput_record(final)
