"""What a restart the launcher made on its own cost in steps.

torchrun ``--max-restarts`` replaces the worker group by itself; control/budget.py counts
that restart. Its cost is measured as the monitor's own restart's is
(actions/restart.py): from the step the fault stopped the job at (the highest step
the replaced ranks had reached: the budget's fold of their ``rank_restarted``
records) to the step the new group resumed from (its first reported step, after
loading its checkpoint), once every rank of the new group (incarnations first seen
since the restart) has completed a step. The coordinator journals that as
``resumed`` with ``by: launcher`` and ``steps_lost``, and counts the steps with
the monitor's (``watchdog_coordinator_steps_lost_total``).

A launcher restart whose group never resumed, followed by another (the new group
died at init), is one recovery: the later resume is measured from the step the
first one stopped the job at. A restart of the monitor's own, begun meanwhile,
measures the resume itself (the coordinator drops this one).

Pure: the view, the budget and the time are arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from watchdog.contracts.journal.actions import ResumedRecord

from ..recovery.restart import first_steps
from ..view.cluster import ClusterView
from .budget import Spent


@dataclass(frozen=True)
class Awaiting:
    """A launcher restart whose new group has not resumed yet."""

    restart: int  # its number in the job's restart budget
    index: int  # its place in ``Spent.launcher``
    at: float  # when its first new incarnation was seen
    carried: int = -1  # the step an earlier launcher restart, never resumed, had stopped the job at


def follow(prev: Awaiting | None, restart: int, index: int, at: float, spent: Spent) -> Awaiting:
    """The launcher restarted the group (again, where ``prev`` never resumed)."""
    return Awaiting(restart, index, at, reached(prev, spent) if prev is not None else -1)


def reached(aw: Awaiting, spent: Spent) -> int:
    """The step the fault stopped the job at (-1: unknown). Read from the budget each
    time: ranks of the same restart reported later may raise it."""
    own = spent.reached[aw.index] if aw.index < len(spent.reached) else -1
    return max(own, aw.carried)


def resumed(aw: Awaiting, view: ClusterView, now: float, spent: Spent) -> ResumedRecord | None:
    """The ``resumed`` record once every rank of the new group completed a step, else None."""
    where = first_steps(view, lambda rv: rv.registered_at >= aw.at)
    if where is None:
        return None
    step, world = where
    stopped = reached(aw, spent)
    return ResumedRecord(
        restart=aw.restart,
        by="launcher",
        step=step,
        world_size=world,
        seconds=round(now - aw.at, 3),
        steps_lost=max(0, stopped - step) if stopped >= 0 else None,
    )
