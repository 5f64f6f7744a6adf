"""The job's control loop: findings -> policy plan -> action, with the job state
machine, the restart budget and the journal lines of every decision.

Pure apart from its own state: ``tick(findings, view, now)`` and ``note(event)``
take everything as arguments and return the commands to send and the journal
events to write; the service sends and writes them. At most one action is in
flight (the policy holds any other until the job is idle again).

Journal events: ``action`` (started, with the plan's reason; also a dry run),
``action_held`` (a wanted action waits: age, cooldown; once per reason),
``action_progress`` (signals sent), ``action_outcome``, ``state`` (job state
transitions: ``{"job_state": to, "from": ..., "on": event}``; no ``rank`` key,
which tells it from a rank's state change), ``checkpointed`` /
``checkpoint_failed`` (checkpoint_restart), ``restart`` and ``resumed``,
``repeat_failure`` (the restart-loop breaker escalated: control/repeats.py; the
``action`` line after it carries the finding's ``fingerprint``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import replace
from typing import Any

from watchdog.contracts.journal.actions import (
    ActionErrorRecord,
    ActionHeldRecord,
    ActionOutcomeRecord,
    ActionRecord,
    RepeatFailureRecord,
)
from watchdog.contracts.journal.ranks import StateRecord

from ...contracts.finding import ADVISORY_KINDS, Finding, seconds
from ..evidence.plan import CommandRequest
from ..journal import event_names as je
from ..policy_file import Policy, PolicyError
from ..recovery import MODULES
from ..recovery.operation import ActionStep, Event, Operation
from ..view.cluster import ClusterView
from ..vocabularies import JobState
from . import policy as P
from .replay import Recovered


class JobController:
    def __init__(self, pol: Policy = Policy()) -> None:
        self.policy = pol
        self.job = P.JobControl()
        self.op: Operation | None = None
        self._count = 0
        self._held: str = ""  # last held reason journaled (state changes, not ticks)
        self._last: tuple[Operation | None, float] = (None, 0.0)  # the last finished action, when
        self.errors = 0
        self._frames: dict[tuple[str, tuple[int, ...]], tuple[str, ...]] = {}  # finding key -> culprit's top frames
        self._recovered_at: float | None = None  # rebuilt from the journal: wait to hear from its hosts
        self._start_again = False
        self._launcher_at: tuple[float, ...] = ()  # when the launcher's own latest restarts were seen

    RECOVER_WAIT_S = 15.0  # a rebuilt action waits this long at most for its hosts' first reports

    def launcher_restarted(self, at: float) -> None:
        """The launcher restarted the group by itself (control/budget.py): it spends the job's restart budget."""
        self.job = self.job.launcher_restarted(at)
        self._launcher_at = (*self._launcher_at[-7:], at)

    def _restarted_already(self, p: P.Plan) -> P.Plan:
        """A restart for a finding whose group its launcher restarted since the failure began
        is held: that restart was the failure's (torchrun --max-restarts), counted in the budget
        as the launcher's, and the group is not restarted a second time for it. On several hosts
        a death is judged once every host reported, often after torchrun's new workers."""
        f = p.finding
        if f is None or p.action not in P.RESTARTING_ACTIONS:
            return p
        at = next((t for t in self._launcher_at if t >= f.onset_mono), None)
        if at is None:
            return p
        why = f"restarted by its launcher already, {seconds(at - f.onset_mono)} after it began"
        return P.Plan("alert", f, f"{p.action} for {f.kind} held: {why}", held=True)

    def restore(self, rec: Recovered, now: float) -> None:
        """Carry on from the journal (recover.replay) instead of from scratch."""
        self.job, self._count, self.op = rec.job, rec.count, rec.op
        self._start_again = rec.restart_op
        self._recovered_at = now if rec.op is not None else None

    def _waiting_for_hosts(self, view: ClusterView, now: float) -> bool:
        """A rebuilt action acts on an empty view otherwise: every worker would look
        gone (a restart would conclude at once) before any agent has reported."""
        if self._recovered_at is None or self.op is None:
            return False
        hosts = {h for _, (_, _, h) in self.op.workers} | {h for _, _, h in self.op.launchers}
        if not hosts:
            hosts = set(self.op.finding.hosts)
        unheard = (hosts and not hosts <= set(view.hosts)) or not view.hosts
        if unheard and now - self._recovered_at < self.RECOVER_WAIT_S:
            return True
        self._recovered_at = None
        return False

    @property
    def state(self) -> JobState:
        return self.job.state

    def _move(self, event: str, events: list[Event]) -> None:
        old = self.job.state
        try:
            new = P.transition(old, event)
        except PolicyError as exc:  # a bug, not a reason to stop: say so and stay
            self.errors += 1
            events.append(ActionErrorRecord(error=str(exc)))
            return
        if new != old:
            self.job = replace(self.job, state=new)
            events.append(StateRecord(job_state=new.value, from_state=old.value, on=event))

    def tick(
        self,
        findings: Iterable[Finding],
        view: ClusterView,
        now: float,
        seen: Collection[tuple[str, tuple[int, ...]]] | None = None,
    ) -> tuple[list[CommandRequest], list[Event]]:
        """``findings``: the open ones; ``seen``: the keys of those their detectors
        reported on this tick (None: all of them). The job's state follows every
        open finding, but an action starts only on one seen now: a finding still
        open only because its resolution waits out the grace period, or rebuilt
        from the journal and not seen since, describes what was, not what is (a
        coordinator restarted mid-restart aborted the resumed job on the finding
        the restart had cured, which its journal still held open)."""
        findings = list(findings)
        events: list[Event] = []
        reqs: list[CommandRequest] = []
        if self._waiting_for_hosts(view, now):
            return reqs, events
        if self.op is not None and self._start_again:  # an abort decided before the restart, nothing sent yet
            self._start_again = False
            self.op = replace(self.op, finding=replace(self.op.finding, detected_mono=now))
            self._apply(MODULES[self.op.action].start(self.op, view, now), reqs, events, now, view)
        elif self.op is not None:
            self._apply(MODULES[self.op.action].advance(self.op, view, now), reqs, events, now, view)
        if self.job.state is JobState.FAILED:
            return reqs, events
        if self.job.state in P.IDLE:
            broken = [f for f in findings if f.kind not in ADVISORY_KINDS]  # advice says nothing is broken
            if broken and self.job.state is JobState.RUNNING:
                self._move("findings_open", events)
            elif not broken and self.job.state is JobState.DEGRADED:
                self._move("findings_clear", events)
        current = findings if seen is None else [f for f in findings if f.key in seen]
        p = self._restarted_already(P.plan(current, self.job, now, self.policy, self._frames, len(view.hosts)))
        if p.action == "alert" or p.finding is None:
            # Once per (finding, why held): the reason's numbers change every tick.
            held = (
                f"{p.finding.key if p.finding else ''} {p.reason.partition(' held: ')[2].split(' ')[0]}"
                if p.held
                else ""
            )
            if held and held != self._held and self.job.state in P.IDLE:
                events.append(ActionHeldRecord(reason=p.reason, kind=p.finding.kind if p.finding else ""))
            self._held = held
            return reqs, events
        self._held = ""
        self._start(p, view, now, reqs, events)
        return reqs, events

    def _start(
        self,
        p: P.Plan,
        view: ClusterView,
        now: float,
        reqs: list[CommandRequest],
        events: list[Event],
        escalated_from: str | None = None,
    ) -> None:
        assert p.finding is not None
        self._count += 1
        op_id = f"a-{self._count}"
        fp = p.fingerprint.to_dict() if p.fingerprint is not None else None
        started = ActionRecord(
            action_id=op_id,
            action=p.action,
            reason=p.reason,
            kind=p.finding.kind,
            ranks=list(p.finding.ranks),
            hosts=list(p.finding.hosts),
            dry_run=p.dry_run,
            job_state=self.job.state.value,
            escalated_from=escalated_from,
            fingerprint=fp,
        )
        if p.escalation is not None:
            events.append(
                RepeatFailureRecord(
                    action_id=op_id,
                    kind=p.finding.kind,
                    ranks=list(p.finding.ranks),
                    hosts=list(p.finding.hosts),
                    dry_run=p.dry_run,
                    fingerprint=fp,
                    **p.escalation.to_dict(),
                )
            )
        if p.dry_run:
            events.append(started)
            events.append(
                ActionOutcomeRecord(action_id=op_id, action=p.action, ok=True, result="dry run: nothing done")
            )
            self.job = replace(self.job, last_action_at=now)
            return
        restart_n = 0
        if p.action in P.RESTARTING_ACTIONS:
            self.job = self.job.restarted(now)
            if p.fingerprint is not None:
                self.job = self.job.remember(p.fingerprint)
            restart_n = len(self.job.restarts)
            started = replace(started, restart=restart_n)
        else:
            self.job = replace(self.job, last_action_at=now)
        events.append(started)
        self._move(p.action, events)
        self.op = Operation(
            id=op_id,
            action=p.action,
            reason=p.reason,
            finding=p.finding,
            started=now,
            grace_s=self.policy.abort_grace_s,
            restart_n=restart_n,
            phase_at=now,
            extra={"timeout_s": self.policy.checkpoint_timeout_s, "resume_timeout_s": self.policy.resume_timeout_s},
        )
        self._apply(MODULES[p.action].start(self.op, view, now), reqs, events, now, view)

    def _apply(
        self, step: ActionStep, reqs: list[CommandRequest], events: list[Event], now: float, view: ClusterView
    ) -> None:
        self.op = None if step.done else step.op
        if step.done:
            self._last = (step.op, now)
        reqs.extend(step.requests)
        events.extend(step.events)
        if step.state_event == "restart_failed":
            # Not a silence and not the end: the policy's escalation (abort with stacks)
            # starts now, on the incarnations there are now.
            result = next((rec.result or "" for rec in step.events if isinstance(rec, ActionOutcomeRecord)), "")
            finding = replace(step.op.finding, detected_mono=now)
            self._start(
                P.after_failed_restart(finding, result or "restart failed", self.policy),
                view,
                now,
                reqs,
                events,
                escalated_from=step.op.id,
            )
            return
        if step.state_event:
            self._move(step.state_event, events)
        if step.done:
            # The cooldown counts from the end of an action, not its start.
            self.job = replace(self.job, last_action_at=now)

    STOPPED_KINDS = frozenset({"dead_rank", "frozen_rank", "collective_hang"})
    CAUSED_WINDOW_S = 30.0

    def caused_by(self, f: Finding, now: float, view: ClusterView | None = None) -> str:
        """The id of the action whose own signals explain this finding (workers it
        stopped are found dead), or "": the service journals such a finding as
        ``expected_finding`` so nobody reads the action's effect as a new fault.
        With the ``view``, a culprit must still be the incarnation the action
        stopped: the restarted group failing again is a new fault (a repeat)."""
        for op, ended in ((self.op, now), self._last):
            if (
                op is None
                or op.phase in ("start", "stacks", "checkpoint")
                or now - ended > self.CAUSED_WINDOW_S
                or f.kind not in self.STOPPED_KINDS
                or not f.ranks
            ):
                continue
            stopped = dict(op.workers)
            if not set(f.ranks) <= set(stopped):
                continue
            if view is not None and any(
                r in view.ranks and view.ranks[r].incarnation != stopped[r][:2] for r in f.ranks
            ):
                continue
            return op.id
        return ""

    def stacks(self, trigger: dict[str, Any], frames: tuple[str, ...]) -> None:
        """A ``stack_groups`` record arrived: the culprit's frames complete the
        fingerprint of its finding, now and in the history (control/fingerprint.py)."""
        ranks = tuple(r for r in trigger.get("ranks") or () if isinstance(r, int))
        if not frames or not isinstance(trigger.get("kind"), str):
            return
        key = (trigger["kind"], ranks)
        self._frames[key] = frames
        while len(self._frames) > 64:
            del self._frames[next(iter(self._frames))]
        self.job = self.job.complete(key[0], ranks, frames)

    def note(self, name: str, payload: dict[str, Any]) -> None:
        """A command answer from the dispatch: an abort waits for its stacks."""
        op = self.op
        trig = payload.get("trigger")
        if op is None or not isinstance(trig, dict) or trig.get("action") != op.id:
            return
        if name in (je.EVIDENCE, je.COMMAND_REFUSED, je.COMMAND_EXPIRED) and payload.get("type") == "dump_stacks":
            self.op = replace(op, hosts_answered=op.hosts_answered | {payload.get("host", "")})
