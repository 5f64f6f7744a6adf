"""Decisions that survive a coordinator restart: the job's control state rebuilt
from its journal at start.

A coordinator killed mid-restart and started again on the same journal must not
restart the job a second time, reset the restart budget or forget the cooldown.
Everything it needs was journaled when it was decided, so ``replay`` is a pure
function of the records and the clocks:

- restart budget: every ``action`` (not a dry run) with a ``restart`` number,
  and the restarts the launcher made by itself (control/budget.py);
- cooldown: the last ``action`` / ``action_outcome``;
- the failures restarts were spent on (control/repeats.py): each restarting action's
  ``fingerprint``, completed by the culprit frames of a later ``stack_groups``
  record, so a failure that comes back after a coordinator restart is still
  known as the same one;
- job state: the last ``state`` record with a ``job_state``;
- action ids: numbering continues after the highest ``a-<n>`` (ids stay unique
  in the journal);
- open findings: ``finding`` / ``expected_finding`` records without a later
  ``resolved`` for the same (kind, ranks): the tracker holds them as open, so
  they are neither journaled nor acted on a second time;
- the action in flight: an ``action`` without an ``action_outcome``. It is
  rebuilt from the worker identities its first signals' ``action_progress``
  journaled (``idents``): in ``resume`` if its ``restart`` record is there,
  else in ``term`` (signals go again, after the grace period, to those same
  processes only: one already gone is a success). An abort that had not sent
  anything starts again from its first step (stacks), against the job as it
  is now; a restart that had not stopped anything is closed as interrupted
  (nothing was done; the policy decides again, its budget already charged).

Times: a record's ``t_wall`` is mapped onto this process's monotonic clock
(``now - (wall - t_wall)``), so a coordinator restarted on another machine
still counts cooldowns and the hourly budget right.

Only records of this job count: a journal segment opened by a ``start`` record
for another job name is skipped; so is one of another run of it, where the
coordinator is given a run id (``--job.run-id``): a new run of the same job name
decides afresh (its own restart budget, not the last run's ``failed``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from watchdog.contracts.journal import parse
from watchdog.contracts.journal.actions import (
    ActionOutcomeRecord,
    ActionProgressRecord,
    ActionRecord,
    LauncherRestartRecord,
    RestartRecord,
)
from watchdog.contracts.journal.commands import StackGroupsRecord
from watchdog.contracts.journal.findings import FindingRecord
from watchdog.contracts.journal.lifecycle import RecoveredRecord, StartRecord

from ...contracts.finding import Finding
from ..detectors import tracker
from ..journal import event_names as je
from ..policy_file import Policy
from ..recovery import restart
from ..recovery.operation import Operation
from ..vocabularies import JobState
from . import budget, fingerprint
from . import policy as P

Progress = ActionProgressRecord | LauncherRestartRecord  # an action's first signals, or the launcher's restart
Restarted = RestartRecord | LauncherRestartRecord

# The actions rebuilt mid-flight: each goes through restart.py's ``term`` -> ``resume``
# phases or abort's. Any other action found in flight is closed as interrupted.
RECOVERABLE = frozenset({"abort", "restart", "checkpoint_restart", "exclude_host_restart", "rollback_restart"})


@dataclass(frozen=True)
class Recovered:
    job: P.JobControl = field(default_factory=P.JobControl)
    count: int = 0  # the highest action number used
    op: Operation | None = None  # the action in flight, rebuilt
    restart_op: bool = False  # op must be started again (an abort that had sent nothing)
    interrupted: tuple[ActionOutcomeRecord, ...] = ()  # to journal: the actions closed here
    active: dict[tracker.Key, tracker.Active] = field(default_factory=dict)
    records: int = 0  # of this job's decision records (DECISIONS), read
    spent: budget.Spent = field(default_factory=budget.Spent)  # the restarts the launcher made (control/budget.py)

    @property
    def empty(self) -> bool:
        return self.records == 0 and not self.spent.launcher and self.count == 0

    def summary(self, now: float) -> dict[str, Any]:
        """The ``recovered`` journal record's fields."""
        return self.record(now).payload()

    def record(self, now: float) -> RecoveredRecord:
        """The ``recovered`` journal record."""
        return RecoveredRecord(
            records=self.records,
            job_state=self.job.state.value,
            restarts_used=len(self.job.restarts),
            restarts_last_hour=sum(1 for t in self.job.restarts if now - t < 3600.0),
            last_action_s_ago=round(now - self.job.last_action_at, 3) if self.job.last_action_at is not None else None,
            next_action_id=f"a-{self.count + 1}",
            in_flight=(
                {
                    "action_id": self.op.id,
                    "action": self.op.action,
                    "phase": self.op.phase,
                    "restart": self.op.restart_n,
                    "workers": [r for r, _ in self.op.workers],
                    "started_again": self.restart_op,
                }
                if self.op is not None
                else None
            ),
            interrupted=[o.action_id for o in self.interrupted],
            open_findings=[{"kind": k, "ranks": list(r)} for k, r in self.active],
        )


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _finding(rec: FindingRecord, mono: Callable[[Any], float]) -> Finding | None:
    onset = rec.onset_wall or rec.t_wall
    detected = rec.detected_wall or rec.t_wall
    if rec.kind is None or onset is None or detected is None:
        return None
    try:
        return Finding(
            kind=rec.kind,
            ranks=tuple(int(r) for r in rec.ranks),
            hosts=tuple(str(h) for h in rec.hosts),
            reason=rec.reason,
            onset_mono=mono(onset),
            detected_mono=mono(detected),
            evidence=rec.evidence,
            wants_stacks=tuple(int(r) for r in rec.wants_stacks),
            onset_wall=float(onset),
            detected_wall=float(detected),
        )
    except (TypeError, ValueError):
        return None


def _idents(raw: Any) -> tuple[tuple, tuple]:
    workers, launchers = [], []
    for item in raw if isinstance(raw, list) else ():
        if not (isinstance(item, list) and len(item) == 4):
            continue
        rank, pid, start, host = item
        numbers = all(isinstance(x, int) and not isinstance(x, bool) for x in (rank, pid, start))
        if not numbers or not isinstance(host, str):
            continue
        if rank >= 0:
            workers.append((rank, (pid, start, host)))
        else:
            launchers.append((pid, start, host))
    return tuple(workers), tuple(launchers)


@dataclass
class _Replay:
    """What the records read so far imply; the reducers below move it on."""

    now: float
    wall: float
    n: int = 0
    state: JobState = JobState.RUNNING
    restarts: list[float] = field(default_factory=list)
    last_action: float | None = None
    count: int = 0
    actions: dict[str, ActionRecord] = field(default_factory=dict)  # id -> its action record, while open
    progress: dict[str, Progress] = field(default_factory=dict)  # id -> its first action_progress with idents
    restarted: dict[str, Restarted] = field(default_factory=dict)  # id -> its restart record
    opened: dict[tracker.Key, FindingRecord] = field(default_factory=dict)
    control: P.JobControl = field(default_factory=P.JobControl)  # what restarts were spent on (control/repeats.py)
    spent: budget.Spent = field(default_factory=budget.Spent)  # and the launcher's own restarts

    def mono(self, t_wall: Any) -> float:
        t = _num(t_wall)
        return self.now - (self.wall - t) if t is not None else self.now

    def numbered(self, aid: str) -> None:
        num = aid.partition("-")[2]
        self.count = max(self.count, int(num)) if num.isdigit() else self.count


def _action(r: _Replay, rec: Any) -> None:
    aid = rec.action_id
    if aid is None:
        return
    r.numbered(aid)
    r.last_action = r.mono(rec.t_wall)
    if rec.dry_run:
        return
    if rec.restart is not None and rec.action in P.RESTARTING_ACTIONS:
        r.restarts.append(r.last_action)
        fp = fingerprint.from_dict(rec.fingerprint)
        if fp is not None:
            r.control = r.control.remember(fp)
    r.actions[aid] = rec


def _progress(r: _Replay, rec: Any) -> None:
    if rec.action_id in r.actions and rec.has("idents"):
        r.progress.setdefault(rec.action_id, rec)


def _restart(r: _Replay, rec: Any) -> None:
    if rec.action_id in r.actions:
        r.restarted[rec.action_id] = rec


def _launcher_restart(r: _Replay, rec: Any) -> None:
    if rec.action_id in r.actions:  # the launcher restarted the group: the processes it names, then the resume
        r.progress.setdefault(rec.action_id, rec)
        r.restarted[rec.action_id] = rec


def _outcome(r: _Replay, rec: Any) -> None:
    if rec.action_id is not None:
        r.actions.pop(rec.action_id, None)
        r.last_action = r.mono(rec.t_wall)


def _state(r: _Replay, rec: Any) -> None:
    if rec.of_job:
        try:
            r.state = JobState(rec.job_state)
        except ValueError:
            pass


def _opened(r: _Replay, rec: Any) -> None:
    if rec.kind is not None:
        r.opened[(rec.kind, tuple(rec.ranks))] = rec


def _resolved(r: _Replay, rec: Any) -> None:
    if rec.kind is not None:
        r.opened.pop((rec.kind, tuple(rec.ranks)), None)


# The records a decision is rebuilt from, and how each moves the replay on; a
# journal with none of them is a fresh start.
REDUCERS: dict[str, Callable[[_Replay, Any], None]] = {
    je.ACTION: _action,
    je.ACTION_PROGRESS: _progress,
    je.RESTART: _restart,
    je.LAUNCHER_RESTART: _launcher_restart,
    je.ACTION_OUTCOME: _outcome,
    je.STATE: _state,
    je.FINDING: _opened,
    je.EXPECTED_FINDING: _opened,
    je.RESOLVED: _resolved,
}
DECISIONS = frozenset(REDUCERS)
_READ = DECISIONS | {je.START, je.STACK_GROUPS}  # the records replay parses


def replay(
    records: Iterable[dict[str, Any]], now: float, wall: float, job: str, pol: Policy, run_id: str = ""
) -> Recovered:
    """The control state the journal's records imply, at (``now``, ``wall``). Pure.
    ``run_id``: only the segments whose ``start`` record names this run count (empty: all)."""
    r = _Replay(now=now, wall=wall)
    ours = same_job = True
    for raw in records:
        event = raw.get("event")
        if (
            not isinstance(event, str) or event not in _READ
        ):  # a record only the budget folds: not parsed (journals run to millions of lines)
            if ours and isinstance(event, str) and event in budget.FOLDED:  # a name, not a hostile list
                r.spent = budget.fold(r.spent, event, raw, r.mono(raw.get("t_wall")))
            continue
        if event == je.STATE and "job_state" not in raw:
            # A rank's state change (most of a journal's decisions): counted, never parsed
            # (it cannot be the job's state: ``_state``), and no budget's business.
            if ours:
                r.n += 1
            continue
        rec = parse(raw)
        if isinstance(rec, StartRecord):
            same_job = not job or not rec.job or rec.job == job
            ours = same_job and (not run_id or rec.run_id == run_id)
            continue
        if same_job and not ours and isinstance(rec, ActionRecord) and rec.action_id is not None:
            r.numbered(rec.action_id)  # another run's: its ids stay unique in the journal all the same
        if ours and isinstance(rec, StackGroupsRecord):
            if rec.trigger is not None:  # the culprit's frames, arrived after the action: they complete its fingerprint
                ranks = tuple(x for x in rec.trigger.get("ranks") or () if isinstance(x, int))
                frames = fingerprint.culprit_frames(raw)
                if frames and isinstance(rec.trigger.get("kind"), str):
                    r.control = r.control.complete(rec.trigger["kind"], ranks, frames)
            continue
        if ours and event in budget.FOLDED:
            r.spent = budget.fold(r.spent, event, raw, r.mono(rec.t_wall))
        reduce = REDUCERS.get(event)
        if ours and reduce is not None:
            r.n += 1
            reduce(r, rec)
    return _recovered(r, pol)


def _recovered(r: _Replay, pol: Policy) -> Recovered:
    now, state = r.now, r.state
    active = {}
    for key, opened in r.opened.items():
        f = _finding(opened, r.mono)
        if f is not None:
            active[key] = tracker.Active(first=f, latest=f, last_seen=now)
    op, again, interrupted = None, False, []
    # At most one action is ever in flight; older open ones (a coordinator killed
    # twice) were superseded by the one after them.
    for i, (aid, rec) in enumerate(sorted(r.actions.items(), key=lambda kv: kv[1].t_wall or 0)):
        last = i == len(r.actions) - 1
        built = _operation(aid, rec, r.progress.get(aid), r.restarted.get(aid), r.mono, now, pol)
        if last and built is not None and state is not JobState.FAILED:
            op, again = built
            state = JobState.ABORTING if op.action == "abort" else JobState.RESTARTING
            continue
        interrupted.append(
            ActionOutcomeRecord(
                action_id=aid,
                action=rec.action,
                kind=rec.kind,
                ranks=rec.ranks or [],
                ok=False,
                result=(
                    "interrupted: the coordinator restarted before this action stopped anything; nothing was done"
                    if rec.action in RECOVERABLE and aid not in r.progress
                    else "interrupted: the coordinator restarted and cannot carry this action on"
                )
                + " (a restart stays counted)",
            )
        )
    if interrupted and op is None and state not in P.IDLE and state is not JobState.FAILED:
        state = JobState.DEGRADED if active else JobState.RUNNING
    job_control = replace(
        r.control,
        state=state,
        restarts=tuple(sorted(r.restarts + list(r.spent.launcher))),
        by_launcher=len(r.spent.launcher),
        last_action_at=r.last_action,
    )
    return Recovered(
        job=job_control,
        count=r.count,
        op=op,
        restart_op=again,
        interrupted=tuple(interrupted),
        active=active,
        records=r.n,
        spent=r.spent,
    )


def _operation(
    aid: str,
    rec: ActionRecord,
    prog: Progress | None,
    restart_rec: Restarted | None,
    mono: Callable[[Any], float],
    now: float,
    pol: Policy,
) -> tuple[Operation, bool] | None:
    """(operation, start it again) for an action still in flight, or None: nothing
    to carry on (a restart that had not stopped anything yet)."""
    action = rec.action
    if action not in RECOVERABLE:
        return None
    as_found = FindingRecord(kind=rec.kind, ranks=rec.ranks or [], hosts=rec.hosts or [], t_wall=rec.t_wall)
    finding = _finding(replace(as_found, reason=rec.reason or ""), mono)
    if finding is None:
        return None
    op = Operation(
        id=aid,
        action=str(action),
        reason=rec.reason or "",
        finding=finding,
        started=mono(rec.t_wall),
        grace_s=pol.abort_grace_s,
        restart_n=rec.restart or 0,
        phase_at=now,
        extra={"timeout_s": pol.checkpoint_timeout_s, "resume_timeout_s": pol.resume_timeout_s, "recovered": True},
    )
    if prog is None:
        if action == "abort":  # decided, nothing sent: take the stacks and stop the job as it is now
            return op, True
        return None
    workers, launchers = _idents(prog.idents)
    progress = prog if isinstance(prog, ActionProgressRecord) else None
    if progress is not None and progress.reached_step is not None:  # the steps its resume will have cost
        op = replace(op, extra={**op.extra, restart.REACHED: progress.reached_step})  # (restart.steps_lost)
    if restart_rec is not None:
        if isinstance(restart_rec, LauncherRestartRecord):
            op = replace(op, extra={**op.extra, "by": "launcher"})
        return op.at("resume", mono(restart_rec.t_wall), workers=workers, launchers=launchers), False
    if progress is not None and progress.phase == "launcher":  # waiting for the launcher to stop the rest: wait again
        return op.at("launcher", now, workers=workers, launchers=launchers), False
    # Signals were sent: send them again after a grace period, to those processes only.
    return op.at("term", now, workers=workers, launchers=launchers, last_sent=now), False
