"""restart: stop the workers so torchrun's elastic agent restarts the worker
group (--max-restarts); the script resumes from its latest checkpoint. The only
way out of a dead, frozen or hung rank: a hung collective cannot checkpoint.

``exclude_host_restart`` is the same with the culprit host's launcher stopped
too, so torchrun elastic (min:max nodes) re-rendezvouses without it.

0. The launcher first. Every rank the finding names is gone (a dead rank):
   its launcher (torchrun, which restarts through --max-restarts) saw it
   too and is taking the group down itself. ``launcher``: wait up to
   LAUNCHER_GRACE_S for the rest to go without a signal of ours. Once no worker
   is left, the restart is the launcher's: journaled as ``launcher_restart``,
   nothing sent, and the action waits for the resume (2.): the group is never
   restarted a second time for the same failure. Workers still there after
   the grace period get 1.
1. ``term``: SIGTERM to the workers that existed when the finding was raised
   (never a newer incarnation: torchrun may have restarted one already);
   SIGKILL after the grace period, re-sent every grace period.
2. ``resume``: once they are gone (journal ``restart``), wait until every rank
   of the new incarnation has completed a step; the first step it reported
   is where it resumed (journal ``resumed``, with ``steps_lost``: from the step
   the job had reached when the action began to the one it resumed from). RESUME_TIMEOUT_S without that:
   the restart failed, and the outcome says why (``why_not_resumed``: ranks
   stuck inside init_process_group, never back, dead again): the controller
   then escalates to an abort (policy.after_failed_restart).
"""

from __future__ import annotations

from collections.abc import Callable

from watchdog.contracts.journal.actions import (
    ActionOutcomeRecord,
    ActionProgressRecord,
    LauncherRestartRecord,
    RestartRecord,
    ResumedRecord,
)

from ...contracts.finding import ranks_phrase, seconds
from ..view.cluster import ClusterView, FoldedRank
from .operation import ActionStep, Operation, brief, idents, launchers_of, live, live_workers, old_workers, signals

RESUME_TIMEOUT_S = 300.0
REACHED = "reached_step"  # Operation.extra: the job's step when the action began (journaled in its first progress)


def steps_lost(op: Operation, resumed: int) -> int | None:
    """Steps the recovery cost: from the step the fault stopped the job at to the one it
    resumed from (its checkpoint). None where the first is not known."""
    reached = op.extra.get(REACHED)
    return max(0, reached - resumed) if isinstance(reached, int) else None


def start(op: Operation, view: ClusterView, now: float) -> ActionStep:
    workers = old_workers(view, op.finding)
    launchers: tuple = ()
    if op.action == "exclude_host_restart":
        bad = frozenset(op.finding.hosts)
        launchers = launchers_of(view, tuple(w for w in workers if w[1][2] in bad))
    # The step the fault stopped the job at: what the resumed group must do again from its checkpoint.
    reached = max((rv.state.step for rv in view.ranks.values()), default=0)
    op = op.at("term", now, workers=workers, launchers=launchers, last_sent=now, extra={**op.extra, REACHED: reached})
    live = live_workers(op, view)
    if not launchers and not live:
        return launcher_restart(op, now)
    if not launchers and named_gone(op, view):
        op = op.at("launcher", now)
        return ActionStep(
            op,
            (),
            (
                ActionProgressRecord(
                    **brief(op),
                    phase="launcher",
                    waiting_s=LAUNCHER_GRACE_S,
                    workers=[r for r, _ in live],
                    idents=idents(op),
                    reached_step=reached,
                ),
            ),
        )
    return ActionStep(
        op,
        signals(op, "SIGTERM", live, launchers),
        (
            ActionProgressRecord(
                **brief(op),
                phase="term",
                signal="SIGTERM",
                workers=[r for r, _ in live],
                launchers=[p for p, _, _ in launchers],
                idents=idents(op),
                reached_step=reached,
            ),
        ),
    )


LAUNCHER_GRACE_S = 5.0  # torchrun notices a worker's exit within its monitor interval (0.1 s) and stops the rest


def named_gone(op: Operation, view: ClusterView) -> bool:
    """Every rank the finding names is gone (dead, or replaced already)."""
    ident = dict(op.workers)
    return bool(op.finding.ranks) and not any(r in ident and live(view, r, ident[r]) for r in op.finding.ranks)


def launcher_restart(op: Operation, now: float) -> ActionStep:
    """No worker left to stop: the launcher restarts the group (see the module doc)."""
    op = op.at("resume", now, extra={**op.extra, "by": "launcher"})
    gone = [r for r, _ in op.workers]
    return ActionStep(op, (), (LauncherRestartRecord(**brief(op), restart=op.restart_n, gone=gone, idents=idents(op)),))


def advance(op: Operation, view: ClusterView, now: float) -> ActionStep:
    if op.phase == "launcher":
        still = live_workers(op, view)
        if not still:
            return launcher_restart(op, now)
        if now - op.phase_at < LAUNCHER_GRACE_S:
            return ActionStep(op)
        op = op.at("term", now, last_sent=now)
        return ActionStep(
            op,
            signals(op, "SIGTERM", still),
            (ActionProgressRecord(**brief(op), phase="term", signal="SIGTERM", workers=[r for r, _ in still]),),
        )
    if op.phase in ("term", "kill"):
        live = live_workers(op, view)
        if not live:
            op = op.at("resume", now)
            return ActionStep(
                op,
                (),
                (
                    RestartRecord(
                        **brief(op),
                        restart=op.restart_n,
                        stopped=[r for r, _ in op.workers],
                        seconds=round(now - op.started, 3),
                    ),
                ),
            )
        if now - op.last_sent < op.grace_s:
            return ActionStep(op)
        op = op.at("kill", op.phase_at, last_sent=now, kills=op.kills + 1)
        return ActionStep(
            op,
            signals(op, "SIGKILL", live, op.launchers),
            (ActionProgressRecord(**brief(op), phase="kill", signal="SIGKILL", workers=[r for r, _ in live]),),
        )
    resumed = resumed_step(op, view)
    if resumed is not None:
        step, world = resumed
        lost = steps_lost(op, step)
        return ActionStep(
            op,
            (),
            (
                ResumedRecord(
                    **brief(op),
                    restart=op.restart_n,
                    step=step,
                    world_size=world,
                    seconds=round(now - op.started, 3),
                    steps_lost=lost,
                ),
                ActionOutcomeRecord(
                    **brief(op),
                    ok=True,
                    result=f"restart {op.restart_n}{by_whom(op)}, resumed from step {step}"
                    + (f" ({lost} steps lost)" if lost is not None else ""),
                    seconds=round(now - op.started, 3),
                ),
            ),
            done=True,
            state_event="resumed",
        )
    limit = op.extra.get("resume_timeout_s", RESUME_TIMEOUT_S)
    if now - op.phase_at >= limit or all_died_again(op, view, now):
        why = why_not_resumed(op, view, now)
        return ActionStep(
            op,
            (),
            (
                ActionOutcomeRecord(
                    **brief(op),
                    ok=False,
                    result=f"restart failed: {why}",
                    restart=op.restart_n,
                    resume_timeout_s=limit,
                    seconds=round(now - op.started, 3),
                ),
            ),
            done=True,
            ok=False,
            state_event="restart_failed",
        )
    return ActionStep(op)


def by_whom(op: Operation) -> str:
    return " (by the launcher)" if op.extra.get("by") == "launcher" else ""


DIED_AGAIN_S = 20.0  # every new worker dead this long, none newer: the launcher gave up, not restarting


def all_died_again(op: Operation, view: ClusterView, now: float) -> bool:
    """Every rank's newest process is a new one that died (a restart that fails
    at init), and none came since for DIED_AGAIN_S: no reason to wait out the
    resume timeout. A launcher with restarts left makes newer ones sooner."""
    old = {(pid, start) for _, (pid, start, _) in op.workers}
    world = view.world_size or max((rv.state.world_size for rv in view.ranks.values()), default=0)
    ranks = [view.ranks.get(r) for r in range(world)]
    if not world or any(rv is None or rv.incarnation in old or rv.state.alive or rv.died_at is None for rv in ranks):
        return False
    return all(rv is not None and rv.died_at is not None and now - rv.died_at >= DIED_AGAIN_S for rv in ranks)


def why_not_resumed(op: Operation, view: ClusterView, now: float) -> str:
    """Where the new worker group stands, rank by rank, in one line: what a
    person needs to tell a script that cannot restart (every rank stuck inside
    init_process_group: a stale rendezvous store) from a rank that keeps dying."""
    old = {(pid, start) for _, (pid, start, _) in op.workers}
    world = view.world_size or max((rv.state.world_size for rv in view.ranks.values()), default=0)
    new = {rv.rank: rv for rv in view.ranks.values() if rv.incarnation not in old}
    groups: dict[str, list[int]] = {}
    for r in range(world):
        rv = new.get(r)
        if rv is None:
            key = "never came back (no new process registered)"
        elif not rv.state.alive or rv.state.status in ("exited", "failed"):
            cause = rv.state.death.get("summary", "")
            key = f"died again{': ' + cause if cause else ''}"
        elif rv.state.pg_state == "initializing":
            key = "stuck inside init_process_group"
        elif rv.state.pg_state == "none":
            key = "alive but not yet at init_process_group"
        elif rv.steps_seen == 0:
            key = "joined the process group but completed no step"
        else:
            continue
        groups.setdefault(key, []).append(r)
    if not groups:
        return f"no resumed worker group within {seconds(now - op.phase_at)} of the restart"
    return (
        "; ".join(f"{ranks_phrase(rs)} {why}" for why, rs in groups.items())
        + f" ({seconds(now - op.phase_at)} after the old workers were gone)"
    )


def resumed_step(op: Operation, view: ClusterView) -> tuple[int, int] | None:
    """(step, world size) once every rank of the new incarnation completed a step."""
    old = {(pid, start) for _, (pid, start, _) in op.workers}
    return first_steps(view, lambda rv: rv.incarnation not in old)


def first_steps(view: ClusterView, is_new: Callable[[FoldedRank], bool]) -> tuple[int, int] | None:
    """(step, world size) once every rank of a new worker group (``is_new``) completed a step.
    A rank's first reported step is its step counter minus the steps seen since it
    registered (the example calls set_step(resumed step) right after loading)."""
    new = [rv for rv in view.ranks.values() if is_new(rv)]
    if not new:
        return None
    world = max(rv.state.world_size for rv in new)
    by_rank = {rv.rank: rv for rv in new}
    if any(r not in by_rank or by_rank[r].steps_seen == 0 for r in range(world)):
        return None
    return min(by_rank[r].state.step - by_rank[r].steps_seen for r in range(world)), world
