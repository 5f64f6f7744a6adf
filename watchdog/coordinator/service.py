"""The coordinator's state and its two entry points: ``accept`` (a report
arrived) and ``tick`` (run the detectors). Both take the time as arguments; the
daemon (``daemon.py``) is what reads the clock.

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

from .. import commands, logs
from ..contracts.journal import Record
from ..contracts.journal.actions import LauncherRestartRecord
from ..contracts.journal.findings import ExpectedFindingRecord, FindingRecord, ResolvedRecord
from ..contracts.journal.lifecycle import CoordinatorStalledRecord
from ..contracts.journal.performance import VerdictRecord
from ..contracts.journal.ranks import HostBackRecord, HostLostRecord, LauncherExitedRecord
from ..report import HostReport
from . import (
    budget,
    columns,
    evidence_plan,
    fingerprint,
    goodput,
    health,
    perf_cadence,
    recover,
    relaunch,
    stack_gather,
    stack_plan,
    stats,
    status,
    tracker,
    triggers,
    unjudged,
    verdict,
)
from . import journal_events as je
from .actionmetrics import ActionMetrics
from .backpressure import Backpressure
from .config import Config
from .control import JobController
from .detectors import build
from .detectors.collective_hang import CollectiveHang
from .detectors.dead_rank import DeadRank
from .detectors.extra_work import ExtraWork
from .detectors.loader_starvation import LoaderStarvation
from .detectors.periodic_stall import PeriodicStall
from .detectors.straggler import Straggler
from .dispatch import Dispatch, DispatchConfig
from .finding import BLAMELESS_KINDS, KINDS, Finding
from .journal import Journal, iter_records
from .metrics import CoordinatorMetrics
from .policy import JobState
from .runner import Outcome, Runner
from .stall import StallGuard
from .view import ClusterView, Folder, LauncherExit, empty


class WrongJob(Exception):
    """A report for another job (409)."""


@dataclass(frozen=True)
class TickResult:
    opened: tuple[Finding, ...]
    resolved: tuple[tracker.Resolved, ...]
    outcomes: tuple[Outcome, ...]


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
        self.detectors = build(cfg.detectors)
        self.metrics = CoordinatorMetrics(self.registry, tuple(d.name for d in self.detectors))
        self.runner = Runner(self.detectors)
        self._straggler = next((d for d in self.detectors if isinstance(d, Straggler)), None)
        self._dead_rank = next((d for d in self.detectors if isinstance(d, DeadRank)), None)
        self.log = logs.get("watchdog.coordinator")
        self._lock = threading.Lock()
        self._spent = budget.Spent()  # the restarts the launcher made by itself (budget.py); under _lock
        self._relaunch: relaunch.Awaiting | None = None  # the launcher's latest restart, until its group resumed
        self._folder = Folder(empty(cfg.job, cfg.world_size))  # reports fold in place; views are snapshots
        self._unjudged = unjudged.Unjudged()  # replaced deaths shown until a tick judged them; under _lock
        self._judge_failed = logs.RateLimited(every_s=600.0)
        self.backpressure = Backpressure(self.metrics)
        self._active: dict[tracker.Key, tracker.Active] = {}
        self._lost: set[str] = set()
        self._journal_failed = logs.RateLimited(every_s=60.0)
        self._mismatch = logs.RateLimited(every_s=600.0)
        self.dispatch = Dispatch(cfg.token, DispatchConfig(give_up_s=cfg.commands_give_up_s))
        # Unsigned commands only where agents accept them: both sides without a token, on loopback.
        self._commands_ok = bool(cfg.token) or commands.is_loopback(cfg.listen[0])
        self._collected: dict[tracker.Key, float] = {}  # finding key -> when evidence was last requested
        self._context_at: dict[str, float] = {}  # part of the context -> when last asked for (_collect)
        self._no_evidence_logged = False
        self.stacks = stack_gather.StackGather(wait_s=cfg.commands_give_up_s + 30.0)
        self._stack_summary: dict[tuple[str, tuple[int, ...]], str] = {}  # finding key -> its stack groups in a line
        self.control = JobController(cfg.policy)
        self._action_metrics = ActionMetrics(self.metrics)
        self._control_failed = logs.RateLimited(every_s=60.0)
        # After the coordinator itself was stopped, the hosts' silence is ours: hold detection (stall.py).
        self.stall_guard = StallGuard(cfg.detectors)
        if cfg.job:
            self.metrics.info.labels(cfg.job).set(1)
        self.metrics.ranks_expected.set(cfg.world_size)
        self.verdict = verdict.Verdict()
        self._summaries = verdict.Summaries()  # per-rank step summaries, refreshed within a budget per tick
        self.goodput = goodput.Ledger()
        for det in self.detectors:  # the ledger's steps name the ranks that stall now and then (stalls.py)
            if isinstance(det, Straggler | LoaderStarvation | PeriodicStall | CollectiveHang):
                det.stalls = self.goodput.stalls
            if isinstance(det, ExtraWork):  # rank 0's slowness, from the straggler's scores
                det.straggler = self._straggler
        self._goodput_exported = dict.fromkeys(goodput.CATEGORIES, 0.0)
        self._goodput_journaled_at: float | None = None
        self._cadence = perf_cadence.Cadence(cfg.performance_ranks_per_tick)
        self._performance_failed = logs.RateLimited(every_s=600.0)

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
        flight from this job's journal (recover.py), before the first report or tick.
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
            self._spent = rec.spent
        self.control.restore(rec, now)
        self.metrics.set_job_state(self.control.state)
        for outcome in rec.interrupted:
            self.log.warning(je.ACTION_OUTCOME, **outcome)
            self._record(je.ACTION_OUTCOME, outcome)
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
            for name, payload in events:
                if name == je.STATE and payload.get("changed", {}).get("alive") == [True, False]:
                    self._unjudged.died(payload["rank"], payload["pid"], now)
                if name == je.HOST_SEEN and not payload.get("agent_restarted"):
                    self.metrics.host_culprits.seen(view.job, report.host)  # at 0 from the start
                self.log.info(name, **payload)
                self._record(name, payload)
                self._spent = budget.fold(self._spent, name, payload, now)
        self.metrics.received.inc()
        # Outside the lock: evidence lines can be large. Fsync'd with the next tick's
        # records, not here on the request loop (journal.py: group commit).
        done = self.dispatch.acked(report.host, report.acks, now) if report.acks else []
        outgoing, sent = self.dispatch.outgoing(report.job, report.host, report.sent_wall, report.interval_s, now)
        with self.journal.deferred():
            self._command_events(done + sent)
        return {"ok": True, "commands": outgoing}

    def launcher_exited(self, job: str, host: str, pid: int, status: int, now: float) -> None:
        """A host's launcher (under ``watchdog run``) says it exited: evidence about that
        host's ranks while its agent is silent (silence.py). Journaled once per call."""
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
        if self._straggler is not None:
            self._straggler.hold = self._cadence.upcoming(len(view.ranks))
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
        self._collect(faults, view, now)  # after the finding lines: evidence follows, never delays them
        self._act(view, now, {f.key for f in findings})
        self._command_events(self.dispatch.expire(now, lambda h: view.hosts[h].interval_s if h in view.hosts else 1.0))
        self._stack_groups(now)
        for r in resolved:
            self.metrics.resolved.labels(r.finding.kind).inc()
            self.log.info(
                je.RESOLVED, kind=r.finding.kind, ranks=list(r.finding.ranks), duration_s=round(r.duration_s, 3)
            )
            self._record(
                ResolvedRecord(
                    kind=r.finding.kind,
                    ranks=list(r.finding.ranks),
                    hosts=list(r.finding.hosts),
                    duration_s=round(r.duration_s, 3),
                    reason=r.finding.reason,
                    opened_wall=r.opened.detected_wall,
                )
            )
        for o in outcomes:
            self.metrics.det_success.labels(o.name).set(1 if o.ok else 0)
            self.metrics.det_duration.labels(o.name).set(o.duration_s)
            if not o.ok:
                self.metrics.det_errors.labels(o.name).inc()
        self._gauges(view, now, outcomes)
        # The verdict's turn waits for a tick on which no finding opened (evidence and hang
        # analysis): at 16,384 ranks each costs ~0.1 s, and together they were the tick's p99.
        self._performance(view, now, self._cadence.due(len(view.ranks), busy=bool(faults)))
        return TickResult(tuple(opened), tuple(resolved), tuple(outcomes))

    def _judged(self, view: ClusterView, now: float, outcomes: list[Outcome]) -> None:
        """The replaced deaths ``view`` showed are judged once its dead_rank check ran and
        waited for none of its deaths (unjudged.py)."""
        with self._lock:
            if not self._unjudged:
                return
        dead = self._dead_rank
        ran = any(o.name == DeadRank.name and o.ok for o in outcomes)
        try:
            judged = dead is None or (ran and not dead.waiting(now, view))
        except Exception:  # noqa: BLE001 - as the detector's own check: never raised into the tick
            first, suppressed = self._judge_failed.should_log("waiting", now)
            if first:
                self.log.error("dead_rank_waiting_failed", suppressed=suppressed, exc_info=True)
            judged = False  # held on: HOLD_MAX_S bounds it
        with self._lock:
            self._unjudged.release(view, now, judged)

    def stalled(self, now: float, gap_s: float, wall: float) -> None:
        """The daemon's loop was not running for ``gap_s`` until ``now`` (``wall``): hold detection (stall.py)."""
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

    def _gauges(self, view: ClusterView, now: float, outcomes: list[Outcome]) -> None:
        m, cfg = self.metrics, self.cfg.detectors
        hl = health.classify_all(view, now, cfg)
        states = list(hl.values())  # C-level counts, not a generator over 16,384 ranks
        m.ranks_expected.set(health.expected_world(view, now, cfg))
        m.ranks_registered.set(len(states) - states.count(health.RETIRED))
        m.ranks_alive.set(states.count(health.OK) + states.count(health.FROZEN))
        unseen = len(health.unobserved_hosts(view, now, cfg))
        m.hosts.labels("reporting").set(len(view.hosts) - len(self._lost) - unseen)
        m.hosts.labels("unobserved").set(unseen)
        m.hosts.labels("lost").set(len(self._lost))
        counts = dict.fromkeys(KINDS, 0)
        for kind, _ in self._active:
            counts[kind] = counts.get(kind, 0) + 1
        for kind, n in counts.items():
            m.active.labels(kind).set(n)
        for o in outcomes:  # computed by each detector under the runner's isolation (a failed one has none)
            m.set_detector_gauges(o.gauges)

    # -- performance: bottleneck verdict and goodput --------------------------------

    GOODPUT_EVERY_S = 60.0  # a goodput record in the journal this often (and one at stop)

    def _performance(self, view: ClusterView, now: float, verdict_due: bool = True) -> None:
        """Never a finding and never in the way of detection: a bug here is logged
        rarely and the tick goes on. ``verdict_due``: the verdict's turn (perf_cadence)."""
        try:
            if verdict_due:
                self._verdict(view, now)
            self._goodput(view, now)
        except Exception as exc:  # performance reporting must never stop detection
            first, suppressed = self._performance_failed.should_log(type(exc).__name__, now)
            if first:
                self.log.error(
                    "performance_failed", error=f"{type(exc).__name__}: {exc}", suppressed=suppressed, exc_info=True
                )

    def _verdict(self, view: ClusterView, now: float) -> None:
        m = verdict.measure(now, view, self.cfg.detectors, self._summaries)
        new = verdict.decide(self.verdict, m, now)
        if new.verdict != self.verdict.verdict:
            self.log.info(je.VERDICT, verdict=new.verdict, previous=self.verdict.verdict, reason=new.reason)
            self._record(
                VerdictRecord(
                    verdict=new.verdict,
                    previous=self.verdict.verdict,
                    reason=new.reason,
                    shares={k: round(v, 4) for k, v in m.shares.items()},
                    evidence=new.evidence,
                )
            )
        self.verdict = new
        for v in verdict.VERDICTS:
            self.metrics.bottleneck.labels(v).set(1 if v == new.verdict else 0)
        for cause, share in m.shares.items():
            self.metrics.bottleneck_share.labels(cause).set(round(share, 4))
        if "clock" in m.evidence:
            for clock in verdict.SPLIT_CLOCKS:
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
            self._goodput_journaled_at is None or now - self._goodput_journaled_at >= self.GOODPUT_EVERY_S
        ):
            self._goodput_journaled_at = now
            self._record(je.GOODPUT, self.goodput_record(final=False))

    def goodput_record(self, final: bool) -> dict[str, Any]:
        """The journal's goodput record: the ledger so far, and the verdict."""
        rec = self.goodput.summary()
        rec.update(
            final=final,
            summary=goodput.summary_line(rec),
            verdict=self.verdict.verdict,
            verdict_reason=self.verdict.reason,
            verdict_evidence=self.verdict.evidence,
            world_size=self._folder.world_size,
        )
        return rec

    # -- evidence ----------------------------------------------------------------

    COLLECT_COOLDOWN_S = 60.0  # a finding that flaps open/resolved is not dumped every time
    # Findings opened within this long of one whose evidence included the context
    # (every rank's stacks, the others' snapshots) share it and ask only for their
    # own culprits' (evidence_plan). Long enough for one event seen host by host
    # (agents slowed to 10 s by back-pressure), short enough that an unrelated
    # fault later gets a context of its own.
    CONTEXT_SHARED_S = 15.0

    def _collect(self, opened: list[Finding], view: ClusterView, now: float) -> None:
        if not self.cfg.evidence:
            return
        self._collected = {k: t for k, t in self._collected.items() if now - t < self.COLLECT_COOLDOWN_S}
        for f in opened:
            if (not f.ranks and not f.wants_stacks) or f.key in self._collected:
                continue
            if not self._commands_ok:
                if not self._no_evidence_logged:
                    self._no_evidence_logged = True
                    self.log.warning(
                        "evidence_disabled",
                        reason="no job token and not listening on loopback: agents would refuse unsigned commands",
                    )
                return
            cap = self.cfg.stacks_max_per_host
            shared = frozenset(p for p, at in self._context_at.items() if now - at < self.CONTEXT_SHARED_S)
            context = evidence_plan.CONTEXT - shared
            reqs, left = evidence_plan.plan_capped(f, view, max_stacks_per_host=cap, context=context)
            if left:
                rec = stack_plan.capped_record(f, left, cap)
                self.log.warning(je.STACKS_CAPPED, **rec.payload())
                self._record(rec)
            if reqs:
                self._collected[f.key] = now
                for part in evidence_plan.context_of(f.kind) & context:
                    self._context_at[part] = now
                self._expect_stacks(reqs, now)
                self.dispatch.request(reqs, now)
                # Hosts and ranks per type: the per-host requests are journaled as they go out (``command``).
                self.log.info(
                    "evidence_requested",
                    kind=f.kind,
                    ranks=list(f.ranks),
                    requests=evidence_plan.brief(reqs),
                    context_shared=sorted(shared & evidence_plan.context_of(f.kind)),
                )

    # -- actions ---------------------------------------------------------------

    def _act(self, view: ClusterView, now: float, seen: set[tracker.Key]) -> None:
        """Policy and the action in flight; a bug here is logged and retried next
        tick, never raised into the detection loop. ``seen``: the findings reported this tick."""
        with self._lock:
            spent = self._spent
        first = self.control.job.by_launcher
        for i, at in enumerate(spent.launcher[first:], first):  # the launcher's own restarts spend the budget too
            self.control.launcher_restarted(at)
            used = len(self.control.job.restarts)
            self.log.warning("restart_budget_spent", by="launcher", restarts_used=used)
            # Journaled as the launcher's, with no action of ours (an alert-only policy sees it too):
            # the post-mortem tells a restart torchrun made by itself from one the monitor made.
            self._record(LauncherRestartRecord(restart=used, by="launcher", seen_s=round(now - at, 3)))
            self._relaunch = relaunch.follow(self._relaunch, used, i, at, spent)
        self._launcher_resumed(view, now, spent)
        try:
            reqs, events = self.control.tick([a.first for a in self._active.values()], view, now, seen)
        except Exception as exc:  # noqa: BLE001 - the loop must keep detecting
            self.control.errors += 1
            first, suppressed = self._control_failed.should_log("control", now)
            if first:
                self.log.error(
                    "action_failed", error=f"{type(exc).__name__}: {exc}", suppressed=suppressed, exc_info=True
                )
            return
        if reqs:
            self._expect_stacks(reqs, now)
            self.dispatch.request(reqs, now)
        for name, payload in events:
            (self.log.warning if name in (je.ACTION, je.ACTION_OUTCOME, je.STATE) else self.log.info)(name, **payload)
            self._record(name, payload)
            self._action_metrics.note(name, payload)
            with self._lock:
                self._spent = budget.fold(self._spent, name, payload, now)
            if name == je.RESUMED and isinstance(payload.get("steps_lost"), int):
                self.metrics.steps_lost.inc(payload["steps_lost"])

    def _launcher_resumed(self, view: ClusterView, now: float, spent: budget.Spent) -> None:
        """The steps a restart the launcher made on its own cost, once its group resumed (relaunch.py)."""
        if self._relaunch is None:
            return
        if spent.in_flight:  # a restart of ours began meanwhile: its resume is its own to measure
            self._relaunch = None
            return
        rec = relaunch.resumed(self._relaunch, view, now, spent)
        if rec is None:
            return
        self._relaunch = None
        self.log.info(je.RESUMED, **rec.payload())
        self._record(rec)
        if rec.steps_lost is not None:
            self.metrics.steps_lost.inc(rec.steps_lost)

    def _expect_stacks(self, reqs: list, now: float) -> None:
        """Stacks asked for (a hang's evidence, an abort's first step): their groups
        are journaled once every host asked has answered (``stack_gather``)."""
        by_trigger: dict[str, tuple[dict, dict[str, list[int]]]] = {}
        keys: dict[int, str] = {}  # a plan's requests share one trigger: its key made once, not per host
        for r in reqs:
            if r.type == commands.DUMP_STACKS:
                key = keys.get(id(r.trigger))
                if key is None:
                    key = keys[id(r.trigger)] = triggers.key(r.trigger)
                by_trigger.setdefault(key, (r.trigger, {}))[1].setdefault(r.host, []).extend(r.ranks)
        for trigger, hosts in by_trigger.values():
            self.stacks.expect(trigger, hosts, now)

    def _stack_groups(self, now: float) -> None:
        for rec in self.stacks.due(now):
            self.log.warning(
                je.STACK_GROUPS,
                trigger=rec["trigger"],
                ranks=rec["ranks"],
                groups=len(rec["groups"]),
                summary=rec["summary"],
            )
            self._record(je.STACK_GROUPS, rec)
            trig = rec["trigger"]
            ranks = tuple(r for r in trig.get("ranks") or () if isinstance(r, int))
            self._stack_summary[(str(trig.get("kind")), ranks)] = rec["summary"]
            self.control.stacks(trig, fingerprint.culprit_frames(rec))
            while len(self._stack_summary) > 64:  # findings are few; a flapping job must not grow this
                del self._stack_summary[next(iter(self._stack_summary))]

    def _command_events(self, events: list[Record]) -> None:
        """Journal, log and count what the dispatch reported."""
        for rec in events:
            name, payload = rec.event, rec.payload()
            self.control.note(name, payload)
            self.stacks.note(name, payload)
            kind = payload.get("type", "")
            outcome = {je.COMMAND: "sent", je.COMMAND_REFUSED: "refused", je.COMMAND_EXPIRED: "expired"}.get(name)
            if name in (je.EVIDENCE, je.COMMAND_DONE):
                outcome = "done" if payload.get("ok") else "failed"
            if outcome and kind in commands.TYPES:
                self.metrics.commands.labels(kind, outcome).inc()
            brief = {k: v for k, v in payload.items() if k not in ("stacks", "slots", "flight_recorder")}
            if name == je.EVIDENCE:
                brief.update(
                    stacks=[s["rank"] for s in payload["stacks"] if s.get("ok")],
                    slots=[s["rank"] for s in payload["slots"]],
                )
                if payload.get("flight_recorder"):
                    brief["flight_recorder"] = [d["rank"] for d in payload["flight_recorder"] if d.get("ok")]
            (
                self.log.warning
                if name in (je.COMMAND_REFUSED, je.COMMAND_EXPIRED, je.COMMAND_UNKNOWN_ACK)
                else self.log.info
            )(name, **brief)
            self._record(rec)

    # -- status ----------------------------------------------------------------

    def status(self, now: float, wall: float) -> dict[str, Any]:
        doc = status.build(self.view_at(now), self._active, now, wall, self.cfg)
        # Added fields: the bottleneck with its evidence, and goodput so far.
        v = self.verdict
        doc["bottleneck"] = {
            "verdict": v.verdict,
            "reason": v.reason,
            "since_s": round(now - v.since, 3) if v.since else None,
            "evidence": v.evidence,
        }
        g = self.goodput.summary()
        doc["goodput"] = {**g, "summary": goodput.summary_line(g)}
        for f in doc["findings"]:  # added field: where every rank's stack put the ranks, once known
            line = self._stack_summary.get((f["kind"], tuple(f["ranks"])))
            if line:
                f["stacks"] = line
        return doc

    # -- journal ---------------------------------------------------------------

    def _record(self, event: str | Record, payload: dict[str, Any] | None = None) -> None:
        """Journals a typed record, or an event name and its payload (the events the
        view, dispatch and actions hand the tick)."""
        try:
            self.journal.write(event, payload)
        except OSError as exc:  # a full disk must not stop detection; count it, log it rarely
            self.metrics.journal_errors.inc()
            # the clock only spaces an error log line out; no decision reads it
            first, suppressed = self._journal_failed.should_log("journal", time.monotonic())  # noqa: TID251
            if first:
                self.log.error("journal_write_failed", path=self.journal.path, error=str(exc), suppressed=suppressed)
