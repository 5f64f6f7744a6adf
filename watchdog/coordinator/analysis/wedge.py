"""Wedged together: every rank of the job stopped in the same instant.

A fabric, driver or filesystem wedge (or a scheduler's suspend of every node)
stops every rank at once: nobody is missing from anything, nobody stopped first
for a reason of its own. Naming a rank for it accuses the innocent, so
frozen_rank and collective_hang leave it to the ``wedged`` verdict
(detectors/wedged.py), which names the hosts and the group, never a rank, and
which never counts against a rank or a host (finding.BLAMELESS_KINDS).

This module holds the frozen half of the rule, which frozen_rank and
collective_hang consult; the other half (every live rank waiting in one
collective past the hang deadline, none missing) is collective_hang's own
analysis with no culprit. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import DetectorConfig
from ..view.cluster import ClusterView
from .health import EXITED, FROZEN, RETIRED, classify_all, quiet_hosts
from .tick_memo import per_tick

# The hook beats every 0.5 s (heartbeat_interval_s): ranks stopped in one instant
# last beat up to that far apart. Agents read the beat in nanoseconds.
TOGETHER_S = 0.6


@dataclass(frozen=True)
class Frozen:
    ranks: tuple[int, ...]  # every live rank of the job
    hosts: tuple[str, ...]
    first: float  # the earliest last heartbeat
    span_s: float  # from the earliest last heartbeat to the latest


RESUMED_S = 5.0  # a rank resumed this recently from a stop that began with the others' is still in the wedge


@per_tick(view_arg=1)
def frozen_together(now: float, view: ClusterView, cfg: DetectorConfig) -> Frozen | None:
    """Every rank of the job (two or more, not exited or retired) frozen, their
    heartbeats stopped within ``TOGETHER_S`` of each other, every host heard from
    since: else None. A dead or lost rank, or one still beating, is someone
    missing: then it is not a wedge. A rank that runs again after a stop that began
    in the same instant (``FoldedRank.resumed``) is the wedge ending, seen from a host
    whose agent reported first: it is not a rank that kept going.

    While ranks wait in a collective, a frozen rank outside it is missing from it
    and holds them, not wedged with them, unless every frozen rank was stopped by
    a signal (a job-wide suspend stops the waiters too). A running rank's freeze
    is a call that keeps the GIL; a rank stopped alone leaves its waiters frozen
    *running*, since a peer in DDP's all-reduce of an unmodified script keeps the
    GIL and froze its heartbeat within half a second of the stop
    (tests/test_e2e_periodic.py). Either way frozen_rank names the rank outside
    and spares the waiters."""
    health = classify_all(view, now, cfg)
    if FROZEN not in health.values():
        return None  # nearly every tick: no frozen rank at all
    live = [r for r, h in health.items() if h not in (EXITED, RETIRED)]
    if len(live) < 2 or quiet_hosts(view, now):
        return None
    stops = []
    waiting = any(view.ranks[r].state.coll.outstanding for r in live)
    outside = running = False  # of the frozen ranks: one outside the collective, one not stopped
    for r in live:
        rv = view.ranks[r]
        if health[r] == FROZEN:
            s = rv.state
            outside |= waiting and not s.coll.outstanding
            running |= s.proc_status != "stopped"
            stops.append(rv.last_heartbeat())
        elif rv.resumed is not None and now - rv.resumed[1] <= RESUMED_S:
            stops.append(rv.resumed[0])
        else:
            return None  # it kept going: someone is missing from the stop
    if outside and running:
        return None  # a rank outside the collective holds the others (docstring); not one instant's stop
    first, last = min(stops), max(stops)
    if last - first > TOGETHER_S:
        return None
    hosts = tuple(sorted({view.ranks[r].host for r in live}))
    return Frozen(tuple(sorted(live)), hosts, first, last - first)
