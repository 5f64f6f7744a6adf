"""Hang culprits from each rank's Flight Recorder, for collectives the hook cannot see.

The hook's marks see the collectives called through Python. Those issued from
C++ (DDP's ``_pre_forward`` buffer broadcast and bucket rebuild, FSDP's internals)
are invisible to them: a healthy rank waiting in one reads as "in its own code",
and when one rank is stuck in its data loader every rank looks stalled. The
Flight Recorder (FR) records every c10d collective with its group and sequence
number, so:

* the ranks whose FR holds collective #k of group g, and that have made no
  progress since they entered it, are the waiters (k: the newest any live rank
  holds on g);
* the live ranks whose newest entry on g is older than #k, stalled too, are the
  culprits (the furthest behind of them: a rank in an earlier collective waits
  for those, see ``_behind``), but only from an FR reading made after the last waiter entered #k
  (``FoldedRank.fr_read_at``): an older picture may predate their own entry.
  A failed rank (dead, frozen, lost, exited) behind on g is a culprit whatever
  its picture's age: its failure is the evidence. A live rank with no fresh
  picture is never named; with nobody proven, the answer names nobody and says
  who is unread (a late finding beats a wrong one);
* on NCCL a collective call returns when queued, so every rank may hold #k and
  none is behind. FR's state per (group, seq) then tells more: the ranks whose
  #k never started on the GPU while others' started (and wait for them), or
  whose stream is stuck on an earlier entry that never completed, are the
  culprits ("entered on CPU, not started on GPU"). gloo leaves every entry
  "scheduled": with no entry on the group ever started or completed, nothing is
  concluded from states.

Culprits come root cause first: ranks stuck in their own code (data loader,
user code) before ranks waiting in another collective, before failed ranks.
Pure: a function of the view, ``now`` and the ranks' health.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import compress

from watchdog.report import CollSig

from ..view import columns
from ..view.cluster import ClusterView, FoldedRank

# A reading this close after the last waiter entered is not trusted to be after it
# (ages from two clocks and two reports meet here).
FRESH_SLACK_S = 0.5
STALL_SLACK_S = 0.5  # as health.STALL_SLACK_S: progress times are estimates
_MOVED = ("started", "completed")  # states only NCCL reaches


@dataclass(frozen=True)
class Position:
    """A rank's newest collective on one group, as its Flight Recorder showed it."""

    seq: int
    entered: float  # coordinator time; nan: seen in the slot header only, its record not folded
    sig: CollSig | None


@dataclass(frozen=True)
class FrFront:
    group: int
    seq: int
    op: str
    waiters: tuple[int, ...]
    earlier: tuple[int, ...]  # behind, stalled in an earlier collective waiting for the culprits: not named
    culprits: tuple[int, ...]  # root cause first (see the module doc)
    how: str  # "missing", "not_started", "failed_inside" or "unproven"
    unread: tuple[int, ...]  # behind on the group with no reading since the wait began: not named
    waiting_since: float
    latest_enter: float
    detail: Mapping[int, str]  # culprit -> where it is stuck, for a person


def positions(rv: FoldedRank) -> dict[int, Position]:
    out: dict[int, Position] = {}
    groups = len({key[0] for key, _, _ in rv.coll_keys})  # at 4,096 ranks a tick, stopping early is most of it
    for c, at in reversed(rv.colls):  # sorted by (seq, group): the first seen per group is its newest
        if c.group not in out:
            out[c.group] = Position(c.seq, at, c)
            if len(out) == groups:
                break
    g, s = rv.state.fr_newest_group, rv.state.fr_newest_seq
    if s > 0 and (g not in out or out[g].seq < s):
        out[g] = Position(s, math.nan, None)
    return out


def _entered(p: Position, rv: FoldedRank) -> float:
    """When the rank entered its newest collective; without its record, the latest
    it can have been: the reading that saw it (later is the safe side for freshness)."""
    if not math.isnan(p.entered):
        return p.entered
    read = rv.fr_read_at()
    return rv.received_at if read is None else read


def find(view: ClusterView, live: set[int], failed: set[int]) -> FrFront | None:
    """``live``: ranks expected to make progress and still running Python (health
    ok); ``failed``: dead, frozen, lost or exited ranks. None when FR proves
    nothing: no rank holds an entry, nobody waits, or every rank holds #k and
    states tell nothing more (gloo)."""
    # Only the ranks whose FR showed anything (a column: at 16,384 ranks without FR data,
    # asking every rank's objects was ~20-50 ms on each tick of a hang).
    c = columns.of(view)
    pos = {r: positions(view.ranks[r]) for r in compress(c.rank, c.fr_held)}
    if not pos:
        return None
    best: FrFront | None = None
    for g in sorted({g for p in pos.values() for g in p}):
        found = _on_group(view, g, pos, live, failed)
        if found is not None and (best is None or _rank(found) > _rank(best)):
            best = found
    return best


def _rank(f: FrFront) -> tuple:
    return (bool(f.culprits), len(f.waiters), -f.group)


def _on_group(
    view: ClusterView, g: int, pos: dict[int, dict[int, Position]], live: set[int], failed: set[int]
) -> FrFront | None:
    at_g = {r: p[g] for r, p in pos.items() if g in p}
    k = max((p.seq for r, p in at_g.items() if r in live), default=0)
    if k == 0:
        return None
    front = {r: p for r, p in at_g.items() if p.seq == k}
    waiters = {}
    for r, p in front.items():
        rv = view.ranks[r]
        if r not in live or (p.sig is not None and p.sig.state == "completed"):
            continue
        entered = _entered(p, rv)
        if rv.progress_at <= entered + STALL_SLACK_S:
            waiters[r] = entered
    if not waiters:
        return None
    latest = max(waiters.values())
    members = view.ranks.keys() if g == 0 else at_g.keys()
    behind = [r for r in members if r not in front]
    culprits, unread, earlier = _behind(view, behind, at_g, latest, live, failed)
    inside = sorted(r for r in front if r in failed)
    detail: dict[int, str] = {}
    how = "missing"
    if not culprits and not unread:
        culprits, detail, unread = _not_started(view, g, k, front, latest, live)
        how = "not_started" if culprits else how
    if not culprits and inside:
        culprits, how = inside, "failed_inside"
    if not culprits and not unread:
        return None  # everyone holds #k and nothing more is known: not FR's to say
    if not culprits:
        how = "unproven"
    sigs = [p.sig for p in front.values() if p.sig is not None]
    return FrFront(
        group=g,
        seq=k,
        op=sigs[0].op if sigs else "other",
        waiters=tuple(sorted(r for r in waiters if r not in culprits)),
        earlier=tuple(earlier),
        culprits=tuple(culprits),
        how=how,
        unread=tuple(sorted(unread)),
        waiting_since=min(waiters.values()),
        latest_enter=latest,
        detail=detail,
    )


def _fresh(rv: FoldedRank, latest_enter: float) -> bool:
    read = rv.fr_read_at()
    return read is not None and read > latest_enter + FRESH_SLACK_S


def _behind(
    view: ClusterView, behind: list[int], at_g: dict[int, Position], latest: float, live: set[int], failed: set[int]
) -> tuple[list[int], list[int], list[int]]:
    """(culprits root cause first, stalled live ranks whose picture is too old to
    name, ranks waiting in an earlier collective for the culprits).

    Behind ranks are not all root causes: a rank that entered #j < k waits in #j
    for whoever has not entered #j (the broadcast DDP's _pre_forward issues: its
    root waits for the rank stuck in its data loader while the other receivers
    went on to the gradient all-reduce). So a live rank is named only at the
    lowest position any stalled rank holds (a stale picture's position is a lower
    bound, so it counts), or when its marks show it in its own data loader; a
    failed rank is always named."""
    pos = {r: at_g[r].seq if r in at_g else 0 for r in behind}
    fresh: list[int] = []
    unread: list[int] = []
    broken: list[int] = []
    for r in behind:
        rv = view.ranks[r]
        if r in failed:
            broken.append(r)
        elif r in live and rv.progress_at <= latest + STALL_SLACK_S:
            (fresh if _fresh(rv, latest) else unread).append(r)
    lowest = min((pos[r] for r in fresh + unread + broken), default=0)
    own_code, other_coll, earlier = [], [], []
    for r in fresh:
        rv = view.ranks[r]
        if rv.state.in_data_wait:
            own_code.append(r)
        elif pos[r] > lowest:
            earlier.append(r)  # inside #pos[r] (or past it), waiting for the ranks further behind
        elif rv.state.coll.outstanding > 0 and rv.step_start() <= rv.coll_enter() + STALL_SLACK_S:
            other_coll.append(r)
        else:
            own_code.append(r)
    return sorted(own_code) + sorted(other_coll) + sorted(broken), unread, sorted(earlier)


def _not_started(
    view: ClusterView, g: int, k: int, front: dict[int, Position], latest: float, live: set[int]
) -> tuple[list[int], dict[int, str], list[int]]:
    """Every rank holds #k: the ranks whose #k never started on the GPU while
    another's did, or whose stream is stuck on an earlier entry that the other
    ranks completed. Only on data where some entry on the group moved past
    "scheduled" (NCCL), and from readings made after the wait began."""
    cols = {r: view.ranks[r].colls for r in front}
    if not any(c.group == g and c.state in _MOVED for colls in cols.values() for c, _ in colls):
        return [], {}, []
    states = {r: p.sig.state if p.sig is not None else "unknown" for r, p in front.items()}
    started = [r for r, s in states.items() if s in _MOVED]
    done: dict[tuple[int, int], set[int]] = {}  # (group, seq) -> ranks that completed it
    for r, colls in cols.items():
        for c, _ in colls:
            if c.state == "completed":
                done.setdefault((c.group, c.seq), set()).add(r)
    out: list[int] = []
    detail: dict[int, str] = {}
    unread: list[int] = []
    for r in sorted(front):
        rv = view.ranks[r]
        if r not in live or states[r] in _MOVED:
            continue  # its GPU reached #k
        if not _fresh(rv, latest):
            unread.append(r)  # its picture may predate the GPU reaching #k
            continue
        stuck = _earlier_unfinished(rv, g, k, r, done)
        if stuck is not None:
            out.append(r)
            detail[r] = f"its stream is stuck on an earlier collective that the others completed: {stuck}"
        elif states[r] == "scheduled" and any(q != r for q in started):
            out.append(r)
            detail[r] = f"its #{k} never started on the GPU while the others' did"
    return out, detail, (unread if out or started else [])


def _earlier_unfinished(rv: FoldedRank, g: int, k: int, r: int, done: dict[tuple[int, int], set[int]]) -> str | None:
    """The oldest entry this rank issued before (g, k) that never completed on it
    while another rank completed it, described; None if there is none."""
    at_k = next((at for c, at in rv.colls if c.group == g and c.seq == k), math.inf)
    for c, at in sorted(rv.colls, key=lambda x: x[1]):
        if at >= at_k or (c.group, c.seq) == (g, k):
            continue
        if c.state in ("scheduled", "started") and done.get((c.group, c.seq), set()) - {r}:
            return f"{c.op} #{c.seq} on group {c.group}, {c.state}"
    return None
