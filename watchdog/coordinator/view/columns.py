"""The per-rank values the detectors read, as columns, shared by every detector
of the tick.

At 16,384 ranks a pass over the ranks' objects costs ~10-30 ms, nearly all of
it in cache misses (a FoldedRank, its RankState and its CollectiveState are
three objects, allocated wherever their report was folded), and a tick made
about fifteen such passes. Here a detector walks a few flat columns of plain
values instead (``zip(cols.status, cols.alive, ...)``), ~5x cheaper per pass.

Column ``i`` of every field is ``cols.rank[i]``'s value, in the view's rank
order (``view.ranks``), so ``zip`` lines them up. The columns are a pure
function of the view, memoized on the (immutable) view object by ``of``. The
coordinator's ``Folder`` keeps them up to date as it folds (``Store``: a rank's
values written while its new objects are still in cache, row by row, numbers
in typed arrays that a snapshot copies column by column in C), so a tick does
not read the rank objects at all to get them; any other view builds them in
one pass over its ranks (``build``), with the same values
(tests/test_coord_columns.py). A value a detector needs that is not here is
read from ``view.ranks[r]`` for the few ranks that need it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, fields
from operator import itemgetter
from struct import Struct
from struct import error as StructError
from typing import TYPE_CHECKING, Any

from ...stepstats.steps import FLAT_FIELDS

if TYPE_CHECKING:
    from watchdog.report import StepSample

    from ...stepstats.steps import WindowStat
    from .cluster import ClusterView, FoldedRank


@dataclass(frozen=True)
class RankColumns:
    rank: Sequence[int] = ()
    host: Sequence[str] = ()
    # the hook's and the OS's view of the process (RankState)
    status: Sequence[str] = ()
    alive: Sequence[bool] = ()
    proc_status: Sequence[str] = ()
    heartbeat_age_s: Sequence[float] = ()
    heartbeat_moved: Sequence[bool] = ()
    pid: Sequence[int] = ()
    proc_start_us: Sequence[int] = ()
    world_size: Sequence[int] = ()
    pg_state: Sequence[str] = ()
    phase: Sequence[str] = ()
    step: Sequence[int] = ()
    # times on the coordinator's clock (FoldedRank)
    received_at: Sequence[float] = ()
    registered_at: Sequence[float] = ()
    progress_at: Sequence[float] = ()
    step_start: Sequence[float] = ()  # received_at - step_age_s (FoldedRank.step_start)
    # the last collective the hook saw (RankState.coll)
    coll_group: Sequence[int] = ()
    coll_seq: Sequence[int] = ()
    coll_done_seq: Sequence[int] = ()
    coll_outstanding: Sequence[int] = ()
    coll_enter: Sequence[float] = ()  # received_at - coll.since_s (FoldedRank.coll_enter)
    coll_op: Sequence[str] = ()
    coll_bytes: Sequence[int] = ()
    # step statistics (FoldedRank.step_stats: the CPU clock's)
    steps_seen: Sequence[int] = ()
    has_history: Sequence[bool] = ()
    p99_step_s: Sequence[float] = ()
    # -- for loss_anomaly: the latest loss's step (0: the rank reports none), the first non-finite one's
    loss_step: Sequence[int] = ()
    loss_bad_step: Sequence[int] = ()
    loss_calm: Sequence[bool] = ()  # FoldedRank.loss_calm
    # -- for perf (straggler, verdict, loader_starvation, batch_changed)
    # the step split detectors read (FoldedRank.split_stats: the GPU clock's where it keeps up)
    split_clock: Sequence[str] = ()  # "gpu" or "cpu" (FoldedRank.split_clock)
    history: Sequence[tuple[StepSample, ...]] = ()  # FoldedRank.history (each a stephistory.History, read as a tuple)
    windows: Sequence[tuple[WindowStat, ...]] = ()  # FoldedRank.windows
    train_steps: Sequence[int] = ()  # the CPU clock's (FoldedRank.train_steps)
    data_share: Sequence[float] = ()  # the CPU clock's (FoldedRank.data_share)
    batch_per_rank: Sequence[int] = ()
    oncpu_share: Sequence[float] = ()  # its main thread's CPU and run-queue seconds a second (slowcause)
    runq_share: Sequence[float] = ()
    # -- for hang
    fr_held: Sequence[
        bool
    ] = ()  # the rank's Flight Recorder showed it in a collective (flight_recorder_blame reads it)
    # -- for goodput
    step_history: Sequence[tuple[StepSample, ...]] = ()  # step_stats.history: the CPU clock's samples (the same)
    step_flat: Sequence[array] = ()  # their newest as flat numbers (StepStats.flat; empty when not valid)
    step_newest: Sequence[float] = ()  # step_flat's newest step number; -inf when it is empty
    # -- for stalls (goodput's) and hang: where the rank was during its latest long step (RankState.frame)
    frame: Sequence[str] = ()
    frame_step: Sequence[int] = ()

    def __len__(self) -> int:
        return len(self.rank)


NAMES = tuple(f.name for f in fields(RankColumns))
# How the Store keeps each kind of column (_KINDS): numbers in typed arrays (read
# back as the same values: bools as 0/1), anything else in lists.
_KIND = {"Sequence[float]": "d", "Sequence[int]": "q", "Sequence[bool]": "q"}
_KINDS = tuple(_KIND.get(str(f.type), "o") for f in fields(RankColumns))
_NO_FLAT = array("d")  # shared, never mutated
NO_STEP = float("-inf")  # step_newest of a rank without flat numbers (a step number never is)


def _row(rv: FoldedRank) -> tuple:
    """One rank's values, in ``NAMES`` order: every attribute chain read once."""
    s = rv.state
    c = s.coll
    st = rv.step_stats
    at = rv.received_at
    g = rv.gpu_stats
    gpu = bool(g.steps_seen) and rv.gpu_current()  # FoldedRank.split_stats, without a property call per rank
    flat = st.flat if st.flat_of is st.history else _NO_FLAT
    sp = g if gpu else st
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
        s.loss_step,
        s.loss_bad_step,
        rv.loss_calm,
        # -- for perf
        "gpu" if gpu else "cpu",
        sp.history,
        sp.windows,
        st.train_steps,
        st.data_share,
        s.batch_per_rank,
        s.oncpu_share,
        s.runq_share,
        # -- for hang
        bool(rv.colls) or bool(s.fr_newest_seq),
        # -- for goodput
        st.history,
        flat,
        flat[-FLAT_FIELDS] if flat else NO_STEP,
        s.frame,
        s.frame_step,
    )


class _Block:
    """The columns of one kind (``_KINDS``) stored row by row: rank ``i``'s values
    are ``data[i * width:(i + 1) * width]``, so writing a rank's row touches one
    or two cache lines, not one per column (40 arrays: ~14% of a report's fold at
    16,384 ranks, nearly all cache misses). A column is a strided copy, in C."""

    def __init__(self, kind: str, at: tuple[int, ...]) -> None:
        self.at = at  # the block's columns' positions in NAMES
        self.width = len(at)
        self.take = itemgetter(*at)  # a row's values of this kind (itemgetter of 2+: a tuple)
        self.pack = Struct(f"{self.width}{kind}").pack_into if kind != "o" else None
        self.data: Any = array(kind) if kind != "o" else []
        self.zeros: Any = array(kind, bytes(8 * self.width)) if kind != "o" else [None] * self.width

    def put(self, i: int, values: tuple) -> None:
        if self.pack is None:
            self.data[i * self.width : (i + 1) * self.width] = self.take(values)
        else:
            self.pack(self.data, 8 * i * self.width, *self.take(values))

    def column(self, j: int) -> Any:
        return self.data[j :: self.width]


class Store:
    """The columns of the ranks folded so far, kept up to date by the Folder:
    ``put`` writes a rank's values in its row (a new rank gets the next one, as
    the Folder's dict of ranks orders them), ``columns`` copies them for a view.
    A value a typed array cannot hold (not expected: reports are validated)
    makes the store give up; the views then build their own columns."""

    def __init__(self) -> None:
        self._row: dict[int, int] = {}
        self._blocks = tuple(
            _Block(kind, tuple(i for i, k in enumerate(_KINDS) if k == kind)) for kind in ("d", "q", "o")
        )
        self.failed = False

    def put(self, rv: FoldedRank) -> None:
        if self.failed:
            return
        values = _row(rv)
        i = self._row.get(values[0])
        if i is None:
            i = len(self._row)
            self._row[values[0]] = i
            for b in self._blocks:
                b.data.extend(b.zeros)
        try:
            for b in self._blocks:
                b.put(i, values)
        except (OverflowError, TypeError, StructError):  # struct.error: a value the field's type cannot hold
            self.failed = True

    def columns(self) -> RankColumns | None:
        if self.failed:
            return None
        cols: list[Any] = [None] * len(NAMES)
        for b in self._blocks:
            for j, at in enumerate(b.at):
                cols[at] = b.column(j)
        return RankColumns(*cols)


def attach(view: ClusterView, cols: RankColumns | None) -> ClusterView:
    """``view`` with ``cols`` as its columns (the caller vouches that they are):
    the Folder's snapshot, and a copy of a view that changed nothing they hold."""
    if cols is not None:
        object.__setattr__(view, "_columns", cols)  # frozen dataclass: a cache, not a field
    return view


def cached(view: ClusterView) -> RankColumns | None:
    """The columns ``view`` already has, if any."""
    got: RankColumns | None = view.__dict__.get("_columns")
    return got


def build(view: ClusterView) -> RankColumns:
    """The columns of ``view``'s ranks (uncached: ``of`` is the memoized one)."""
    if not view.ranks:
        return RankColumns()
    return RankColumns(*zip(*map(_row, view.ranks.values())))


def with_rows(cols: RankColumns, rows: dict[int, FoldedRank]) -> RankColumns:
    """``cols`` with the rows of the ranks in ``rows`` (each a rank ``cols`` has) taken
    from those objects instead: new columns, ``cols`` untouched; what ``build`` gives
    for the view with those ranks replaced (tests/test_coord_columns.py)."""
    at = {r: i for i, r in enumerate(cols.rank) if r in rows}
    new = [c[:] if isinstance(c, array | list) else list(c) for c in (getattr(cols, n) for n in NAMES)]
    for r, i in at.items():
        for col, value in zip(new, _row(rows[r])):
            col[i] = value
    return RankColumns(*new)


def of(view: ClusterView) -> RankColumns:
    """``build(view)``, once per view object: the view is immutable, so its
    columns are too; kept on the view itself so they go when it does."""
    got = cached(view)
    # Another copy of this module (a baseline package timed beside this tree's in
    # benchmarks/scale_profile.py --compare-with) has its own, other fields: not ours.
    if type(got) is not RankColumns:
        got = build(view)
        attach(view, got)
    return got
