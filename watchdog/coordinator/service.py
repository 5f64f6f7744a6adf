"""The coordinator's state and its two entry points: ``accept`` (a report
arrived) and ``tick`` (run the detectors). Both take the time as arguments; the
daemon (``daemon.py``) is what reads the clock.

The view is immutable and swapped under a lock, so ``tick`` runs the detectors
on the view it read without blocking reports.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CollectorRegistry

from .. import commands, logs
from ..report import HostReport
from . import evidence_plan, health, stack_gather, stack_plan, stats, status, tracker
from .control import JobController
from .config import Config
from .detectors import build
from .dispatch import Dispatch, DispatchConfig
from .finding import KINDS, Finding
from .journal import Journal
from .metrics import CoordinatorMetrics
from .runner import Outcome, Runner
from .backpressure import Backpressure
from .view import ClusterView, Folder, empty


class WrongJob(Exception):
    """A report for another job (409)."""


@dataclass(frozen=True)
class TickResult:
    opened: tuple[Finding, ...]
    resolved: tuple[tracker.Resolved, ...]
    outcomes: tuple[Outcome, ...]


class Coordinator:
    def __init__(self, cfg: Config, journal: Journal, registry: CollectorRegistry | None = None) -> None:
        self.cfg = cfg
        self.journal = journal
        self.registry = registry if registry is not None else CollectorRegistry()
        self.detectors = build(cfg.detectors)
        self.metrics = CoordinatorMetrics(self.registry, tuple(d.name for d in self.detectors))
        self.runner = Runner(self.detectors)
        self.log = logs.get("watchdog.coordinator")
        self._lock = threading.Lock()
        self._folder = Folder(empty(cfg.job, cfg.world_size))  # reports fold in place; views are snapshots
        self.backpressure = Backpressure(self.metrics)
        self._active: dict[tracker.Key, tracker.Active] = {}
        self._lost: set[str] = set()
        self._journal_failed = logs.RateLimited(every_s=60.0)
        self._mismatch = logs.RateLimited(every_s=600.0)
        self.dispatch = Dispatch(cfg.token, DispatchConfig(give_up_s=cfg.commands_give_up_s))
        # Unsigned commands only where agents accept them: both sides without a token, on loopback.
        self._commands_ok = bool(cfg.token) or commands.is_loopback(cfg.listen[0])
        self._collected: dict[tracker.Key, float] = {}  # finding key -> when evidence was last requested
        self._no_evidence_logged = False
        self.stacks = stack_gather.StackGather(wait_s=cfg.commands_give_up_s + 30.0)
        self._stack_summary: dict[tuple[str, tuple[int, ...]], str] = {}  # finding key -> its stack groups in a line
        self.control = JobController(cfg.policy)
        self._control_failed = logs.RateLimited(every_s=60.0)
        if cfg.job:
            self.metrics.info.labels(cfg.job).set(1)
        self.metrics.ranks_expected.set(cfg.world_size)

    @property
    def view(self) -> ClusterView:
        with self._lock:
            view = self._folder.snapshot()
        now = time.monotonic()
        behind = self.backpressure.behind(now)
        if view.hosts:
            interval = stats.median([hv.interval_s for hv in view.hosts.values()])
            behind = max(behind, self.backpressure.deficit(now, len(view.hosts), interval))
        return replace(view, behind_s=behind) if behind > 0 else view

    @property
    def active(self) -> dict[tracker.Key, tracker.Active]:
        return dict(self._active)

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
                    self.log.warning("world_size_mismatch", host=report.host, expected=view.world_size,
                                     reported=sorted({r.world_size for r in report.ranks}), suppressed=suppressed)
            events = view.fold(report, now, self.cfg.detectors)
            for name, payload in events:
                self.log.info(name, **payload)
                self._record(name, payload)
        self.metrics.received.inc()
        # Outside the lock: evidence lines are fsync'd and can be large.
        done = self.dispatch.acked(report.host, report.acks, now) if report.acks else []
        outgoing, sent = self.dispatch.outgoing(report.job, report.host, report.sent_wall, report.interval_s, now)
        self._command_events(done + sent)
        return {"ok": True, "commands": outgoing}

    # -- tick ------------------------------------------------------------------

    def tick(self, now: float, wall: float) -> TickResult:
        view = self.view
        self._hosts(view, now)
        outcomes = self.runner.run(now, view)
        findings = [replace(f, onset_wall=wall - (now - f.onset_mono), detected_wall=wall)
                    for o in outcomes for f in o.findings]
        ran = [o.name for o in outcomes if o.ok]
        self._active, opened, resolved = tracker.update(self._active, findings, now, ran, self.cfg.resolve_grace_s)
        faults = []
        for f in opened:
            caused = self.control.caused_by(f, now)
            if caused:  # the workers an action stopped, found dead: its effect, not a fault
                self.log.info("expected_finding", kind=f.kind, ranks=list(f.ranks), caused_by_action=caused)
                self._record("expected_finding", {**f.to_dict(), "caused_by_action": caused})
                continue
            faults.append(f)
            self.metrics.findings.labels(f.kind).inc()
            self.log.warning("finding", kind=f.kind, ranks=list(f.ranks), hosts=list(f.hosts), reason=f.reason)
            self._record("finding", f.to_dict())
        self._collect(faults, view, now)  # after the finding lines: evidence follows, never delays them
        self._act(view, now)
        self._command_events(self.dispatch.expire(now, lambda h: view.hosts[h].interval_s if h in view.hosts else 1.0))
        self._stack_groups(now)
        for r in resolved:
            self.metrics.resolved.labels(r.finding.kind).inc()
            self.log.info("resolved", kind=r.finding.kind, ranks=list(r.finding.ranks), duration_s=round(r.duration_s, 3))
            self._record("resolved", {"kind": r.finding.kind, "ranks": list(r.finding.ranks), "hosts": list(r.finding.hosts),
                                      "duration_s": round(r.duration_s, 3), "reason": r.finding.reason,
                                      "opened_wall": r.opened.detected_wall})
        for o in outcomes:
            self.metrics.det_success.labels(o.name).set(1 if o.ok else 0)
            self.metrics.det_duration.labels(o.name).set(o.duration_s)
            if not o.ok:
                self.metrics.det_errors.labels(o.name).inc()
        self._gauges(view, now, outcomes)
        return TickResult(tuple(opened), tuple(resolved), tuple(outcomes))

    def _hosts(self, view: ClusterView, now: float) -> None:
        """Journal host loss and return as state changes (the finding is dead_rank's)."""
        lost_now = health.lost_hosts(view, now, self.cfg.detectors)
        for host, hv in view.hosts.items():
            lost = host in lost_now
            if lost and host not in self._lost:
                self._lost.add(host)
                self.log.warning("host_lost", host=host, silent_s=round(now - hv.received_at, 3))
                self._record("host_lost", {"host": host, "agent_id": hv.agent_id, "silent_s": round(now - hv.received_at, 3)})
            elif not lost and host in self._lost:
                self._lost.discard(host)
                self.log.info("host_back", host=host)
                self._record("host_back", {"host": host, "agent_id": hv.agent_id})

    def _gauges(self, view: ClusterView, now: float, outcomes: list[Outcome]) -> None:
        m, cfg = self.metrics, self.cfg.detectors
        hl = health.classify_all(view, now, cfg)
        m.ranks_expected.set(view.world_size)
        m.ranks_registered.set(len(view.ranks))
        m.ranks_alive.set(sum(1 for h in hl.values() if h in (health.OK, health.FROZEN)))
        m.hosts.labels("reporting").set(len(view.hosts) - len(self._lost))
        m.hosts.labels("lost").set(len(self._lost))
        counts = {k: 0 for k in KINDS}
        for kind, _ in self._active:
            counts[kind] = counts.get(kind, 0) + 1
        for kind, n in counts.items():
            m.active.labels(kind).set(n)
        for o in outcomes:  # computed by each detector under the runner's isolation (a failed one has none)
            m.set_detector_gauges(o.gauges)

    # -- evidence ----------------------------------------------------------------

    COLLECT_COOLDOWN_S = 60.0  # a finding that flaps open/resolved is not dumped every time

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
                    self.log.warning("evidence_disabled", reason="no job token and not listening on loopback: "
                                     "agents would refuse unsigned commands")
                return
            cap = self.cfg.stacks_max_per_host
            reqs = evidence_plan.plan(f, view, max_stacks_per_host=cap)
            if f.kind in stack_plan.ALL_RANKS_KINDS:
                left = stack_plan.every_rank(f, view, cap)[1]
                if left:
                    rec = stack_plan.capped_record(f, left, cap)
                    self.log.warning(stack_plan.CAPPED, **rec)
                    self._record(stack_plan.CAPPED, rec)
            if reqs:
                self._collected[f.key] = now
                self._expect_stacks(reqs, now)
                self.dispatch.request(reqs, now)
                self.log.info("evidence_requested", kind=f.kind, ranks=list(f.ranks),
                              requests=[{"host": r.host, "type": r.type, "ranks": r.ranks} for r in reqs])

    # -- actions ---------------------------------------------------------------

    def _act(self, view: ClusterView, now: float) -> None:
        """Policy and the action in flight; a bug here is logged and retried next
        tick, never raised into the detection loop."""
        try:
            reqs, events = self.control.tick([a.first for a in self._active.values()], view, now)
        except Exception as exc:  # noqa: BLE001 - the loop must keep detecting
            self.control.errors += 1
            first, suppressed = self._control_failed.should_log("control", now)
            if first:
                self.log.error("action_failed", error=f"{type(exc).__name__}: {exc}", suppressed=suppressed,
                               exc_info=True)
            return
        if reqs:
            self._expect_stacks(reqs, now)
            self.dispatch.request(reqs, now)
        for name, payload in events:
            (self.log.warning if name in ("action", "action_outcome", "state") else self.log.info)(name, **payload)
            self._record(name, payload)

    def _expect_stacks(self, reqs: list, now: float) -> None:
        """Stacks asked for (a hang's evidence, an abort's first step): their groups
        are journaled once every host asked has answered (``stack_gather``)."""
        by_trigger: dict[str, tuple[dict, dict[str, list[int]]]] = {}
        for r in reqs:
            if r.type == commands.DUMP_STACKS:
                key = repr(sorted(r.trigger.items()))
                by_trigger.setdefault(key, (r.trigger, {}))[1].setdefault(r.host, []).extend(r.ranks)
        for trigger, hosts in by_trigger.values():
            self.stacks.expect(trigger, hosts, now)

    def _stack_groups(self, now: float) -> None:
        for rec in self.stacks.due(now):
            self.log.warning(stack_gather.EVENT, trigger=rec["trigger"], ranks=rec["ranks"],
                             groups=len(rec["groups"]), summary=rec["summary"])
            self._record(stack_gather.EVENT, rec)
            trig = rec["trigger"]
            ranks = tuple(r for r in trig.get("ranks") or () if isinstance(r, int))
            self._stack_summary[(str(trig.get("kind")), ranks)] = rec["summary"]
            while len(self._stack_summary) > 64:  # findings are few; a flapping job must not grow this
                del self._stack_summary[next(iter(self._stack_summary))]

    def _command_events(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """Journal, log and count what the dispatch reported."""
        for name, payload in events:
            self.control.note(name, payload)
            self.stacks.note(name, payload)
            kind = payload.get("type", "")
            outcome = {"command": "sent", "command_refused": "refused", "command_expired": "expired"}.get(name)
            if name in ("evidence", "command_done"):
                outcome = "done" if payload.get("ok") else "failed"
            if outcome and kind in commands.TYPES:
                self.metrics.commands.labels(kind, outcome).inc()
            brief = {k: v for k, v in payload.items() if k not in ("stacks", "slots")}
            if name == "evidence":
                brief.update(stacks=[s["rank"] for s in payload["stacks"] if s.get("ok")],
                             slots=[s["rank"] for s in payload["slots"]])
            (self.log.warning if name in ("command_refused", "command_expired", "command_unknown_ack")
             else self.log.info)(name, **brief)
            self._record(name, payload)

    # -- status ----------------------------------------------------------------

    def status(self, now: float, wall: float) -> dict[str, Any]:
        doc = status.build(self.view, self._active, now, wall, self.cfg)
        for f in doc["findings"]:  # added field: where every rank's stack put the ranks, once known
            line = self._stack_summary.get((f["kind"], tuple(f["ranks"])))
            if line:
                f["stacks"] = line
        return doc

    # -- journal ---------------------------------------------------------------

    def _record(self, event: str, payload: dict[str, Any]) -> None:
        try:
            self.journal.write(event, payload)
        except OSError as exc:  # a full disk must not stop detection; count it, log it rarely
            self.metrics.journal_errors.inc()
            first, suppressed = self._journal_failed.should_log("journal", time.monotonic())
            if first:
                self.log.error("journal_write_failed", path=self.journal.path, error=str(exc), suppressed=suppressed)
