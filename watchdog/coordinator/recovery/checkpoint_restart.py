"""checkpoint_restart: for faults where every rank still makes progress (a
straggler, starvation). Loses no step after the checkpoint.

1. ``checkpoint``: pick S just ahead of the fastest rank (far enough that the
   request reaches every rank before it gets there: LEAD_S of steps, at least
   MIN_AHEAD) and ask every rank, through its slot's control block, to run the
   user's registered save function at the end of step S. The hook acks in the
   slot; the agents report the acks (RankState.ctrl_ack_*).
2. Every rank acked S: journal ``checkpointed``, then restart (restart.py).
   A failed save, a rank that saved at another step (the request came late) or
   no acks by the policy's checkpoint timeout: journal ``checkpoint_failed`` and
   restart from the last checkpoint anyway (the fault is still there).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from watchdog.contracts import commands
from watchdog.contracts.journal.actions import ActionProgressRecord, CheckpointedRecord, CheckpointFailedRecord

from ..evidence.plan import CommandRequest
from ..view.cluster import ClusterView
from . import restart
from .operation import ActionStep, Ident, Operation, brief, live, live_workers, old_workers

LEAD_S = 4.0
MIN_AHEAD = 5


def target_step(view: ClusterView, workers: Sequence[tuple[int, Ident]]) -> int:
    states = [view.ranks[r] for r, _ in workers]
    step_s = statistics.median([rv.p99_step_s or rv.state.last_step_s or 0.1 for rv in states]) or 0.1
    return max(rv.state.step for rv in states) + max(MIN_AHEAD, math.ceil(LEAD_S / step_s))


def start(op: Operation, view: ClusterView, now: float) -> ActionStep:
    workers = old_workers(view, op.finding)
    op = op.at("checkpoint", now, workers=workers)
    alive = live_workers(op, view)
    if not alive:
        return restart.start(op, view, now)
    step = target_step(view, alive)
    by_host: dict[str, list] = {}
    for rank, (pid, start_us, host) in alive:
        by_host.setdefault(host, []).append(commands.target(rank, pid, start_us))
    reqs = tuple(
        CommandRequest(
            host=h, type=commands.CHECKPOINT, targets=tuple(ts), trigger=op.trigger(), args={"step": step, "ranks": ts}
        )
        for h, ts in sorted(by_host.items())
    )
    op = op.at("checkpoint", now, extra={**op.extra, "step": step, "ranks": [r for r, _ in alive]})
    return ActionStep(
        op, reqs, (ActionProgressRecord(**brief(op), phase="checkpoint", step=step, workers=op.extra["ranks"]),)
    )


def advance(op: Operation, view: ClusterView, now: float) -> ActionStep:
    if op.phase != "checkpoint":
        return restart.advance(op, view, now)
    step, acks, bad = op.extra["step"], [], []
    for rank, ident in op.workers:
        if rank not in op.extra["ranks"]:
            continue
        if not live(view, rank, ident):
            bad.append(f"rank {rank} is gone")
            continue
        s = view.ranks[rank].state
        if s.ctrl_ack_seq > 0 and s.ctrl_ack_step >= step:
            acks.append(rank)
            if not s.ctrl_ack_ok or s.ctrl_ack_step != step:
                bad.append(f"rank {rank} {'failed to save' if not s.ctrl_ack_ok else f'saved at {s.ctrl_ack_step}'}")
    timed_out = now - op.phase_at >= op.extra.get("timeout_s", 120.0)
    if not bad and len(acks) == len(op.extra["ranks"]):
        nxt = restart.start(op, view, now)
        return ActionStep(
            nxt.op,
            nxt.requests,
            (
                CheckpointedRecord(**brief(op, ranks=sorted(acks)), step=step, seconds=round(now - op.phase_at, 3)),
                *nxt.events,
            ),
            state_event="checkpoint_done",
        )
    if bad or timed_out:
        why = (
            "; ".join(bad)
            or f"no checkpoint from ranks {sorted(set(op.extra['ranks']) - set(acks))} within "
            f"{op.extra.get('timeout_s', 120.0):g} s"
        )
        nxt = restart.start(op, view, now)
        return ActionStep(
            nxt.op,
            nxt.requests,
            (CheckpointFailedRecord(**brief(op), step=step, error=why), *nxt.events),
            state_event="checkpoint_timeout",
        )
    return ActionStep(op)
