"""frozen_rank: the process exists but its heartbeat stopped.

SIGSTOP, a debugger, swap death, or a C extension holding the GIL: the hook's
heartbeat thread cannot run. Judged on the heartbeat age the agent read (a late
report is a host problem, dead_rank's business), and only once the heartbeat
was seen to beat in this incarnation (so a hook without a running heartbeat is
never "frozen"). Ranks frozen while waiting in a collective that an earlier
failed or stuck rank never entered are victims and get no finding. The agent's
OS process state tells "stopped" (SIGSTOP: then a third of the threshold is
enough) and CPU use tells "blocked" (~0%) from "spinning in native code" (~100%).

Ranks whose heartbeats stopped together are one finding. A scheduler's suspend
(Slurm stops every rank), a hung shared filesystem or a debugger attached to a
node freezes many ranks in the same instant: one event with one cause outside
the ranks, where a finding per rank was 16,384 findings at 16,384 ranks (each
one a journal line, an alert's worth of noise, a stack to gather). Heartbeats
that stopped within ``TOGETHER_S`` of the earliest are named together, as
dead_rank names deaths it cannot order. A group is named once no rank that
looks fine may have stopped with it (each beat after that instant, as its agent
read it), or after 1.5 report intervals, so it opens whole rather than as a
first few ranks that later findings add to. A lone frozen rank waits only for
hosts that reported within that instant's window and not since: none at 1 s
report intervals (other ranks' agents have read them beating after it), up to
a second at 16,384 ranks with agents slowed to 2-3 s (docs/benchmarks.md). When that
group is every rank of the job, it is nobody's: the ``wedged`` verdict (analysis/wedge.py).

A running rank (not stopped) whose heartbeat froze before and beat again by
itself (a call that holds the GIL every N steps: an upload through a C library,
a big regex) is expected to freeze as long again: its recurrence is named only
past 1.25x the longest such freeze plus 2 s (``intermittent_stalls.expected_freeze_s``, the
rule collective_hang gives a stall seen before in the same frame), and the
periodic_stall advisory says the pattern. A first freeze is named as before
(nothing was known yet), a stopped rank at once, one that never ends past
that allowance.
"""

from __future__ import annotations

from collections import Counter
from itertools import compress, repeat
from operator import and_, eq, itemgetter, le, sub
from typing import NamedTuple

from ...contracts.finding import Finding, ranks_phrase, seconds
from ..analysis.health import FROZEN, OK, Blame, analyze, classify_all, victims
from ..analysis.intermittent_stalls import Stalls, expected_freeze_s
from ..analysis.wedge import TOGETHER_S, frozen_together
from ..config import DetectorConfig
from ..view import columns
from ..view.cluster import ClusterView, FoldedRank
from .phrases import where, who

PATIENCE_INTERVALS = 1.5  # of the slowest host's report interval: then a group is named as far as it is known
MAX_STACKS = 8  # a group's stacks asked for its earliest ranks (every rank's come with the job's context)


class _Tick(NamedTuple):
    """What every finding of one tick reads: the frozen ranks to name (not
    victims), the victims, and the hang's blame with its waiters still running."""

    frozen: list[FoldedRank]
    spared: set[int]
    blame: Blame | None
    live_waiters: list[int]


class FrozenRank:
    name = "frozen_rank"

    def __init__(self, cfg: DetectorConfig, stalls: Stalls | None = None) -> None:
        self.cfg = cfg
        # The goodput ledger's stalls (handed in at construction): the freezes each
        # rank ended by itself before. None (a detector alone): every freeze is named.
        self.stalls = stalls

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        tick = self._tick(now, view)
        if tick is None or frozen_together(now, view, self.cfg) is not None:
            return []  # every rank frozen in one instant: the wedged verdict, no rank named
        out = []
        for group in _together(tick.frozen):
            if not self._heard(group, view, now):
                continue  # a rank stopped in the same instant may not show yet: its host has not reported
            out.append(self._one(group[0], now, tick) if len(group) == 1 else self._group(group, now, tick))
        return out

    def each(self, now: float, view: ClusterView) -> list[Finding]:
        """A finding per frozen rank that is not a victim, as a rank frozen alone
        is named (``check`` names those that froze together as one)."""
        tick = self._tick(now, view)
        return [] if tick is None else [self._one(rv, now, tick) for rv in tick.frozen]

    def _tick(self, now: float, view: ClusterView) -> _Tick | None:
        health = classify_all(view, now, self.cfg)
        if FROZEN not in health.values():
            return None
        blame = analyze(view, now, self.cfg, health)
        spared = victims(view, now, self.cfg, health, blame)
        # The waiters still running, once (at 16,384 ranks, a pass per frozen rank was not cheap).
        live_waiters = [w for w in blame.waiters if health[w] == OK] if blame else []
        frozen = [
            view.ranks[r]
            for r in sorted(compress(health.keys(), map(eq, repeat(FROZEN), health.values())))
            if r not in spared and not self._expected(view.ranks[r], now)
        ]
        return _Tick(frozen, spared, blame, live_waiters)

    def _expected(self, rv: FoldedRank, now: float) -> bool:
        """A running rank frozen no longer than the freezes it ended by itself before."""
        known = self.stalls
        if known is None or not known.froze or rv.state.proc_status == "stopped" or rv.state.status != "running":
            return False
        allowed = expected_freeze_s(known, rv.rank)
        return allowed is not None and rv.heartbeat_age(now) <= allowed

    def _waiting(self, ranks: set[int], now: float, tick: _Tick) -> str:
        """The waiters, when ``ranks`` hold up the collective they wait in."""
        b = tick.blame
        if not (b and tick.live_waiters and not ranks.isdisjoint(b.culprits)):
            return ""
        return f"; {ranks_phrase(tick.live_waiters)} waiting in {b.op} #{b.seq} for {seconds(now - b.waiting_since)}"

    def _one(self, rv: FoldedRank, now: float, tick: _Tick) -> Finding:
        s = rv.state
        return Finding(
            kind=self.name,
            ranks=(rv.rank,),
            hosts=(rv.host,),
            onset_mono=rv.last_heartbeat(),
            detected_mono=now,
            reason=f"{who(rv)} is frozen: process alive but heartbeat stale for {seconds(rv.heartbeat_age(now))}, "
            f"{_how(rv)}; last seen {where(rv, now)}{self._waiting({rv.rank}, now, tick)}",
            evidence={
                "heartbeat_age_s": round(rv.heartbeat_age(now), 3),
                "cpu_percent": s.cpu_percent,
                "proc_status": s.proc_status,
                "step": s.step,
                "phase": s.phase,
                "pid": s.pid,
                "victims": sorted(v for v in tick.spared if v != rv.rank),
            },
            wants_stacks=(rv.rank,),
        )

    def _heard(self, group: list[FoldedRank], view: ClusterView, now: float) -> bool:
        """No rank that looks fine may yet have stopped with ``group``: each beat
        after the instant the group's ranks stopped in (its last heartbeat, as
        its agent read it, is later than the group's earliest plus ``TOGETHER_S``),
        or waiting longer is no use. A rank stopped with the group whose heartbeat
        is not yet past its threshold beat last inside that window: its host's
        next report shows it frozen, and the group opens with it."""
        cut = group[0].last_heartbeat() + TOGETHER_S
        health = classify_all(view, now, self.cfg)  # memoized for the tick: _tick() asked first
        c = columns.of(view)
        # OK ranks that last beat by the cut (frozen, dead, lost and exited ones are not
        # waited for), found by C-level scans of the columns: 16,384 ranks on each tick held.
        ok = map(eq, health.values(), repeat(OK))  # classify_all's order is the columns'
        early = map(le, map(sub, c.received_at, c.heartbeat_age_s), repeat(cut))
        moved, status = c.heartbeat_moved, c.status
        for i in compress(range(len(c.rank)), map(and_, ok, early)):
            if moved[i] and status[i] != "disabled":  # a heartbeat that can show it frozen (classify's terms)
                break
        else:
            return True
        shows = cut + min(self.cfg.frozen_after_s(rv.state.proc_status, rv.state.step == 0) for rv in group)
        patience = PATIENCE_INTERVALS * max(view.reporting_interval(hv) for hv in view.hosts.values())
        return now - shows >= patience

    def _group(self, group: list[FoldedRank], now: float, tick: _Tick) -> Finding:
        """One finding for ranks that froze together (``group``, earliest first):
        its reason and evidence stay a line's size however many ranks (the ranks
        themselves are the finding's)."""
        first = group[0]
        # One pass over the group's objects: at 16,384 ranks each pass is ~15-20 ms.
        how: dict[str, list[int]] = {}
        hosts_set, steps_set, phases = set(), set(), set()
        procs: Counter[str] = Counter()
        for rv in group:
            s = rv.state
            how.setdefault(_how(rv, detail=False), []).append(s.rank)
            hosts_set.add(rv.host)
            steps_set.add(s.step)
            phases.add(s.phase)
            procs[s.proc_status] += 1
        ranks = sorted(rv.rank for rv in group)
        named = set(ranks)
        hosts, steps = tuple(sorted(hosts_set)), sorted(steps_set)
        # Heartbeat ages now (``heartbeat_age``) are ``now`` less the last beats: the group is in their order.
        oldest, youngest = now - first.last_heartbeat(), now - group[-1].last_heartbeat()
        span = oldest - youngest
        on = f"host {hosts[0]}" if len(hosts) == 1 else f"{len(hosts):,} hosts"
        return Finding(
            kind=self.name,
            ranks=tuple(ranks),
            hosts=hosts,
            onset_mono=first.last_heartbeat(),
            detected_mono=now,
            reason=(
                f"{ranks_phrase(ranks)} ({len(ranks):,} ranks on {on}) froze together: processes alive, heartbeats "
                f"stopped within {seconds(span)} of each other, stale for {_span(youngest, oldest)}; "
                "one cause is likely (a scheduler's suspend, a debugger, a hung filesystem, a host out of memory); "
                + "; ".join(f"{ranks_phrase(rs)}: {h}" for h, rs in how.items())
                + f"; {who(first)} stopped first, last seen {where(first, now)}{self._waiting(named, now, tick)}"
            ),
            evidence={
                "heartbeat_age_s": round(oldest, 3),
                "stopped_within_s": round(span, 3),
                "ranks_total": len(ranks),
                "hosts_total": len(hosts),
                "proc_status": next(iter(procs)) if len(procs) == 1 else "mixed",
                "proc_statuses": dict(procs),
                "steps": [steps[0], steps[-1]],
                **({"step": steps[0]} if len(steps) == 1 else {}),
                **({"phase": next(iter(phases))} if len(phases) == 1 else {}),
                "first": {"rank": first.rank, "host": first.host, "pid": first.state.pid},
                "victims": sorted(tick.spared - named),
            },
            wants_stacks=tuple(rv.rank for rv in group[:MAX_STACKS]),
        )


def _together(frozen: list[FoldedRank]) -> list[list[FoldedRank]]:
    """The frozen ranks in groups whose heartbeats stopped within ``TOGETHER_S``
    of the group's earliest, each group earliest first."""
    groups: list[list[FoldedRank]] = []
    start = 0.0
    for at, rv in sorted(((rv.last_heartbeat(), rv) for rv in frozen), key=itemgetter(0)):  # stable: rank order
        if groups and at - start <= TOGETHER_S:
            groups[-1].append(rv)
        else:
            groups.append([rv])
            start = at
    return groups


def _span(youngest: float, oldest: float) -> str:
    lo, hi = seconds(youngest), seconds(oldest)
    return lo if lo == hi else f"{lo}-{hi}"


def _how(rv: FoldedRank, detail: bool = True) -> str:
    """How the rank is frozen, from the hook's status and the agent's reading of
    the process; ``detail``: with this rank's own numbers."""
    s = rv.state
    if s.status == "failed":  # the hook saw an uncaught exception or a failing exit call: shutting down, not hung
        why = s.death.get("summary") or "hook status failed"
        after = f"a failing {s.death['exit_call']}" if s.death.get("exit_call") else "an uncaught exception"
        return f"exiting after {after} ({why})" if detail else f"exiting after {after}"
    if s.proc_status == "stopped":
        return "stopped by a signal (SIGSTOP/SIGTSTP, or a debugger)"
    if s.cpu_percent < 5:
        return f"not running (CPU ~0%, OS state {s.proc_status or 'unknown'})" if detail else "not running (CPU ~0%)"
    return (
        f"busy in native code holding the GIL (CPU {s.cpu_percent:.0f}%)"
        if detail
        else "busy in native code holding the GIL"
    )
