"""restart: stop the workers so torchrun's elastic agent restarts the worker
group (--max-restarts); the script resumes from its latest checkpoint. The only
way out of a dead, frozen or hung rank: a hung collective cannot checkpoint.

``exclude_host_restart`` is the same with the culprit host's launcher stopped
too, so torchrun elastic (min:max nodes) re-rendezvouses without it.

1. ``term``: SIGTERM to the workers that existed when the finding was raised
   (never a newer incarnation: torchrun may have restarted one already);
   SIGKILL after the grace period, re-sent every grace period.
2. ``resume``: once they are gone (journal ``restart``), wait until every rank
   of the new incarnation has completed a step; the first step it reported
   is where it resumed (journal ``resumed``). RESUME_TIMEOUT_S without that:
   the restart failed.
"""

from __future__ import annotations

from .. import journal_events as je
from ..view import ClusterView
from .common import Operation, Step, brief, launchers_of, live_workers, old_workers, signals

RESUME_TIMEOUT_S = 300.0


def start(op: Operation, view: ClusterView, now: float) -> Step:
    workers = old_workers(view, op.finding)
    launchers: tuple = ()
    if op.action == "exclude_host_restart":
        bad = frozenset(op.finding.hosts)
        launchers = launchers_of(view, tuple(w for w in workers if w[1][2] in bad))
    op = op.at("term", now, workers=workers, launchers=launchers, last_sent=now)
    live = live_workers(op, view)
    return Step(op, signals(op, "SIGTERM", live, launchers),
                ((je.ACTION_PROGRESS, brief(op, phase="term", signal="SIGTERM", workers=[r for r, _ in live],
                                            launchers=[p for p, _, _ in launchers])),))


def advance(op: Operation, view: ClusterView, now: float) -> Step:
    if op.phase in ("term", "kill"):
        live = live_workers(op, view)
        if not live:
            op = op.at("resume", now)
            return Step(op, (), ((je.RESTART, brief(op, restart=op.restart_n, stopped=[r for r, _ in op.workers],
                                                    seconds=round(now - op.started, 3))),))
        if now - op.last_sent < op.grace_s:
            return Step(op)
        op = op.at("kill", op.phase_at, last_sent=now, kills=op.kills + 1)
        return Step(op, signals(op, "SIGKILL", live, op.launchers),
                    ((je.ACTION_PROGRESS, brief(op, phase="kill", signal="SIGKILL", workers=[r for r, _ in live])),))
    resumed = resumed_step(op, view)
    if resumed is not None:
        step, world = resumed
        return Step(op, (), (
            (je.RESUMED, brief(op, restart=op.restart_n, step=step, world_size=world,
                               seconds=round(now - op.started, 3))),
            (je.ACTION_OUTCOME, brief(op, ok=True, result=f"restart {op.restart_n}, resumed from step {step}",
                                      seconds=round(now - op.started, 3)))), done=True, state_event="resumed")
    if now - op.phase_at >= RESUME_TIMEOUT_S:
        return Step(op, (), ((je.ACTION_OUTCOME, brief(op, ok=False, result=f"no resumed worker group within "
                                                       f"{RESUME_TIMEOUT_S:g} s of the restart")),),
                    done=True, ok=False, state_event="restart_failed")
    return Step(op)


def resumed_step(op: Operation, view: ClusterView) -> tuple[int, int] | None:
    """(step, world size) once every rank of the new incarnation completed a step.
    A rank's first reported step is its step counter minus the steps seen since it
    registered (the example calls set_step(resumed step) right after loading)."""
    old = {(pid, start) for _, (pid, start, _) in op.workers}
    new = [rv for rv in view.ranks.values() if rv.incarnation not in old]
    if not new:
        return None
    world = max(rv.state.world_size for rv in new)
    by_rank = {rv.rank: rv for rv in new}
    if any(r not in by_rank or by_rank[r].steps_seen == 0 for r in range(world)):
        return None
    return min(by_rank[r].state.step - by_rank[r].steps_seen for r in range(world)), world
