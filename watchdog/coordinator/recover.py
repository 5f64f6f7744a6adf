"""Decisions that survive a coordinator restart: the job's control state rebuilt
from its journal at start.

A coordinator killed mid-restart and started again on the same journal must not
restart the job a second time, reset the restart budget or forget the cooldown.
Everything it needs was journaled when it was decided, so ``replay`` is a pure
function of the records and the clocks:

- restart budget: every ``action`` (not a dry run) with a ``restart`` number,
  and the restarts the launcher made by itself (budget.py);
- cooldown: the last ``action`` / ``action_outcome``;
- the failures restarts were spent on (repeats.py): each restarting action's
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

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from . import budget, fingerprint, tracker
from . import journal_events as je
from . import policy as P
from .actions import restart
from .actions.common import Operation
from .finding import Finding

# The actions rebuilt mid-flight: each goes through restart.py's ``term`` -> ``resume``
# phases or abort's. Any other action found in flight is closed as interrupted.
RECOVERABLE = frozenset({"abort", "restart", "checkpoint_restart", "exclude_host_restart", "rollback_restart"})
# The records a decision is rebuilt from; a journal with none of them is a fresh start.
DECISIONS = frozenset(
    {
        je.ACTION,
        je.ACTION_PROGRESS,
        je.RESTART,
        je.LAUNCHER_RESTART,
        je.ACTION_OUTCOME,
        je.STATE,
        je.FINDING,
        je.EXPECTED_FINDING,
        je.RESOLVED,
    }
)


@dataclass(frozen=True)
class Recovered:
    job: P.JobControl = field(default_factory=P.JobControl)
    count: int = 0  # the highest action number used
    op: Operation | None = None  # the action in flight, rebuilt
    restart_op: bool = False  # op must be started again (an abort that had sent nothing)
    interrupted: tuple[dict[str, Any], ...] = ()  # action_outcome payloads to journal: actions closed here
    active: dict[tracker.Key, tracker.Active] = field(default_factory=dict)
    records: int = 0  # of this job's decision records (DECISIONS), read
    spent: budget.Spent = field(default_factory=budget.Spent)  # the restarts the launcher made (budget.py)

    @property
    def empty(self) -> bool:
        return self.records == 0 and not self.spent.launcher and self.count == 0

    def summary(self, now: float) -> dict[str, Any]:
        """The ``recovered`` journal record."""
        return {
            "records": self.records,
            "job_state": self.job.state.value,
            "restarts_used": len(self.job.restarts),
            "restarts_last_hour": sum(1 for t in self.job.restarts if now - t < 3600.0),
            "last_action_s_ago": round(now - self.job.last_action_at, 3)
            if self.job.last_action_at is not None
            else None,
            "next_action_id": f"a-{self.count + 1}",
            "in_flight": (
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
            "interrupted": [o["action_id"] for o in self.interrupted],
            "open_findings": [{"kind": k, "ranks": list(r)} for k, r in self.active],
        }


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _finding(rec: dict[str, Any], mono: Any) -> Finding | None:
    evidence = rec.get("evidence")
    try:
        return Finding(
            kind=str(rec["kind"]),
            ranks=tuple(int(r) for r in rec.get("ranks") or ()),
            hosts=tuple(str(h) for h in rec.get("hosts") or ()),
            reason=str(rec.get("reason", "")),
            onset_mono=mono(rec.get("onset_wall") or rec["t_wall"]),
            detected_mono=mono(rec.get("detected_wall") or rec["t_wall"]),
            evidence=evidence if isinstance(evidence, dict) else {},
            wants_stacks=tuple(int(r) for r in rec.get("wants_stacks") or ()),
            onset_wall=float(rec.get("onset_wall") or rec["t_wall"]),
            detected_wall=float(rec.get("detected_wall") or rec["t_wall"]),
        )
    except (KeyError, TypeError, ValueError):
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


def replay(
    records: Iterable[dict[str, Any]], now: float, wall: float, job: str, pol: P.Policy, run_id: str = ""
) -> Recovered:
    """The control state the journal's records imply, at (``now``, ``wall``). Pure.
    ``run_id``: only the segments whose ``start`` record names this run count (empty: all)."""

    def mono(t_wall: Any) -> float:
        t = _num(t_wall)
        return now - (wall - t) if t is not None else now

    ours = same_job = True
    n = 0
    state = P.JobState.RUNNING
    restarts: list[float] = []
    last_action: float | None = None
    count = 0
    actions: dict[str, dict[str, Any]] = {}  # id -> its action record, while open
    progress: dict[str, dict[str, Any]] = {}  # id -> its first action_progress with idents
    restarted: dict[str, dict[str, Any]] = {}  # id -> its restart record
    opened: dict[tracker.Key, dict[str, Any]] = {}
    control = P.JobControl()  # its fingerprint history: what restarts were spent on (repeats.py)
    spent = budget.Spent()  # and the launcher's own restarts: the budget is the job's
    for rec in records:
        event = rec.get("event")
        if event == je.START:
            same_job = not job or not rec.get("job") or rec.get("job") == job
            ours = same_job and (not run_id or rec.get("run_id") == run_id)
            continue
        aid = rec.get("action_id")
        if same_job and not ours and event == je.ACTION and isinstance(aid, str):
            num = aid.partition("-")[2]  # another run's: its ids stay unique in the journal all the same
            count = max(count, int(num)) if num.isdigit() else count
        if ours and event == je.STACK_GROUPS and isinstance(rec.get("trigger"), dict):
            # the culprit's frames, arrived after the action: they complete its fingerprint
            trig = rec["trigger"]
            ranks = tuple(r for r in trig.get("ranks") or () if isinstance(r, int))
            frames = fingerprint.culprit_frames(rec)
            if frames and isinstance(trig.get("kind"), str):
                control = control.complete(trig["kind"], ranks, frames)
            continue
        if ours:
            spent = budget.fold(spent, str(event), rec, mono(rec.get("t_wall")))
        if not ours or event not in DECISIONS:
            continue
        n += 1
        aid = rec.get("action_id")
        if event == je.ACTION and isinstance(aid, str):
            num = aid.partition("-")[2]
            count = max(count, int(num)) if num.isdigit() else count
            if rec.get("dry_run"):
                last_action = mono(rec.get("t_wall"))
                continue
            last_action = mono(rec.get("t_wall"))
            if isinstance(rec.get("restart"), int) and rec.get("action") in P.RESTARTING_ACTIONS:
                restarts.append(last_action)
                fp = fingerprint.from_dict(rec.get("fingerprint"))
                if fp is not None:
                    control = control.remember(fp)
            actions[aid] = rec
        elif event == je.ACTION_PROGRESS and isinstance(aid, str) and aid in actions and "idents" in rec:
            progress.setdefault(aid, rec)
        elif event == je.RESTART and isinstance(aid, str) and aid in actions:
            restarted[aid] = rec
        elif event == je.LAUNCHER_RESTART and isinstance(aid, str) and aid in actions:
            # the launcher restarted the group: the processes it names, then the resume
            progress.setdefault(aid, rec)
            restarted[aid] = rec
        elif event == je.ACTION_OUTCOME and isinstance(aid, str):
            actions.pop(aid, None)
            last_action = mono(rec.get("t_wall"))
        elif event == je.STATE and "job_state" in rec and "rank" not in rec:
            try:
                state = P.JobState(rec["job_state"])
            except ValueError:
                pass
        elif event in (je.FINDING, je.EXPECTED_FINDING) and isinstance(rec.get("kind"), str):
            opened[(rec["kind"], tuple(rec.get("ranks") or ()))] = rec
        elif event == je.RESOLVED and isinstance(rec.get("kind"), str):
            opened.pop((rec["kind"], tuple(rec.get("ranks") or ())), None)
    active = {}
    for key, rec in opened.items():
        f = _finding(rec, mono)
        if f is not None:
            active[key] = tracker.Active(first=f, latest=f, last_seen=now)
    op, again, interrupted = None, False, []
    # At most one action is ever in flight; older open ones (a coordinator killed
    # twice) were superseded by the one after them.
    for i, (aid, rec) in enumerate(sorted(actions.items(), key=lambda kv: kv[1].get("t_wall", 0))):
        last = i == len(actions) - 1
        built = _operation(aid, rec, progress.get(aid), restarted.get(aid), mono, now, pol)
        if last and built is not None and state is not P.JobState.FAILED:
            op, again = built
            state = P.JobState.ABORTING if op.action == "abort" else P.JobState.RESTARTING
            continue
        interrupted.append(
            {
                "action_id": aid,
                "action": rec.get("action"),
                "kind": rec.get("kind"),
                "ranks": rec.get("ranks") or [],
                "ok": False,
                "result": (
                    "interrupted: the coordinator restarted before this action stopped anything; nothing was done"
                    if rec.get("action") in RECOVERABLE and aid not in progress
                    else "interrupted: the coordinator restarted and cannot carry this action on"
                )
                + " (a restart stays counted)",
            }
        )
    if interrupted and op is None and state not in P.IDLE and state is not P.JobState.FAILED:
        state = P.JobState.DEGRADED if active else P.JobState.RUNNING
    job_control = replace(
        control,
        state=state,
        restarts=tuple(sorted(restarts + list(spent.launcher))),
        by_launcher=len(spent.launcher),
        last_action_at=last_action,
    )
    return Recovered(
        job=job_control,
        count=count,
        op=op,
        restart_op=again,
        interrupted=tuple(interrupted),
        active=active,
        records=n,
        spent=spent,
    )


def _operation(
    aid: str,
    rec: dict[str, Any],
    prog: dict[str, Any] | None,
    restart_rec: dict[str, Any] | None,
    mono: Any,
    now: float,
    pol: P.Policy,
) -> tuple[Operation, bool] | None:
    """(operation, start it again) for an action still in flight, or None: nothing
    to carry on (a restart that had not stopped anything yet)."""
    action = rec.get("action")
    if action not in RECOVERABLE:
        return None
    finding = _finding({**rec, "reason": rec.get("reason", "")}, mono)
    if finding is None:
        return None
    started = mono(rec.get("t_wall"))
    restart_n = rec["restart"] if isinstance(rec.get("restart"), int) else 0
    op = Operation(
        id=aid,
        action=str(action),
        reason=str(rec.get("reason", "")),
        finding=finding,
        started=started,
        grace_s=pol.abort_grace_s,
        restart_n=restart_n,
        phase_at=now,
        extra={"timeout_s": pol.checkpoint_timeout_s, "resume_timeout_s": pol.resume_timeout_s, "recovered": True},
    )
    if prog is None:
        if action == "abort":  # decided, nothing sent: take the stacks and stop the job as it is now
            return op, True
        return None
    workers, launchers = _idents(prog.get("idents"))
    if isinstance(prog.get("reached_step"), int):  # the steps its resume will have cost (restart.steps_lost)
        op = replace(op, extra={**op.extra, restart.REACHED: prog["reached_step"]})
    if restart_rec is not None:
        if restart_rec.get("event") == je.LAUNCHER_RESTART:
            op = replace(op, extra={**op.extra, "by": "launcher"})
        return op.at("resume", mono(restart_rec.get("t_wall")), workers=workers, launchers=launchers), False
    if prog.get("phase") == "launcher":  # waiting for the launcher to stop the rest: wait again
        return op.at("launcher", now, workers=workers, launchers=launchers), False
    # Signals were sent: send them again after a grace period, to those processes only.
    return op.at("term", now, workers=workers, launchers=launchers, last_sent=now), False
