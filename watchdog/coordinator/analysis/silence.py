"""A silent host: what the evidence says about its ranks, when its agent says nothing.

An agent is not its ranks. It can stop, be OOM-killed and come back slowly,
starve for CPU or lose its route to the coordinator while its ranks train on
with everyone else. Its silence is the monitor's blindness, not the job's
failure, so a silent host's ranks are judged on what their peers (the ranks on
hosts still reporting) show:

- Proof of life. A peer that completed a collective on the group a silent rank
  was last seen in, numbered past the one that rank was last seen entering,
  could not have done it without that rank: the rank was alive then.
- Suspicion. The silent ranks become suspects (``LOST``) only on evidence that
  they are gone: a peer died inside a collective since the silence began (gloo
  fails every peer within moments of a member's death), or a peer's earlier
  incarnation died since (its launcher replaced it), or the peers stopped
  progressing for the silence limit while waiting in a collective the silent
  ranks were not seen entering.
- No peers (a one-host job, every other host silent too or its ranks all
  exited): nothing can be seen, so nothing is presumed. A rank seen dead before
  the silence is dead on that report (its own classification), not for the
  silence.
- The launcher's exit. The host's launcher, run under ``watchdog run``, tells the
  coordinator itself when it exits (``view.launcher_exits``), silent agent or not.
  An exit after the host's ranks started settles what the agent cannot say: a
  nonzero status is the job failing there (``LOST``, naming the status), status 0
  is the job finished there (``FINISHED``: its ranks exited, nobody is missing).

Anything else is ``UNOBSERVED``: an alert about the monitor (detectors/
host_unobserved.py), never a finding against a rank, never acted on.
Pure: a function of (view, now, limits).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...contracts.finding import ranks_phrase, seconds
from ..view import columns
from ..view.cluster import ClusterView, FoldedRank, LauncherExit

LOST, UNOBSERVED, FINISHED = "lost", "unobserved", "finished"
SLOW_PHASES = ("checkpoint", "eval")  # phases the other ranks wait for on purpose (collective_hang's too)


@dataclass(frozen=True)
class Silence:
    host: str
    since: float  # its agent's last report
    ranks: tuple[int, ...]  # its ranks as last seen running (not exited, not dead)
    verdict: str  # LOST or UNOBSERVED
    why: str  # for a person: the evidence, or that there is none
    alive_until: float | None = None  # the latest proof of life of every one of ``ranks``, from peers
    evidence: Mapping[str, Any] = field(default_factory=dict, compare=False)


def judge(
    view: ClusterView,
    now: float,
    silent: Mapping[str, float],
    waiting: Callable[[FoldedRank], bool],
    phase_allowance_s: float = 0.0,
) -> dict[str, Silence]:
    """A verdict for each silent host (``silent``: host -> its silence limit in
    seconds) with a rank last seen running. ``waiting``: health.waiting;
    ``phase_allowance_s``: DetectorConfig.hang_phase_allowance_s."""
    if not silent:
        return {}
    c = columns.of(view)
    mine: dict[str, list[FoldedRank]] = {}
    peers: list[FoldedRank] = []
    for r, host, alive, status in zip(c.rank, c.host, c.alive, c.status):
        if host in silent:
            if alive and status != "exited":
                mine.setdefault(host, []).append(view.ranks[r])
        else:
            peers.append(view.ranks[r])
    live = [p for p in peers if p.state.alive and p.state.status != "exited"]
    # The furthest completed collective per group among live peers, and when they last progressed.
    done: dict[int, tuple[int, float]] = {}
    for p in live:
        g, d = p.state.coll.group, p.state.coll.done_seq
        if g not in done or d > done[g][0] or (d == done[g][0] and p.progress_at > done[g][1]):
            done[g] = (d, p.progress_at)
    out = {}
    for host, ranks in sorted(mine.items()):
        since = view.hosts[host].received_at
        ex = view.launcher_exits.get(host)
        if ex is not None and ex.at >= max(rv.registered_at for rv in ranks):  # these ranks' launcher
            out[host] = _exited(host, since, ranks, ex, now, silent[host])
            continue
        out[host] = _one(host, since, ranks, peers, live, done, now, silent[host], waiting, phase_allowance_s)
    return out


def _exited(host: str, since: float, ranks: list[FoldedRank], ex: LauncherExit, now: float, limit: float) -> Silence:
    names = tuple(sorted(rv.rank for rv in ranks))
    ev = {"silent_s": round(now - since, 3), "limit_s": round(limit, 3), "evidence": "launcher_exit"}
    ev |= {"launcher_pid": ex.pid, "launcher_status": ex.status}
    if ex.status == 0:
        why = f"its launcher (pid {ex.pid}) exited with status 0: the job finished there"
        return Silence(host, since, names, FINISHED, why, None, ev)
    how = f"was killed by {signal_name(-ex.status)}" if ex.status < 0 else f"exited with status {ex.status}"
    why = f"its launcher (pid {ex.pid}) {how} {seconds(max(0.0, ex.at - since))} into the silence"
    return Silence(host, since, names, LOST, why, None, ev)


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _one(
    host: str,
    since: float,
    ranks: list[FoldedRank],
    peers: list[FoldedRank],
    live: list[FoldedRank],
    done: Mapping[int, tuple[int, float]],
    now: float,
    limit: float,
    waiting: Callable[[FoldedRank], bool],
    phase_allowance_s: float,
) -> Silence:
    names = tuple(sorted(rv.rank for rv in ranks))
    proofs = [_proof(rv, done) for rv in ranks]
    alive_until = min(t for t in proofs) if all(t is not None for t in proofs) else None  # type: ignore[type-var]
    ev: dict[str, Any] = {"silent_s": round(now - since, 3), "limit_s": round(limit, 3)}
    if alive_until is not None:
        ev["alive_until_age_s"] = round(now - alive_until, 3)
    gone = _peer_gone(since, peers, waiting)
    if gone:
        return Silence(host, since, names, LOST, gone, alive_until, {**ev, "evidence": "peer_failed"})
    stalled = _peers_stalled(ranks, live, now, limit, waiting, phase_allowance_s)
    if stalled:
        return Silence(host, since, names, LOST, stalled, alive_until, {**ev, "evidence": "peers_waiting"})
    if not live:
        why = f"no rank elsewhere to vouch for {ranks_phrase(names)}: cannot see whether they run"
        return Silence(host, since, names, UNOBSERVED, why, None, {**ev, "evidence": "no_peers"})
    if alive_until is not None:
        why = (
            f"{ranks_phrase(names)} provably alive: peers completed collectives that need them, "
            f"{seconds(max(0.0, now - alive_until))} ago"
        )
        return Silence(host, since, names, UNOBSERVED, why, alive_until, {**ev, "evidence": "peers_progress"})
    why = f"no evidence against {ranks_phrase(names)}: no peer waits for them, none failed"
    return Silence(host, since, names, UNOBSERVED, why, None, {**ev, "evidence": "none"})


def _proof(rv: FoldedRank, done: Mapping[int, tuple[int, float]]) -> float | None:
    """When a peer last completed a collective on ``rv``'s group numbered past the
    one ``rv`` was last seen entering: ``rv`` took part in it, so it was alive then."""
    c = rv.state.coll
    top = done.get(c.group)
    if c.seq <= 0 or top is None or top[0] <= c.seq:
        return None
    return top[1]


def _peer_gone(since: float, peers: list[FoldedRank], waiting: Callable[[FoldedRank], bool]) -> str:
    """The first peer to fail since the silence began failed while waiting in a
    collective (what gloo/NCCL do to every member when one is gone), or a peer's
    incarnation was replaced by its launcher since (the group broke). A first
    failure outside any collective is a root cause of its own (dead_rank names
    it), and the failures after it are its consequence: no evidence here."""
    failed = [p for p in peers if p.died_at is not None and p.died_at >= since and not p.state.alive]
    if failed:
        p = min(failed, key=lambda x: (x.died_at, x.rank))
        if not waiting(p):
            return ""
        c = p.state.coll
        return f"rank {p.rank} on {p.host} failed inside {c.op} #{c.seq} {seconds(p.died_at - since)} into the silence"  # type: ignore[operator]
    replaced = [p for p in peers if p.previous_died_at is not None and p.previous_died_at >= since]
    if replaced:
        p = min(replaced, key=lambda x: (x.previous_died_at, x.rank))
        return (
            f"rank {p.rank} on {p.host} was restarted by its launcher "
            f"{seconds(p.previous_died_at - since)} into the silence"  # type: ignore[operator]
        )
    return ""


def _peers_stalled(
    ranks: list[FoldedRank],
    live: list[FoldedRank],
    now: float,
    limit: float,
    waiting: Callable[[FoldedRank], bool],
    phase_allowance_s: float,
) -> str:
    """Every live peer without progress for the silence limit, and some waiting in a
    collective that a silent rank was not seen entering. A peer in a phase marked slow
    on purpose (a checkpoint, an evaluation: the others wait for it in the next
    collective) extends the wait by the hang detector's allowance for it."""
    if not live:
        return ""
    if any(p.state.phase in SLOW_PHASES for p in live):
        limit += phase_allowance_s
    if any(now - p.progress_at <= limit for p in live):
        return ""
    for p in live:
        if not waiting(p):
            continue
        c = p.state.coll
        absent = [rv.rank for rv in ranks if not (rv.state.coll.group == c.group and rv.state.coll.seq >= c.seq)]
        if absent:
            return (
                f"peers waiting in {c.op} #{c.seq} without progress for {seconds(now - max(x.progress_at for x in live))}; "
                f"{ranks_phrase(absent)} not seen entering it"
            )
    return ""
