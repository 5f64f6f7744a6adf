"""dead_rank: a rank's process is gone, or its whole host went silent.

The agent reports ``alive: false`` once the (pid, start time) process is gone;
a clean exit (hook status "exited") is not a death. A host whose agent sent
nothing for ``host_silence_intervals`` of its report intervals is lost, with all
its ranks, only on evidence from their peers (analysis/silence.py: a peer failed inside a
collective since, or the peers wait in one the silent ranks were not seen
entering): one finding naming the host. Without evidence the silence is the
monitor's (host_unobserved), and nobody is taken for dead.

Root cause, not victims. When one rank dies, torchrun tears the group down and
gloo/NCCL peers fail within milliseconds to seconds, so several ranks die close
together. Two rules keep the blame on the first:
- a rank that died while waiting in a collective that some failed or stuck rank
  never entered is a victim (``health.victims``);
- deaths are ordered by when they happened (the agent's ``gone_age_s``, poll
  resolution; else bounded by the last sign of life): those within ``TIE_S`` of
  the earliest are named together (order unknown), later ones within
  ``CASCADE_S`` are followers, mentioned in the evidence only;
- a rank that issued the usual collective where another issued a mismatched
  one (``mismatch.find``) is a victim however early it died: gloo fails first
  on whichever rank reads the odd message, a healthy one as often as not.
A death is reported once every other live host has reported since it happened
(or after 1.5 report intervals), so a victim whose agent happened to report
first is not blamed before the root cause's host is heard from. A death whose
successor the launcher started meanwhile stays in the coordinator's view until a
check that waited for nothing judged it (``waiting``; coordinator/view/unjudged.py).

A rank that left early. When the ranks died waiting in a collective that only
ranks that exited cleanly never entered (uneven inputs, an early return or a
``sys.exit(0)`` on one rank), the exit is the root cause and the deaths its
consequence: on gloo the waiters fail within a second (the peer closed its
connection), so no hang is ever seen and, every death being a victim's, nothing
was named. The exited ranks are named then, with the ranks that failed after them.

Not a rank's fault. Ranks their launcher terminated together (every rank of a
host dead of SIGTERM within milliseconds: torchrun's restart after a failure
elsewhere, a membership change when a node joins, a scheduler's cancel) take part
in the ordering without being named; so do the deaths of incarnations a restart
has replaced since (``FoldedRank.previous_died_at``), so the victims a restart
leaves in the view are not taken for a new root cause once the root's record is
gone. A rank of a later attempt is never their follower.
"""

from __future__ import annotations

from collections import Counter
from itertools import compress, repeat
from operator import eq
from typing import cast

from ...contracts.finding import Finding, group_name, ranks_phrase, seconds
from ..analysis.health import (
    DEAD,
    EXITED,
    LOST,
    Blame,
    analyze,
    classify_all,
    host_silence_limit,
    lost_hosts,
    silences,
    victims,
)
from ..analysis.mismatch import find as find_mismatch
from ..config import DetectorConfig
from ..view import columns
from ..view.cluster import ClusterView
from .phrases import where, who

TIE_S = 0.003  # agents time exits through pidfds (agent/processes/deathwatch.py) to ~1 ms; closer is a tie
TIE_COARSE_S = 1.0  # without agent timing: one report interval
CASCADE_S = 10.0  # later deaths this close to a root cause are taken as its consequence
TEARDOWN_S = 0.05  # a launcher's SIGTERM to its workers: their deaths land within milliseconds


def _torn_down(view: ClusterView, dead: list[int]) -> set[int]:
    """Ranks their launcher (or the scheduler) terminated together: every rank of their
    host, two or more, dead of SIGTERM within TEARDOWN_S of each other, as the agent
    timed it. torchrun signals its workers in one loop, for a restart after a failure
    elsewhere or a membership change (a node joined); a scheduler's cancel or preemption
    does the same. None of it is a rank's fault. A rank killed alone (an operator's
    ``kill``) dies before its host-mates, whom the launcher stops only once it notices."""
    by_host: dict[str, list[float]] = {}
    for r in dead:
        rv = view.ranks[r]
        death = rv.state.death
        at = rv.died_at
        if at is not None and rv.died_precise and death.get("signal") == "SIGTERM" and "exception" not in death:
            by_host.setdefault(rv.host, []).append(at)
    if not by_host:
        return set()
    c = columns.of(view)
    size = Counter(h for h in c.host if h in by_host)
    torn = {h for h, ts in by_host.items() if len(ts) == size[h] >= 2 and max(ts) - min(ts) <= TEARDOWN_S}
    return {r for r in dead if view.ranks[r].host in torn}


def _replaced_deaths(view: ClusterView, events: list[tuple]) -> list[tuple[float, tuple[int, ...], bool, bool]]:
    """The deaths of incarnations a restart has replaced since (``FoldedRank.previous_died_at``)
    that may come before the deaths in ``events`` (within CASCADE_S): each a root cause that
    is no longer in the view, with no rank to name, that the deaths after it follow."""
    if not events:
        return []
    lo = min(e[0] for e in events) - CASCADE_S
    hi = max(e[0] for e in events)
    return [
        (t, (), True, False)
        for t in (rv.previous_died_at for rv in view.ranks.values())
        if t is not None and lo <= t <= hi
    ]


class DeadRank:
    name = "dead_rank"

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        health = classify_all(view, now, self.cfg)
        states = health.values()
        if DEAD not in states and LOST not in states:
            return []
        blame = analyze(view, now, self.cfg, health)
        spared = victims(view, now, self.cfg, health, blame)
        mismatch = find_mismatch(view)
        if mismatch is not None and mismatch.odd:
            spared |= {r for r in mismatch.usual if health[r] == DEAD}
        lost = self._lost_hosts(now, view, health)
        # (time, ranks, precise, nameable): lost hosts take part in the ordering as one event
        # each; a launcher's teardown and replaced incarnations' deaths with nobody to name.
        events = [(f.onset_mono, f.ranks, False, True) for f in lost]
        dead = list(compress(health.keys(), map(eq, repeat(DEAD), states)))  # the view's rank order
        torn = _torn_down(view, dead)
        for r in dead:
            rv = view.ranks[r]
            if r not in spared and rv.died_at is not None:
                events.append((rv.died_at, (r,), rv.died_precise, r not in torn))
        events += _replaced_deaths(view, events)
        events.sort()
        out = list(lost)
        root_t = None
        cluster_named = True
        cluster: list[int] = []
        followers: list[int] = []
        precise = True
        for t, ranks, exact, nameable in events:
            # A rank that started after an unnamed root's death is of a later attempt: its own
            # death (a crash that comes back) is never that teardown's follower.
            later = (
                root_t is not None
                and not cluster_named
                and len(ranks) == 1
                and view.ranks[ranks[0]].registered_at > root_t
            )
            if root_t is not None and not later and t - root_t <= (TIE_S if precise and exact else TIE_COARSE_S):
                if cluster_named and nameable:
                    cluster += ranks if len(ranks) == 1 and health[ranks[0]] == DEAD else []
                else:
                    followers += ranks  # died with an unnamed root, or torn down: never named
                continue
            if root_t is not None and not later and t - root_t <= CASCADE_S:
                followers += ranks
                continue
            if cluster:
                out += self._dead(now, view, cluster, followers, spared, blame)
            root_t, precise, followers = t, exact, []
            cluster_named = nameable
            cluster = list(ranks) if nameable and len(ranks) == 1 and health[ranks[0]] == DEAD else []
        if cluster:
            out += self._dead(now, view, cluster, followers, spared, blame)
        return out + self._left_early(now, view, health, blame, spared)

    def waiting(self, now: float, view: ClusterView) -> bool:
        """Some death in ``view`` may still wait for the other hosts (``_patient``): a check
        of this view judged it not yet. Once none waits, every death in it was judged (a
        cluster's first death and first report come no later than any of its own). Asked
        once, for the latest death and the latest first report together: ``_patient`` only
        grows with either, so this never says "judged" early (and costs one pass over the
        hosts, not one per death: a job-wide failure at 16,384 ranks)."""
        health = classify_all(view, now, self.cfg)
        if DEAD not in health.values():
            return False
        rvs = [view.ranks[r] for r, h in health.items() if h == DEAD]
        died = [rv.died_at for rv in rvs if rv.died_at is not None]
        seen = [rv.dead_seen_at for rv in rvs if rv.dead_seen_at is not None]
        if not died or not seen:
            return False
        return self._patient(now, view, max(died), max(seen), lost_hosts(view, now, self.cfg))

    def _patient(self, now: float, view: ClusterView, first: float, seen: float, lost: set[str]) -> bool:
        """Deaths from ``first`` on, first reported at ``seen``, wait for every other host
        to report since (or 1.5 report intervals): one of them may hold an earlier death."""
        if all(hv.received_at >= first or h in lost for h, hv in view.hosts.items()):
            return False
        patience = 1.5 * max(view.reporting_interval(hv) for hv in view.hosts.values())
        # A host already silent when these ranks died may be the root cause: a host lost for
        # real (its ranks killed with it) makes gloo fail its peers at once, and those are
        # victims. Patience does not run out for it: its silence is judged (lost, and then it is
        # the earlier death, or unobserved) once it reaches the silence limit.
        judging = any(
            hv.received_at < first and h not in lost and now - hv.received_at < host_silence_limit(view, h, self.cfg)
            for h, hv in view.hosts.items()
        )
        return now - seen < patience or judging

    def _left_early(
        self, now: float, view: ClusterView, health: dict[int, str], blame: Blame | None, spared: set[int]
    ) -> list[Finding]:
        """The ranks that exited cleanly while others waited for them, where waiters died
        of it (see the module doc). Only when every rank blamed exited: a dead, frozen or
        lost culprit has its own finding and came first (a launcher's SIGTERM after a
        crash ends some ranks cleanly, after the crash)."""
        if blame is None or not blame.culprits or any(health[r] != EXITED for r in blame.culprits):
            return []
        failed = sorted(r for r in spared if health[r] == DEAD)
        if not failed:
            return []  # the waiters are still waiting: collective_hang names who left
        rvs = [view.ranks[r] for r in blame.culprits]
        rv = rvs[0]
        steps = sorted({x.state.step for x in rvs})
        at = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        if len(rvs) == 1:
            head = f"{who(rv)} exited at {at} (a clean exit, hook status exited)"
        else:
            hosts = sorted({x.host for x in rvs})
            head = f"{ranks_phrase(blame.culprits)} (host {', '.join(hosts)}) exited at {at} (clean exits)"
        return [
            Finding(
                kind=self.name,
                ranks=blame.culprits,
                hosts=tuple(sorted({x.host for x in rvs})),
                onset_mono=min(x.progress_at for x in rvs),
                detected_mono=now,
                reason=(
                    f"{head} while {ranks_phrase(blame.waiters)} waited for it in {blame.op} #{blame.seq} on "
                    f"{group_name(blame.group)}; {ranks_phrase(failed)} failed after it: a rank that left early "
                    "(uneven inputs, an early return or sys.exit on some ranks only)"
                ),
                evidence={
                    "pids": {str(x.rank): x.state.pid for x in rvs},
                    "status": EXITED,
                    "step": rv.state.step,
                    "group": blame.group,
                    "seq": blame.seq,
                    "op": blame.op,
                    "waiters": list(blame.waiters),
                    "followers": failed,
                },
            )
        ]

    def _dead(
        self,
        now: float,
        view: ClusterView,
        cluster: list[int],
        followers: list[int],
        spared: set[int],
        blame: Blame | None,
    ) -> list[Finding]:
        rvs = [view.ranks[r] for r in sorted(cluster)]
        # dead ranks only: each has when it died and when its agent saw that
        died = [cast(float, rv.died_at) for rv in rvs]
        first = min(died)
        seen = min(cast(float, rv.dead_seen_at) for rv in rvs)
        if self._patient(now, view, first, seen, lost_hosts(view, now, self.cfg)):
            return []  # wait for the other hosts: one of them may hold an earlier death
        after = sorted(set(followers) | {v for v in spared if v not in cluster})
        then = f"; {ranks_phrase(after)} failed after it" if after else ""
        waiting = ""
        if blame and set(cluster) & set(blame.culprits):
            c = columns.of(view)  # the waiters' liveness from the columns, not from 16k objects
            alive = dict(zip(c.rank, c.alive))
            live_waiters = [w for w in blame.waiters if alive[w]]
            if live_waiters:
                waiting = f"; {ranks_phrase(live_waiters)} waiting in {blame.op} #{blame.seq} for {seconds(now - blame.waiting_since)}"
        rv = rvs[0]
        causes = {x.rank: x.state.death.get("summary", "") for x in rvs if x.state.death.get("summary")}
        if len(rvs) == 1:
            cause = causes.get(rv.rank) or f"process gone (hook status {rv.state.status})"
            head = f"{who(rv)} died: {cause}, last seen {where(rv, now)}"
        else:
            hosts = sorted({x.host for x in rvs})
            span = max(died) - first
            head = (
                f"{ranks_phrase(cluster)} (host {', '.join(hosts)}) died within {seconds(span)} of each other, "
                f"order unknown: processes gone, rank {rv.rank} last seen {where(rv, now)}"
            )
            # Why each died, grouped: four ranks killed by one OOM read as one line.
            by_cause: dict[str, list[int]] = {}
            for r, c in sorted(causes.items()):
                by_cause.setdefault(c, []).append(r)
            head += "".join(f"; {ranks_phrase(rs)}: {c}" for c, rs in by_cause.items())
        return [
            Finding(
                kind=self.name,
                ranks=tuple(sorted(cluster)),
                hosts=tuple(sorted({x.host for x in rvs})),
                onset_mono=first,
                detected_mono=now,
                reason=head + waiting + then,
                evidence={
                    "pids": {str(x.rank): x.state.pid for x in rvs},
                    "status": rv.state.status,
                    "step": rv.state.step,
                    "phase": rv.state.phase,
                    "last_heartbeat_age_s": round(rv.heartbeat_age(now), 3),
                    "died_precise": all(x.died_precise for x in rvs),
                    "followers": after,
                    **(
                        {"death": {str(x.rank): x.state.death for x in rvs if x.state.death}}
                        if any(x.state.death for x in rvs)
                        else {}
                    ),
                },
            )
        ]

    def _lost_hosts(self, now: float, view: ClusterView, health: dict[int, str]) -> list[Finding]:
        out = []
        verdicts = silences(view, now, self.cfg)
        by_host: dict[str, list[int]] = {}  # one pass: per host over all ranks was O(hosts x ranks)
        c = columns.of(view)  # classify_all's order is the columns'
        for r, host, h in zip(c.rank, c.host, health.values()):
            if h == LOST:
                by_host.setdefault(host, []).append(r)
        for host, hv in sorted(view.hosts.items()):
            ranks = sorted(by_host.get(host, ()))
            if not ranks:
                continue
            silent = now - hv.received_at
            steps = sorted({view.ranks[r].state.step for r in ranks})
            out.append(
                Finding(
                    kind=self.name,
                    ranks=tuple(ranks),
                    hosts=(host,),
                    onset_mono=hv.received_at,
                    detected_mono=now,
                    reason=(
                        f"host {host} lost: no report from its agent for {seconds(silent)} (expected every "
                        f"{seconds(hv.interval_s)}); {verdicts[host].why}: {ranks_phrase(ranks)} taken for dead, "
                        f"last at step {steps[0] if len(steps) == 1 else f'{steps[0]}-{steps[-1]}'}"
                    ),
                    evidence={
                        "silent_s": round(silent, 3),
                        "lost_on": verdicts[host].evidence.get("evidence", ""),
                        **{k: v for k, v in verdicts[host].evidence.items() if k.startswith("launcher_")},
                        "limit_s": host_silence_limit(view, host, self.cfg),
                        "agent_id": hv.agent_id,
                        "last_seq": hv.seq,
                    },
                )
            )
        return out
