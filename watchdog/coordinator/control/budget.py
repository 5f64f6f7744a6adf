"""The job-wide restart budget counts every restart of the job, whoever made it.

The coordinator's own restarts are its ``action`` records (control/replay.py counts them
from the journal). A launcher restarts the group by itself too (torchrun
``--max-restarts``: a worker failed and the elastic agent started a new group);
the coordinator sees it as new incarnations of ranks (``rank_restarted``) while
no action of its own is in flight. Both draw on the one budget
(``policy.Policy.max_restarts`` / ``max_restarts_per_hour``): a job whose launcher
already spent it is aborted on the next failure instead of restarted again.

Pure: ``fold`` reduces journaled facts, one at a time, in journal order, and reads
exactly: the event name; for ``action``, its ``action`` and ``dry_run``; for
``action_outcome``, nothing more; for the events in ``LAUNCHER_RESTART_EVENTS``,
``old_step`` (the step the replaced incarnation had reached: what the restart's
resume costs, control/relaunch.py); and the record's time (the caller's clock). The coordinator folds
each record as it journals it, ``recover.replay`` folds the journal at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..journal import event_names as je

# Records that say a launcher replaced ranks. The seam for a launcher's own
# restart event: a record naming the launcher restart directly joins this tuple.
LAUNCHER_RESTART_EVENTS: tuple[str, ...] = (je.RANK_RESTARTED,)
# Incarnation changes this close to the first of a restart are the same restart
# (every rank of every node comes back within a rendezvous: seconds).
SAME_RESTART_S = 10.0
# After the coordinator's own action ends, the ranks it restarted may still be
# registering: their incarnations are its restart's, not the launcher's.
SETTLE_S = 10.0
# The records ``fold`` reads; any other leaves the budget as it was.
FOLDED = frozenset({je.ACTION, je.ACTION_OUTCOME, *LAUNCHER_RESTART_EVENTS})


@dataclass(frozen=True)
class Spent:
    launcher: tuple[float, ...] = ()  # when each launcher restart was first seen
    reached: tuple[int, ...] = ()  # for each, the highest step its replaced ranks had reached (-1: none said)
    in_flight: bool = False  # a coordinator action (not a dry run) is under way
    settle_until: float = float("-inf")  # its restarted ranks may register until then


def fold(spent: Spent, event: str, rec: Mapping[str, Any], t: float) -> Spent:
    """``spent`` after the journaled record ``rec`` (``event``) at time ``t``."""
    if event == je.ACTION:
        return spent if rec.get("dry_run") else replace(spent, in_flight=True)
    if event == je.ACTION_OUTCOME:
        return replace(spent, in_flight=False, settle_until=t + SETTLE_S)
    if event not in LAUNCHER_RESTART_EVENTS or spent.in_flight or t <= spent.settle_until:
        return spent
    old = rec.get("old_step")
    step = old if isinstance(old, int) and not isinstance(old, bool) else -1
    if spent.launcher and t - spent.launcher[-1] <= SAME_RESTART_S:  # another rank of the same restart
        return spent if step <= spent.reached[-1] else replace(spent, reached=spent.reached[:-1] + (step,))
    return replace(spent, launcher=spent.launcher + (t,), reached=spent.reached + (step,))
