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
first few ranks that later findings add to; a lone frozen rank is usually named
at once, as other ranks' agents have read them beating since.
"""

from __future__ import annotations

from collections import Counter
from itertools import compress, repeat
from operator import eq

from .. import columns
from ..config import DetectorConfig
from ..describe import hosts_of, where, who
from ..finding import Finding, ranks_phrase, seconds
from ..health import FROZEN, OK, Blame, analyze, classify_all, victims
from ..view import ClusterView, FoldedRank

# The hook beats every 0.5 s (heartbeat_interval_s): ranks stopped in one instant
# last beat up to that far apart. Agents read the beat in nanoseconds.
TOGETHER_S = 0.6
PATIENCE_INTERVALS = 1.5  # of the slowest host's report interval: then a group is named as far as it is known
MAX_STACKS = 8  # a group's stacks asked for its earliest ranks (every rank's come with the job's context)


class FrozenRank:
    name = "frozen_rank"

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        each = self.each(now, view)
        if not each:
            return []
        out = []
        for group in _together(each):
            if not self._heard(group, view, now):
                continue  # a rank stopped in the same instant may not show yet: its host has not reported
            out.append(group[0] if len(group) == 1 else self._group(group, view, now))
        return out

    def each(self, now: float, view: ClusterView) -> list[Finding]:
        """A finding per frozen rank that is not a victim, as a rank frozen alone
        is named (``check`` names those that froze together as one)."""
        health = classify_all(view, now, self.cfg)
        if FROZEN not in health.values():
            return []
        blame = analyze(view, now, self.cfg, health)
        spared = victims(view, now, self.cfg, health, blame)
        # The waiters still running, once (at 16,384 ranks, a pass per frozen rank was not cheap).
        live_waiters = [w for w in blame.waiters if health[w] == OK] if blame else []
        out = []
        for r in sorted(compress(health.keys(), map(eq, repeat(FROZEN), health.values()))):
            if r in spared:
                continue
            rv = view.ranks[r]
            s = rv.state
            waiting = ""
            if blame and r in blame.culprits and live_waiters:
                waiting = f"; {_waiting(blame, live_waiters, now)}"
            out.append(
                Finding(
                    kind=self.name,
                    ranks=(r,),
                    hosts=(rv.host,),
                    onset_mono=rv.last_heartbeat(),
                    detected_mono=now,
                    reason=f"{who(rv)} is frozen: process alive but heartbeat stale for {seconds(rv.heartbeat_age(now))}, "
                    f"{_how(rv)}; last seen {where(rv, now)}{waiting}",
                    evidence={
                        "heartbeat_age_s": round(rv.heartbeat_age(now), 3),
                        "cpu_percent": s.cpu_percent,
                        "proc_status": s.proc_status,
                        "step": s.step,
                        "phase": s.phase,
                        "pid": s.pid,
                        "victims": sorted(v for v in spared if v != r),
                    },
                    wants_stacks=(r,),
                )
            )
        return out

    def _limit(self, rv: FoldedRank) -> float:
        """The heartbeat age past which ``classify`` calls this rank frozen."""
        s = self.cfg.frozen_heartbeat_s
        return s / 3 if rv.state.proc_status == "stopped" else s

    def _heard(self, group: list[Finding], view: ClusterView, now: float) -> bool:
        """No rank that looks fine may yet have stopped with ``group``: each beat
        after the instant the group's ranks stopped in (its last heartbeat, as
        its agent read it, is later than the group's earliest plus ``TOGETHER_S``),
        or waiting longer is no use. A rank stopped with the group whose heartbeat
        is not yet past its threshold beat last inside that window: its host's
        next report shows it frozen, and the group opens with it."""
        cut = group[0].onset_mono + TOGETHER_S
        health = classify_all(view, now, self.cfg)  # memoized for the tick: each() asked first
        c = columns.of(view)
        for h, at, age, moved, status in zip(
            health.values(), c.received_at, c.heartbeat_age_s, c.heartbeat_moved, c.status
        ):
            # OK ranks only (frozen, dead, lost and exited ones are not waited for), and only
            # those whose heartbeat can show them frozen at all (classify's own conditions).
            if h == OK and at - age <= cut and moved and status != "disabled":
                break
        else:
            return True
        shows = group[0].onset_mono + TOGETHER_S + min(self._limit(view.ranks[f.ranks[0]]) for f in group)
        patience = PATIENCE_INTERVALS * max(view.reporting_interval(hv) for hv in view.hosts.values())
        return now - shows >= patience

    def _group(self, each: list[Finding], view: ClusterView, now: float) -> Finding:
        """One finding for ranks that froze together (``each``: theirs, earliest
        first): its reason and evidence stay a line's size however many ranks
        (the ranks themselves are the finding's)."""
        group = [view.ranks[f.ranks[0]] for f in each]
        first = group[0]
        ranks = sorted(rv.rank for rv in group)
        named = set(ranks)
        hosts = hosts_of(group)
        ages = [rv.heartbeat_age(now) for rv in group]
        span = each[-1].onset_mono - each[0].onset_mono
        how: dict[str, list[int]] = {}
        for rv in group:
            how.setdefault(_how(rv, detail=False), []).append(rv.rank)
        waiting = ""
        health = classify_all(view, now, self.cfg)  # both memoized for the tick: each() asked first
        blame = analyze(view, now, self.cfg, health)
        if blame and named & set(blame.culprits):
            live_waiters = [w for w in blame.waiters if health[w] == OK]
            if live_waiters:
                waiting = f"; {_waiting(blame, live_waiters, now)}"
        on = f"host {hosts[0]}" if len(hosts) == 1 else f"{len(hosts):,} hosts"
        steps = sorted({rv.state.step for rv in group})
        procs = Counter(rv.state.proc_status for rv in group)
        phases = {rv.state.phase for rv in group}
        return Finding(
            kind=self.name,
            ranks=tuple(ranks),
            hosts=hosts,
            onset_mono=each[0].onset_mono,
            detected_mono=now,
            reason=(
                f"{ranks_phrase(ranks)} ({len(ranks):,} ranks on {on}) froze together: processes alive, heartbeats "
                f"stopped within {seconds(span)} of each other, stale for {_span(ages)}; "
                "one cause is likely (a scheduler's suspend, a debugger, a hung filesystem, a host out of memory); "
                + "; ".join(f"{ranks_phrase(rs)}: {h}" for h, rs in how.items())
                + f"; {who(first)} stopped first, last seen {where(first, now)}{waiting}"
            ),
            evidence={
                "heartbeat_age_s": round(max(ages), 3),
                "stopped_within_s": round(span, 3),
                "ranks_total": len(ranks),
                "hosts_total": len(hosts),
                "proc_status": next(iter(procs)) if len(procs) == 1 else "mixed",
                "proc_statuses": dict(procs),
                "steps": [steps[0], steps[-1]],
                **({"step": steps[0]} if len(steps) == 1 else {}),
                **({"phase": next(iter(phases))} if len(phases) == 1 else {}),
                "first": {"rank": first.rank, "host": first.host, "pid": first.state.pid},
                # Every member's victims are the same ranks (the tick's), less itself.
                "victims": sorted(set(each[0].evidence["victims"]) - named),
            },
            wants_stacks=tuple(rv.rank for rv in group[:MAX_STACKS]),
        )


def _together(each: list[Finding]) -> list[list[Finding]]:
    """The frozen ranks' findings in groups whose heartbeats stopped within
    ``TOGETHER_S`` of the group's earliest, each group earliest first."""
    groups: list[list[Finding]] = []
    for f in sorted(each, key=lambda f: (f.onset_mono, f.ranks)):
        if groups and f.onset_mono - groups[-1][0].onset_mono <= TOGETHER_S:
            groups[-1].append(f)
        else:
            groups.append([f])
    return groups


def _span(ages: list[float]) -> str:
    lo, hi = seconds(min(ages)), seconds(max(ages))
    return lo if lo == hi else f"{lo}-{hi}"


def _waiting(blame: Blame, live_waiters: list[int], now: float) -> str:
    return f"{ranks_phrase(live_waiters)} waiting in {blame.op} #{blame.seq} for {seconds(now - blame.waiting_since)}"


def _how(rv: FoldedRank, detail: bool = True) -> str:
    """How the rank is frozen, from the hook's status and the agent's reading of
    the process; ``detail``: with this rank's own numbers."""
    s = rv.state
    if s.status == "failed":  # the hook saw an uncaught exception: shutting down, not hung
        why = s.death.get("summary") or "hook status failed"
        return f"exiting after an uncaught exception ({why})" if detail else "exiting after an uncaught exception"
    if s.proc_status == "stopped":
        return "stopped by a signal (SIGSTOP/SIGTSTP, or a debugger)"
    if s.cpu_percent < 5:
        return f"not running (CPU ~0%, OS state {s.proc_status or 'unknown'})" if detail else "not running (CPU ~0%)"
    return (
        f"busy in native code holding the GIL (CPU {s.cpu_percent:.0f}%)"
        if detail
        else "busy in native code holding the GIL"
    )
