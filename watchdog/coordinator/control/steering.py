"""The policy applied on each tick: the restarts the launcher made by itself
spend the budget, the job controller plans and advances the action in flight,
its commands go out and its events are journaled. A subsystem of the
coordinator's tick (``subsystem.py``); a bug here is logged and retried next
tick, never raised into the detection loop."""

from __future__ import annotations

import threading
from typing import Any

from ... import logs
from ...contracts.journal.actions import LauncherRestartRecord, ResumedRecord
from ..evidence.collect import expect_stacks
from ..evidence.dispatch import Dispatch
from ..evidence.stack_gather import StackGather
from ..journal import event_names as je
from ..metrics import CoordinatorMetrics
from ..subsystem import Out, Tick
from ..view.cluster import ClusterView
from . import budget, relaunch
from .action_metrics import ActionMetrics
from .loop import JobController


class Steering:
    def __init__(
        self,
        control: JobController,
        dispatch: Dispatch,
        stacks: StackGather,
        metrics: CoordinatorMetrics,
        out: Out,
        lock: threading.Lock,
    ) -> None:
        """``lock``: the coordinator's, under which reports fold into ``spent`` too."""
        self.control = control
        self.dispatch = dispatch
        self.stacks = stacks
        self.metrics = metrics
        self.out = out
        self._lock = lock
        self._action_metrics = ActionMetrics(metrics)
        self._failed = logs.RateLimited(every_s=60.0)
        self.spent = budget.Spent()  # the restarts the launcher made by itself (control/budget.py); under lock
        self._relaunch: relaunch.Awaiting | None = None  # the launcher's latest restart, until its group resumed

    def fold(self, name: str, payload: dict[str, Any], now: float) -> None:
        """An event of a report; the caller holds the lock."""
        self.spent = budget.fold(self.spent, name, payload, now)

    def on_tick(self, tick: Tick) -> None:
        view, now = tick.view, tick.now
        with self._lock:
            spent = self.spent
        first = self.control.job.by_launcher
        for i, at in enumerate(spent.launcher[first:], first):  # the launcher's own restarts spend the budget too
            self.control.launcher_restarted(at)
            used = len(self.control.job.restarts)
            self.out.log.warning("restart_budget_spent", by="launcher", restarts_used=used)
            # Journaled as the launcher's, with no action of ours (an alert-only policy sees it too):
            # the post-mortem tells a restart torchrun made by itself from one the monitor made.
            self.out.record(LauncherRestartRecord(restart=used, by="launcher", seen_s=round(now - at, 3)))
            self._relaunch = relaunch.follow(self._relaunch, used, i, at, spent)
        self._launcher_resumed(view, now, spent)
        try:
            reqs, events = self.control.tick([a.first for a in tick.active.values()], view, now, tick.seen)
        except Exception as exc:  # noqa: BLE001 - the loop must keep detecting
            self.control.errors += 1
            first, suppressed = self._failed.should_log("control", now)
            if first:
                self.out.log.error(
                    "action_failed", error=f"{type(exc).__name__}: {exc}", suppressed=suppressed, exc_info=True
                )
            return
        if reqs:
            expect_stacks(self.stacks, reqs, now)
            self.dispatch.request(reqs, now)
        for rec in events:
            name, payload = rec.event, rec.payload()
            log = self.out.log
            (log.warning if name in (je.ACTION, je.ACTION_OUTCOME, je.STATE) else log.info)(name, **payload)
            self.out.record(rec)
            self._action_metrics.note(name, payload)
            with self._lock:
                self.spent = budget.fold(self.spent, name, payload, now)
            if isinstance(rec, ResumedRecord) and isinstance(rec.steps_lost, int):
                self.metrics.steps_lost.inc(rec.steps_lost)

    def _launcher_resumed(self, view: ClusterView, now: float, spent: budget.Spent) -> None:
        """The steps a restart the launcher made on its own cost, once its group resumed (control/relaunch.py)."""
        if self._relaunch is None:
            return
        if spent.in_flight:  # a restart of ours began meanwhile: its resume is its own to measure
            self._relaunch = None
            return
        rec = relaunch.resumed(self._relaunch, view, now, spent)
        if rec is None:
            return
        self._relaunch = None
        self.out.log.info(je.RESUMED, **rec.payload())
        self.out.record(rec)
        if rec.steps_lost is not None:
            self.metrics.steps_lost.inc(rec.steps_lost)
