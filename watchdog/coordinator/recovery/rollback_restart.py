"""rollback_restart: for a training anomaly (loss_anomaly). Tell every host's
agent which checkpoint is the last good one (``rollback`` command: the run
directory's rollback file, see watchdog.hook.rollback), then restart as
``restart`` does: the script resumes from its newest checkpoint before the step
the anomaly was first seen at.

The rollback commands go first, in the same replies as the SIGTERMs: an agent
runs one host's commands in order, so the file is in place before any worker of
that host is stopped, long before torchrun starts their replacements. A finding
without a step (no anomaly step in its evidence) restarts from the newest
checkpoint, and says so.
"""

from __future__ import annotations

from watchdog.contracts import commands
from watchdog.contracts.journal.actions import ActionProgressRecord

from ..evidence.plan import CommandRequest
from ..view.cluster import ClusterView
from . import restart
from .operation import ActionStep, Operation, brief, old_workers


def before_step(op: Operation) -> int | None:
    step = op.finding.evidence.get("step") if isinstance(op.finding.evidence, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else None


def start(op: Operation, view: ClusterView, now: float) -> ActionStep:
    step = before_step(op)
    nxt = restart.start(op, view, now)
    if step is None:
        note = ActionProgressRecord(
            **brief(op),
            phase="rollback",
            error="the finding names no anomaly step: restarting from the newest checkpoint",
        )
        return ActionStep(nxt.op, nxt.requests, (note, *nxt.events))
    hosts = sorted({host for _, (_, _, host) in old_workers(view, op.finding)})
    reqs = tuple(
        CommandRequest(
            host=h,
            type=commands.ROLLBACK,
            targets=(),
            trigger=op.trigger(),
            args={"before_step": step, "action": op.id},
        )
        for h in hosts
    )
    note = ActionProgressRecord(**brief(op), phase="rollback", before_step=step, hosts=hosts)
    return ActionStep(nxt.op, reqs + nxt.requests, (note, *nxt.events))


def advance(op: Operation, view: ClusterView, now: float) -> ActionStep:
    return restart.advance(op, view, now)
