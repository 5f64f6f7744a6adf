"""The per-rank values the detectors read, as columns: built in one pass over a
view's ranks, once per view, and shared by every detector of the tick.

At 16,384 ranks a pass over the ranks' objects costs ~10-30 ms, nearly all of
it in cache misses (a FoldedRank, its RankState and its CollectiveState are
three objects, allocated wherever their report was folded), and a tick made
about fifteen such passes. Here the objects are read once; a detector then
walks a few tuples of plain values (``zip(cols.status, cols.alive, ...)``),
which is ~5x cheaper per pass.

Column ``i`` of every field is ``cols.rank[i]``'s value, in the view's rank
order (``view.ranks``), so ``zip`` lines them up. The columns are a pure
function of the view (``of`` memoizes them on the view object, which is
immutable); a value a detector needs that is not here is read from
``view.ranks[r]`` for the few ranks that need it.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from watchdog.report import StepSample

    from .view import ClusterView, FoldedRank


@dataclass(frozen=True)
class RankColumns:
    rank: tuple[int, ...] = ()
    host: tuple[str, ...] = ()
    # the hook's and the OS's view of the process (RankState)
    status: tuple[str, ...] = ()
    alive: tuple[bool, ...] = ()
    proc_status: tuple[str, ...] = ()
    heartbeat_age_s: tuple[float, ...] = ()
    heartbeat_moved: tuple[bool, ...] = ()
    pid: tuple[int, ...] = ()
    proc_start_us: tuple[int, ...] = ()
    world_size: tuple[int, ...] = ()
    pg_state: tuple[str, ...] = ()
    phase: tuple[str, ...] = ()
    step: tuple[int, ...] = ()
    in_data_wait: tuple[bool, ...] = ()
    # times on the coordinator's clock (FoldedRank)
    received_at: tuple[float, ...] = ()
    registered_at: tuple[float, ...] = ()
    progress_at: tuple[float, ...] = ()
    step_start: tuple[float, ...] = ()  # received_at - step_age_s (FoldedRank.step_start)
    # the last collective the hook saw (RankState.coll)
    coll_group: tuple[int, ...] = ()
    coll_seq: tuple[int, ...] = ()
    coll_done_seq: tuple[int, ...] = ()
    coll_outstanding: tuple[int, ...] = ()
    coll_enter: tuple[float, ...] = ()  # received_at - coll.since_s (FoldedRank.coll_enter)
    coll_op: tuple[str, ...] = ()
    coll_bytes: tuple[int, ...] = ()
    # step statistics (FoldedRank.step_stats: the CPU clock's)
    steps_seen: tuple[int, ...] = ()
    has_history: tuple[bool, ...] = ()
    p99_step_s: tuple[float, ...] = ()
    # -- for goodput
    step_history: tuple[tuple[StepSample, ...], ...] = ()  # step_stats.history: the CPU clock's samples
    step_flat: tuple[array, ...] = ()  # their newest as flat numbers (StepStats.flat; empty when not valid)

    def __len__(self) -> int:
        return len(self.rank)


NAMES = tuple(f.name for f in fields(RankColumns))
_NO_FLAT = array("d")  # shared, never mutated


def _row(rv: FoldedRank) -> tuple:
    """One rank's values, in ``NAMES`` order: every attribute chain read once."""
    s = rv.state
    c = s.coll
    st = rv.step_stats
    at = rv.received_at
    return (
        s.rank,
        rv.host,
        s.status,
        s.alive,
        s.proc_status,
        s.heartbeat_age_s,
        rv.heartbeat_moved,
        s.pid,
        s.proc_start_us,
        s.world_size,
        s.pg_state,
        s.phase,
        s.step,
        s.in_data_wait,
        at,
        rv.registered_at,
        rv.progress_at,
        at - s.step_age_s,
        c.group,
        c.seq,
        c.done_seq,
        c.outstanding,
        at - c.since_s,
        c.op,
        c.bytes,
        st.steps_seen,
        bool(st.history),
        st.p99_step_s,
        # -- for goodput
        st.history,
        st.flat if st.flat_of is st.history else _NO_FLAT,
    )


def build(view: ClusterView) -> RankColumns:
    """The columns of ``view``'s ranks (uncached: ``of`` is the memoized one)."""
    if not view.ranks:
        return RankColumns()
    return RankColumns(*zip(*map(_row, view.ranks.values())))


def of(view: ClusterView) -> RankColumns:
    """``build(view)``, once per view object: the view is immutable, so its
    columns are too; kept on the view itself so they go when it does."""
    got = view.__dict__.get("_columns")
    # Another copy of this module (a baseline package timed beside this tree's in
    # benchmarks/scale_profile.py --compare-with) has its own, other fields: not ours.
    if type(got) is not RankColumns:
        got = build(view)
        object.__setattr__(view, "_columns", got)  # frozen dataclass: a cache, not a field
    return got
