"""abort: capture every rank's stack, then stop the launcher(s) and the workers.

1. ``stacks``: py-spy stacks of every live rank of the job (non-blocking for a
   stopped rank, see the agent), journaled as ``evidence``; at most
   STACKS_WAIT_S, so a dump that never answers cannot delay the abort.
2. ``term``: SIGTERM to each launcher *first* (under torchrun with
   --max-restarts > 0, a launcher that sees its workers die before its own
   signal would restart them), then to every worker.
3. After the grace period, SIGKILL to whatever is still alive (launchers too),
   re-sent every grace period until the workers are gone.

Done when no worker of the job is alive; the job state becomes ``failed``.
"""

from __future__ import annotations

from watchdog.contracts import commands
from watchdog.contracts.journal.actions import ActionOutcomeRecord, ActionProgressRecord

from ...contracts.finding import ranks_phrase
from ..evidence.plan import CommandRequest
from ..evidence.stack_plan import MAX_PER_HOST
from ..view.cluster import ClusterView
from .operation import ActionStep, Operation, brief, idents, launchers_of, live_workers, old_workers, signals

STACKS_WAIT_S = 15.0
MAX_KILL_ROUNDS = 3


def start(op: Operation, view: ClusterView, now: float) -> ActionStep:
    workers = old_workers(view, op.finding)
    op = op.at("stacks", now, workers=workers, launchers=launchers_of(view, workers))
    by_host: dict[str, list] = {}
    for rank, (pid, start_us, host) in live_workers(op, view):
        by_host.setdefault(host, []).append(commands.target(rank, pid, start_us))
    # Never more than a host can give (stack_plan's cap): the culprits first, so they are never the ones cut.
    first = set(op.finding.ranks)
    reqs = tuple(
        CommandRequest(
            host=h,
            type=commands.DUMP_STACKS,
            trigger=op.trigger(),
            targets=tuple(
                sorted(
                    sorted(ts, key=lambda t: (t["rank"] not in first, t["rank"]))[:MAX_PER_HOST],
                    key=lambda t: t["rank"],
                )
            ),
        )
        for h, ts in sorted(by_host.items())
    )
    op = op.at("stacks", now, hosts_asked=frozenset(by_host))
    if not reqs:
        return _term(op, view, now)
    return ActionStep(op, reqs)


def _term(op: Operation, view: ClusterView, now: float) -> ActionStep:
    live = live_workers(op, view)
    op = op.at("term", now, last_sent=now)
    return ActionStep(
        op,
        signals(op, "SIGTERM", live, op.launchers),
        (
            ActionProgressRecord(
                **brief(op),
                phase="term",
                signal="SIGTERM",
                workers=[r for r, _ in live],
                launchers=[p for p, _, _ in op.launchers],
                idents=idents(op),
            ),
        ),
    )


def advance(op: Operation, view: ClusterView, now: float) -> ActionStep:
    if op.phase == "stacks":
        if op.hosts_asked <= op.hosts_answered or now - op.phase_at >= STACKS_WAIT_S:
            return _term(op, view, now)
        return ActionStep(op)
    live = live_workers(op, view)
    if not live:
        return ActionStep(
            op,
            (),
            (
                ActionOutcomeRecord(
                    **brief(op),
                    ok=True,
                    result="aborted: every worker is gone",
                    seconds=round(now - op.started, 3),
                    kill_rounds=op.kills,
                ),
            ),
            done=True,
            ok=True,
            state_event="aborted",
        )
    if now - op.last_sent < op.grace_s:
        return ActionStep(op)
    # A process in uninterruptible sleep (D state: inside the kernel, a hung NFS or
    # driver call) ignores even SIGKILL until the call returns, which may be never:
    # say so after one SIGKILL round instead of waiting on it.
    unkillable = [r for r, _ in live if view.ranks[r].state.proc_status == "disk-sleep"]
    if op.kills >= MAX_KILL_ROUNDS or (op.kills >= 1 and len(unkillable) == len(live)):
        result = "workers still alive after SIGKILL"
        if unkillable:
            result += (
                f": {ranks_phrase(unkillable)} in uninterruptible sleep (D state), which no signal ends "
                f"until the kernel call returns; the host needs attention"
            )
        return ActionStep(
            op,
            (),
            (
                ActionOutcomeRecord(
                    **brief(op), ok=False, result=result, alive=[r for r, _ in live], d_state=unkillable
                ),
            ),
            done=True,
            ok=False,
            state_event="aborted",
        )
    op = op.at("kill", op.phase_at, last_sent=now, kills=op.kills + 1)
    return ActionStep(
        op,
        signals(op, "SIGKILL", live, op.launchers),
        (ActionProgressRecord(**brief(op), phase="kill", signal="SIGKILL", workers=[r for r, _ in live]),),
    )
