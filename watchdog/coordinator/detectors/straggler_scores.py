"""The straggler detector's scores (``straggler.py`` says what they mean): each
live rank's compute over its last windows against the median of the other
ranks' same windows, with the job's noise thresholds.

``scores`` computes them from scratch (``_compute``); the detector keeps a
``Scorer``, which brings them up to date as windows close and gives the same
floats (tests/test_coord_straggler_equiv.py).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from operator import attrgetter, is_, itemgetter, sub, truediv
from typing import TypeVar, cast

from ...stepstats.stats import median
from ...stepstats.steps import WindowStat
from ..analysis.health import OK, classify_all
from ..analysis.tick_memo import per_tick
from ..config import DetectorConfig
from ..view import columns
from ..view.cluster import ClusterView

Cut = tuple[float, float, float, float, float]  # _baselines: two cut points and three baselines
# A rank's score without the job-wide thresholds: the values of FIELDS, in order.
Row = tuple[float, list[float], float, float, float, int, int]
FIELDS = ("factor", "window_factors", "compute_s", "baseline_s", "step_s", "first_step", "last_step")
Scored = tuple[Row, float, frozenset[int]]  # (its row, its own window noise, the window indices it read)
Change = tuple[tuple[WindowStat, ...], tuple[WindowStat, ...]] | None  # a rank's windows dropped and added; None: gone
# More windows gone than this from an index: its lists are sorted again (each deletion moves
# half the list: ~5 us at 16,384 ranks, a sort ~3 ms).
_PATCH_GONE = 256
_CHUNK = 1024  # ranks in a step of a rescoring spread over ticks (~2 ms)
_STILL = ((), ())  # (a rank whose windows did not move)
_INDEX = attrgetter("index")
_COMPUTE = attrgetter("compute_s")
_FIRST = itemgetter(0)
_SECOND = itemgetter(1)
_POSITIVE = (0.0).__lt__  # b > 0
T = TypeVar("T")
# What a step of a rescoring costs, in seconds of CPU per rank it walks (per window gone or
# new for "tables": an index's sorted lists and the medians), measured at 16,384 ranks on
# the 2-core VM (benchmarks/scale_profile.py): an estimate from the work's size, so that the
# tick's share (TICK_BUDGET_S) needs no clock.
STEP_COST = {"update": 1.7e-6, "tables": 1.5e-6, "group": 0.5e-6, "score": 2.4e-6, "answer": 0.3e-6}
# The rescoring a tick does at most (by STEP_COST): a job of up to ~4,000 ranks rescores on
# one tick; 16,384 ranks closing windows together (~0.13 s) over ~4 ticks.
TICK_BUDGET_S = 0.04


@per_tick()
def scores(view: ClusterView, now: float, cfg: DetectorConfig) -> dict[int, dict]:
    """Per live rank with enough windows: {'factor', 'threshold', 'window_factors',
    'compute_s', 'baseline_s', 'step_s', 'first_step', 'last_step'}. Also feeds
    the straggler-score gauge (``Straggler.gauges``). From scratch: the detector
    keeps a ``Scorer``, which gives the same answer tick after tick for less."""
    return _compute(_windows_of(view, now, cfg), cfg)


def _windows_of(view: ClusterView, now: float, cfg: DetectorConfig) -> dict[int, tuple[WindowStat, ...]]:
    health = classify_all(view, now, cfg)
    c = columns.of(view)
    # ``windows``: the rank's windows as the view gives them (on the GPU clock where it has one)
    return {r: w for r, w in zip(c.rank, c.windows) if w and health[r] == OK}


class Scorer:
    """``scores`` for one job, kept between ticks (the detector owns one: nothing
    is shared between coordinators, and it holds at most the live ranks' windows).

    The scores depend on the live ranks' closed windows only, and a rank closes
    one every ``straggler_window_steps`` steps: between closings the last answer
    is the answer. When windows close, the table of each window index (every
    rank's compute in it, sorted, and its baselines) is rebuilt only for the
    indices that gained or lost a rank's window, and a rank's score is computed
    again only if a window it read changed or got other baselines (a new window
    that is no baseline yet changes no score);
    at 16,384 ranks rebuilding every window of every rank was ~0.5 s a closing.
    That work runs in steps, at most ``tick_budget_s`` of it a tick (``advance``),
    so at scale a rescoring spans a few ticks. Every answer is equal to
    ``_compute`` from scratch on the windows its rescoring started from
    (tests/test_coord_straggler_equiv.py)."""

    def __init__(self, cfg: DetectorConfig, tick_budget_s: float | None = TICK_BUDGET_S) -> None:
        self.cfg = cfg
        # Rescoring spread over ticks: each tick (``scores``) does at most this much of it
        # (by STEP_COST), answering with the last complete scores until the new ones are
        # done. None: all of it on the tick the windows moved (``of``).
        self.tick_budget_s = tick_budget_s
        self.live: dict[int, tuple[WindowStat, ...]] = {}  # the live ranks' windows at the last ``scores``
        self._empty = Scores({}, 0.0, 0.0, cfg)  # the answer before the first one is complete
        self._reset()

    def _reset(self) -> None:
        """No answer yet, nothing kept."""
        self._wins: dict[int, tuple[WindowStat, ...]] = {}  # rank -> its windows at the last answer
        self._keys: dict[int, tuple[int, ...]] = {}  # rank -> the indices of those windows
        # rank -> their computes, read once as the windows arrive: in a coordinator whose heap
        # is ~1 GB (16,384 ranks) the windows lie far apart, and reading each one's compute
        # again on every scoring tick made the scoring 2.6x slower than on the same windows
        # unpickled side by side (cache misses, it seems: the parts that touch no window ran
        # as fast in both)
        self._vals: dict[int, tuple[float, ...]] = {}
        self._members: dict[int, dict[int, WindowStat]] = {}  # window index -> rank -> its window
        # index -> (its windows gone, its windows new) since its table was last brought up to date
        self._changes: dict[int, tuple[list[WindowStat], list[WindowStat]]] = {}
        # index -> (computes sorted, spreads > 0 sorted, sizes sorted)
        self._tables: dict[int, tuple[list[float], list[float], list[int]]] = {}
        self._cuts: dict[int, Cut | None] = {}  # index -> its baselines if usable, as last used
        self._base: dict[int, Kept] = {}
        self._out: Scores | None = None
        # A rescoring under way (``_rescoring``): the windows it started from are its own, so
        # the ranks that move meanwhile wait for the next one; and the cost of its next step.
        self._job: Generator[float, None, Scores] | None = None
        self._ahead = 0.0
        self._job_at: float | None = None  # when the windows it started from were read
        self.as_of: float | None = None  # when the windows behind the last answer were read (``scores``)

    def scores(self, view: ClusterView, now: float, hold: bool = False) -> Scores:
        """This tick's scores: ``advance`` within the tick's budget (none when ``hold``:
        another heavy part has this tick), and the live ranks as of this tick in ``live``."""
        wins_of = self.live = _windows_of(view, now, self.cfg)
        if self.tick_budget_s is None:
            return self.of(wins_of, now)
        return self.advance(wins_of, 0.0 if hold else self.tick_budget_s, now)

    def of(self, wins_of: dict[int, tuple[WindowStat, ...]], at: float | None = None) -> Scores:
        """The scores of these windows, computed to the end now."""
        if self._job is not None:
            self.advance(wins_of, math.inf)  # (the rescoring under way, from its own windows)
        return self.advance(wins_of, math.inf, at)

    def advance(self, wins_of: dict[int, tuple[WindowStat, ...]], budget: float, at: float | None = None) -> Scores:
        """One tick's share of bringing the scores up to ``wins_of``: steps of the
        rescoring under way (or of one started from ``wins_of`` if their windows
        moved) until the next would take the tick past ``budget`` seconds by
        STEP_COST (at least one step; none at a budget of 0); the new scores once
        its last step is done, the last complete ones until then. At 16,384 ranks a
        rescoring is ~0.13 s when they all closed a window: all of it on one tick
        was the tick's p99. ``at``: when ``wins_of`` was read (``as_of``)."""
        if self._job is None:
            prev = self._wins
            if (
                self._out is not None
                and len(prev) == len(wins_of)
                and all(map(is_, map(prev.get, wins_of), wins_of.values()))
            ):
                self.as_of = at
                return self._out  # no rank's windows moved (most ticks): checked in C, without the bookkeeping loop
        if budget <= 0:
            return self._empty if self._out is None else self._out
        if self._job is None:
            self._job = self._rescoring(wins_of, _CHUNK)
            self._ahead = 0.0  # (the first send runs it up to its first step's cost)
            self._job_at = at
        spent = 0.0
        try:
            while not spent or spent + self._ahead <= budget:
                spent += self._ahead
                self._ahead = self._job.send(None)
        except StopIteration as done:
            self._job, self._ahead = None, 0.0
            self._out, self.as_of = done.value, self._job_at
        except Exception:
            # A step that failed left the tables half brought up to date: the next tick starts
            # afresh, from scratch (the detector's runner counts and logs the error).
            self._reset()
            raise
        return self._empty if self._out is None else self._out

    def _rescoring(self, wins_of: dict[int, tuple[WindowStat, ...]], chunk: int) -> Generator[float, None, Scores]:
        """``of``'s work in steps of at most ``chunk`` ranks (or one window index's
        tables), each step's cost yielded before it is done (``advance`` decides
        whether this tick does it)."""
        moved = yield from self._updating(wins_of, chunk)
        if not moved and self._out is not None:
            return self._out
        return (yield from self._scoring(wins_of, moved, chunk))

    def _update(self, wins_of: dict[int, tuple[WindowStat, ...]]) -> dict[int, Change]:
        """Fold the ranks' window changes into the per-index members; the ranks that
        changed, each with the windows it lost and gained (None: gone)."""
        return _done(self._updating(wins_of, max(1, len(wins_of))))

    def _updating(
        self, wins_of: dict[int, tuple[WindowStat, ...]], chunk: int
    ) -> Generator[float, None, dict[int, Change]]:
        """``_update`` in steps of ``chunk`` ranks."""
        prev = self._wins
        moved: dict[int, Change] = {}
        keys, vals = self._keys, self._vals
        for r in [r for r in prev if r not in wins_of]:
            for w in prev.pop(r):
                self._drop(r, w)
            self._base.pop(r, None)
            del keys[r], vals[r]
            moved[r] = None
        items = list(wins_of.items())
        for i in range(0, len(items), chunk):
            part = items[i : i + chunk]
            yield len(part) * STEP_COST["update"]
            self._take(part, moved)
        return moved

    def _take(self, part: list[tuple[int, tuple[WindowStat, ...]]], moved: dict[int, Change]) -> None:
        """``_update`` of these ranks' windows."""
        prev = self._wins
        keys, vals = self._keys, self._vals
        at: int | None = None  # the window index whose members and changes are in m and ch
        m: dict[int, WindowStat] = {}
        ch: tuple[list[WindowStat], list[WindowStat]] = ([], [])
        for r, wins in part:
            old = prev.get(r)
            if old is wins:
                continue
            prev[r] = wins
            dropped: tuple[WindowStat, ...] = ()
            if old is None:
                added: tuple[WindowStat, ...] = wins
                keys[r], vals[r] = tuple(map(_INDEX, wins)), tuple(map(_COMPUTE, wins))
            else:
                # Usually the old windows minus the oldest few, then the new ones (steps._close_windows).
                w0 = wins[0] if wins else None
                if w0 is None:
                    d = None
                elif old[0] is w0:  # (the first two answers of the search below, without a generator)
                    d = 0
                elif len(old) > 1 and old[1] is w0:
                    d = 1
                else:
                    d = next((i for i, w in enumerate(old) if w is w0), None)
                shared = len(old) - d if d is not None else 0
                if d is not None and shared <= len(wins) and all(map(is_, old[d:], wins)):
                    dropped, added = old[:d], wins[shared:]
                    if len(added) == 1:  # one window closed (nearly always): its tuples without a map
                        w = added[0]
                        keys[r] = keys[r][d:] + (w.index,)
                        vals[r] = vals[r][d:] + (w.compute_s,)
                    else:
                        keys[r] = keys[r][d:] + tuple(map(_INDEX, added))
                        vals[r] = vals[r][d:] + tuple(map(_COMPUTE, added))
                else:
                    dropped, added = old, wins
                    keys[r], vals[r] = tuple(map(_INDEX, wins)), tuple(map(_COMPUTE, wins))
                for w in dropped:
                    self._drop(r, w)
            for w in added:  # ranks close the same window one after another: its dict and lists held
                if w.index != at:
                    at = w.index
                    m, ch = self._window(at)
                was = m.get(r)
                if was is not None:
                    ch[0].append(was)
                m[r] = w
                ch[1].append(w)
            moved[r] = (dropped, added)

    def _window(self, x: int) -> tuple[dict[int, WindowStat], tuple[list[WindowStat], list[WindowStat]]]:
        """Window ``x``'s members and its changes since the last scoring, made if new."""
        m = self._members.get(x)
        if m is None:
            m = self._members[x] = {}
        ch = self._changes.get(x)
        if ch is None:
            ch = self._changes[x] = ([], [])
        return m, ch

    def _drop(self, r: int, w: WindowStat) -> None:
        m = self._members.get(w.index)
        if m is not None and m.get(r) is w:
            del m[r]
            ch = self._changes.get(w.index)
            if ch is None:
                ch = self._changes[w.index] = ([], [])
            ch[0].append(w)

    def _score(self, wins_of: dict[int, tuple[WindowStat, ...]], moved: dict[int, Change]) -> Scores:
        return _done(self._scoring(wins_of, moved, max(1, len(wins_of))))

    def _scoring(
        self, wins_of: dict[int, tuple[WindowStat, ...]], moved: dict[int, Change], chunk: int
    ) -> Generator[float, None, Scores]:
        """``_score`` in steps of at most ``chunk`` ranks."""
        cfg = self.cfg
        for index, (left, joined) in self._changes.items():
            yield (len(left) + len(joined)) * STEP_COST["tables"]
            m = self._members.get(index)
            if not m:
                self._members.pop(index, None)
                self._tables.pop(index, None)
                continue
            table = self._tables.get(index)
            if table is None or len(left) > _PATCH_GONE:
                ws = m.values()
                self._tables[index] = (
                    sorted([w.compute_s for w in ws]),
                    sorted([w.spread for w in ws if w.spread > 0]),
                    sorted([w.n for w in ws]),
                )
            else:
                _patch(table, left, joined)
        self._changes.clear()
        need = max(1, (len(wins_of) - 1) // 2)  # a window most other ranks have not closed yet says little
        cuts = {i: _baselines(t[0]) if len(t[0]) - 1 >= need else None for i, t in self._tables.items()}
        regraded = {i for i in cuts.keys() | self._cuts.keys() if cuts.get(i) != self._cuts.get(i)}
        self._cuts = cuts
        usable = {i: c for i, c in cuts.items() if c is not None}
        spread_lists = [t[1] for t in self._tables.values() if t[1]]
        if not usable or not spread_lists:
            self._base.clear()
            return Scores({}, 0.0, 0.0, cfg)
        others = len(wins_of) - 1
        # Medians over every window of every rank (262,144 at 16,384 ranks), from the
        # indices' sorted lists without merging them (the same floats as ``median``).
        per_step = median_of_sorted(spread_lists)
        steps = cfg.straggler_windows * median_of_sorted([t[2] for t in self._tables.values() if t[2]])
        sigma_iid = per_step * math.sqrt((1 + (1 / others if others <= 2 else math.pi / 2 / others)) / steps)
        # Ranks whose windows have the same indices (nearly all: they close windows
        # together, give or take a tick) read the same baselines: scored together.
        groups: dict[tuple[int, ...], list[int]] = {}
        ranks = list(wins_of)
        for i in range(0, len(ranks), chunk):
            part = ranks[i : i + chunk]
            yield len(part) * STEP_COST["group"]
            self._group(part, moved, cuts, regraded, groups)
        base, vals = self._base, self._vals
        for group in groups.values():
            for i in range(0, len(group), chunk):
                part = group[i : i + chunk]
                yield len(part) * STEP_COST["score"]
                got = _group_score([wins_of[r] for r in part], [vals[r] for r in part], usable, cfg)
                if None in got:  # too few windows with a baseline
                    for r, one in zip(part, got):
                        if one is None:
                            base.pop(r, None)
                        else:
                            base[r] = one
                else:
                    base.update(zip(part, cast(list[Kept], got)))
        yield len(wins_of) * STEP_COST["answer"]
        # (base holds no rank that is gone: all of them when its size says so)
        if len(base) == len(wins_of):
            rows = dict(zip(wins_of, map(base.__getitem__, wins_of)))
        else:
            rows = {r: k for r in wins_of if (k := base.get(r)) is not None}
        sigma_windows = median(sorted(map(_SECOND, rows.values()))) if rows else 0.0
        return Scores(rows, sigma_iid, sigma_windows, cfg)

    def _group(
        self,
        part: list[int],
        moved: dict[int, Change],
        cuts: dict[int, Cut | None],
        regraded: set[int],
        groups: dict[tuple[int, ...], list[int]],
    ) -> None:
        """Put the ranks of ``part`` that need scoring again in ``groups`` by their windows' indices."""
        base, keys = self._base, self._keys
        for r in part:
            kept = base.get(r)
            if kept is not None:
                change = moved.get(r, _STILL)
                if change is _STILL:
                    if regraded.isdisjoint(kept[2]):
                        continue
                elif change is not None:
                    # Its windows moved, but not the ones it read: a window index that is no
                    # baseline yet (the first ranks to close a window) is skipped by the walk in
                    # _rank_score, and one dropped beyond what it read was never reached. The
                    # score stands; the new indices join what it read, so that it is scored
                    # again once one of them becomes a baseline (on the ticks where only some
                    # ranks have closed the new window: ~15% off such a tick at 16,384 ranks).
                    dropped, added = change
                    new = [w.index for w in added]
                    if (
                        regraded.isdisjoint(kept[2])
                        and kept[2].isdisjoint([w.index for w in dropped])
                        and not any(map(cuts.get, new))
                    ):
                        if new:
                            base[r] = (kept[0], kept[1], kept[2].union(new), kept[3], kept[4])
                        continue
            key = keys[r]
            g = groups.get(key)
            if g is None:
                groups[key] = [r]
            else:
                g.append(r)


def _done(steps: Generator[float, None, T]) -> T:
    """Every step of a stepwise computation, at once; its answer."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return cast(T, done.value)


def _patch(table: tuple[list[float], list[float], list[int]], gone: list[WindowStat], new: list[WindowStat]) -> None:
    """Bring an index's sorted lists up to date with its windows gone and new, in
    place: each gone value deleted where bisection finds it (a value equal to it:
    the list is the same), the new ones appended and sorted in (timsort merges a
    sorted list and a short unsorted tail in about one pass). Re-sorting a list
    of 16,384 computes per index that changed was ~3 ms of each tick on which
    windows closed."""
    computes, spreads, sizes = table
    for w in gone:
        del computes[bisect_left(computes, w.compute_s)]
        if w.spread > 0:
            del spreads[bisect_left(spreads, w.spread)]
        del sizes[bisect_left(sizes, w.n)]
    if new:
        computes += [w.compute_s for w in new]
        computes.sort()
        spreads += [w.spread for w in new if w.spread > 0]
        spreads.sort()
        sizes += [w.n for w in new]
        sizes.sort()


class Scores(Mapping[int, dict]):
    """The Scorer's answer: ``scores``'s mapping, each rank's dict built when it
    is asked for (with the job-wide thresholds). The detector reads every rank's
    factor (``factors``) and the dicts of a few: at 16,384 ranks building every
    dict was ~30 ms of each tick on which windows closed."""

    __slots__ = ("_cfg", "_factors", "_rows", "sigma_steps", "sigma_windows")

    def __init__(self, rows: dict[int, Kept], sigma_steps: float, sigma_windows: float, cfg: DetectorConfig) -> None:
        self._rows = rows
        self.sigma_steps = sigma_steps
        self.sigma_windows = sigma_windows
        self._cfg = cfg
        self._factors: dict[int, float] | None = None

    def __getitem__(self, r: int) -> dict:
        _, own, _, rows, i = self._rows[r]
        row = rows.row(i)
        sigma = max(self.sigma_steps, self.sigma_windows, own)
        score = dict(zip(FIELDS, row, strict=True))
        score.update(
            threshold=max(self._cfg.straggler_factor, 1.0 + self._cfg.straggler_sigmas * sigma),
            sigma=sigma,
            sigma_steps=self.sigma_steps,
            sigma_windows=self.sigma_windows,
        )
        return score

    def __contains__(self, r: object) -> bool:
        return r in self._rows

    def __iter__(self) -> Iterator[int]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def factors(self) -> dict[int, float]:
        """Each rank's slowdown factor, in the mapping's order."""
        if self._factors is None:
            self._factors = dict(zip(self._rows, map(_FIRST, self._rows.values())))
        return self._factors


def median_of_sorted(lists: list[list]) -> float:
    """``median`` of the values of several sorted lists, without merging them:
    the element(s) at the middle found by bisection (k-th smallest of a union of
    sorted lists), interpolated as ``stats.quantile`` does."""
    n = sum(map(len, lists))
    if not n:
        return 0.0
    pos = (n - 1) * 0.5
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    a = _kth(lists, lo)
    b = a if hi == lo else _kth(lists, hi)
    return a + (b - a) * (pos - lo)


def _kth(lists: list[list], k: int) -> float:
    """The k-th smallest (0-based) value of the union of sorted lists: the least
    value v of any list with more than k values <= v."""
    best = None
    for xs in lists:
        lo, hi = 0, len(xs)  # the first index in xs whose value has more than k values at or below it
        while lo < hi:
            mid = (lo + hi) // 2
            if sum(bisect_right(ys, xs[mid]) for ys in lists) > k:
                hi = mid
            else:
                lo = mid + 1
        if lo < len(xs) and (best is None or xs[lo] < best):
            best = xs[lo]
    assert best is not None
    return best


def _rank_score(rank_wins: tuple[WindowStat, ...], usable: dict[int, Cut], cfg: DetectorConfig) -> Scored | None:
    """One rank's score over its last k windows with a baseline, its own
    window-to-window noise, and the window indices it read (what the Scorer keeps
    between ticks; ``_compute`` asks it for every rank)."""
    k = cfg.straggler_windows
    picked: list[WindowStat] = []  # newest first
    bs: list[float] = []  # their baselines
    read = []
    for w in reversed(rank_wins):
        x = w.index
        read.append(x)
        cut = usable.get(x)
        if cut is None:
            continue
        v = w.compute_s
        b = cut[2] if v <= cut[0] else (cut[3] if v <= cut[1] else cut[4])
        if b > 0:
            picked.append(w)
            bs.append(b)
            if len(picked) == k:
                break
    if len(picked) < k:
        return None
    picked.reverse()
    bs.reverse()
    # Sums over lists (oldest first) rather than generators: the same additions in the same order.
    vs = [w.compute_s for w in picked]
    mine = sum(vs)
    theirs = sum(bs)
    n = len(picked)
    factors = list(map(truediv, vs, bs))
    row = (
        mine / theirs,
        factors,
        mine / n,
        theirs / n,
        sum([w.step_s for w in picked]) / n,
        picked[0].index * cfg.straggler_window_steps,
        (picked[-1].index + 1) * cfg.straggler_window_steps - 1,
    )
    return row, max(_stdev(factors) / math.sqrt(k), _steps_noise(picked)), frozenset(read)


def _steps_noise(picked: Sequence[WindowStat]) -> float:
    """The noise of a rank's factor from its own steps: the root mean square of
    its windows' spreads (clipped stdev / mean of compute) over the steps they
    hold, x sqrt(2) for the baseline's (a rank's own steps are as noisy as the
    others' at most). The job's per-step noise is the median window's, but pauses
    that strike ranks at random (collections of large heaps, a loader's hiccup)
    make some windows far noisier, and a rank that drew more of them was named a
    straggler: 12 of 120 simulated jobs pausing on 1-5% of steps at random, 4
    with this term (all of two ranks, where the baseline is one rank). A
    straggler's steps are as steady as anyone's: its threshold is unchanged.
    ``math.fsum``: the same float in the Scorer's groups and alone."""
    n = sum([w.n for w in picked])
    if not n:
        return 0.0
    return math.sqrt(math.fsum([w.spread * w.spread for w in picked]) / len(picked)) * math.sqrt(2.0 / n)


class _Alone:
    """Rows scored one rank at a time (``_rank_score``)."""

    __slots__ = ("rows",)

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows

    def row(self, i: int) -> Row:
        return self.rows[i]


class _Columns:
    """Rows scored a window column at a time (``_group_score``), each built when
    asked: the detector reads every rank's factor and own noise, and the rest of a
    few ranks' rows."""

    __slots__ = ("columns", "factor", "first_step", "group", "last_step", "mine", "positions", "theirs")

    def __init__(
        self,
        group: list[tuple[WindowStat, ...]],
        positions: list[int],
        columns: list[list[float]],
        sums: tuple[list[float], list[float], list[float]],
        steps: tuple[int, int],
    ) -> None:
        self.group, self.positions, self.columns = group, positions, columns
        self.mine, self.theirs, self.factor = sums
        self.first_step, self.last_step = steps

    def row(self, i: int) -> Row:
        n = len(self.positions)
        ws = self.group[i]
        return (
            self.factor[i],
            [col[i] for col in self.columns],
            self.mine[i] / n,
            self.theirs[i] / n,
            sum([ws[p].step_s for p in self.positions]) / n,
            self.first_step,
            self.last_step,
        )


# A rank's score as the Scorer keeps it: (factor, its own window noise, the window
# indices it read, the rows its row is in, and its position there).
Kept = tuple[float, float, frozenset[int], _Alone | _Columns, int]


def _group_score(
    group: list[tuple[WindowStat, ...]], computes: list[tuple[float, ...]], usable: dict[int, Cut], cfg: DetectorConfig
) -> list[Kept | None]:
    """``_rank_score`` of each of ranks whose windows have the same indices
    (``computes``: each rank's windows' ``compute_s``, in order),
    computed a window column at a time: the same floats (the same operations on
    the same values in the same order: each rank's sums are ``sum`` over its own
    values, oldest window first), without looking up each rank's baselines, and
    with the rows built only when asked for (``_Columns.row``)."""
    size = len(group)
    if not size:
        return []
    k = cfg.straggler_windows
    seq = group[0]
    picked: list[tuple[int, list[float], list[float]]] = []  # (position, computes, baselines), newest first
    read = []
    for p in range(len(seq) - 1, -1, -1):
        x = seq[p].index
        read.append(x)
        cut = usable.get(x)
        if cut is None:
            continue
        t1, t2, b1, b2, b3 = cut
        vs = list(map(itemgetter(p), computes))
        bs = [b1 if v <= t1 else (b2 if v <= t2 else b3) for v in vs]
        # A baseline of 0 (or nan) skips a window for some ranks only (each b is one of the three).
        if not (b1 > 0 and b2 > 0 and b3 > 0) and not all(map(_POSITIVE, bs)):
            alone = [_rank_score(ws, usable, cfg) for ws in group]
            rows = _Alone([got[0] for got in alone if got is not None])
            at = iter(range(size))
            return [None if got is None else (got[0][0], got[1], got[2], rows, next(at)) for got in alone]
        picked.append((p, vs, bs))
        if len(picked) == k:
            break
    if len(picked) < k:
        return [None] * size
    picked.reverse()
    n = len(picked)
    mine: list[float] = list(map(sum, zip(*[vs for _, vs, _ in picked])))
    theirs: list[float] = list(map(sum, zip(*[bs for _, _, bs in picked])))
    columns = [list(map(truediv, vs, bs)) for _, vs, bs in picked]
    factor = list(map(truediv, mine, theirs))
    if n < 2:
        own: Iterable[float] = [0.0] * size
    else:  # _stdev, a column at a time
        means = list(map(truediv, map(sum, zip(*columns)), repeat(n)))
        squares = [list(map(pow, map(sub, col, means), repeat(2))) for col in columns]
        own = map(math.sqrt, map(truediv, map(sum, zip(*squares)), repeat(n - 1)))
    own = map(truediv, own, repeat(math.sqrt(k)))
    positions = [p for p, _, _ in picked]
    own = map(max, own, [_steps_noise([ws[p] for p in positions]) for ws in group])  # as _rank_score
    size_ = cfg.straggler_window_steps
    steps = (seq[picked[0][0]].index * size_, (seq[picked[-1][0]].index + 1) * size_ - 1)
    cols = _Columns(group, [p for p, _, _ in picked], columns, (mine, theirs, factor), steps)
    return list(zip(factor, own, repeat(frozenset(read)), repeat(cols), range(size)))


def _compute(wins_of: dict[int, tuple[WindowStat, ...]], cfg: DetectorConfig) -> dict[int, dict]:
    # Per window index, every live rank's compute, sorted. The baseline of a rank's
    # window is the median of the others' (median_without); ranks with an equal
    # value leave the same others, so its position can be found by bisection
    # instead of carried through the sort: this loop is the detector's cost at
    # 16k ranks, so it touches each window once.
    table: dict[int, list[float]] = {}
    spreads: list[float] = []
    ns: list[int] = []
    for wins in wins_of.values():
        for w in wins:
            table.setdefault(w.index, []).append(w.compute_s)
            if w.spread > 0:
                spreads.append(w.spread)
            ns.append(w.n)
    need = max(1, (len(wins_of) - 1) // 2)  # a window most other ranks have not closed yet says little
    usable = {index: _baselines(sorted(vals)) for index, vals in table.items() if len(vals) - 1 >= need}
    if not usable or not spreads:
        return {}
    # The score's own noise if steps jitter independently: the rank's mean over
    # K windows vs a median of the others' (a median of m costs ~pi/2m in variance).
    others = len(wins_of) - 1
    per_step = median(spreads)
    steps = cfg.straggler_windows * median(ns)
    sigma_iid = per_step * math.sqrt((1 + (1 / others if others <= 2 else math.pi / 2 / others)) / steps)
    out: dict[int, dict] = {}
    own: dict[int, float] = {}  # each rank's window-to-window noise (below)
    for r, rank_wins in wins_of.items():
        got = _rank_score(rank_wins, usable, cfg)
        if got is not None:
            out[r] = dict(zip(FIELDS, got[0], strict=True))
            own[r] = got[1]
    # The noise as the job shows it: on a shared or contended host slowdowns come in
    # bursts (a neighbour's process, a page-cache flush) that hit a rank for a window
    # or two, which the per-step spread above does not predict. A rank's
    # window-to-window spread of its own factor measures that: the median over ranks
    # for the job, and the rank's own, so one burst does not make a straggler of it.
    # A straggler is slow in every window alike, so neither hides a steady one.
    sigma_windows = median(sorted(own.values())) if own else 0.0
    for r, sc in out.items():
        sigma = max(sigma_iid, sigma_windows, own[r])
        threshold = max(cfg.straggler_factor, 1.0 + cfg.straggler_sigmas * sigma)
        sc.update(threshold=threshold, sigma=sigma, sigma_steps=sigma_iid, sigma_windows=sigma_windows)
    return out


def _stdev(xs: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mean = sum(xs) / n
    return math.sqrt(sum([(x - mean) ** 2 for x in xs]) / (n - 1))


def _baselines(vals: list[float]) -> tuple[float, float, float, float, float]:
    """``median_without(vals, bisect_left(vals, v))`` for any ``v``, as two cut
    points and three answers: leaving one value out moves the median to one of
    three places, depending only on where ``v`` falls. Returns (t1, t2, b1, b2,
    b3): b1 if v <= t1, else b2 if v <= t2, else b3 (the same floats as
    ``median_without``; tests/test_coord_straggler_equiv.py)."""
    m = len(vals) - 1
    if m <= 0:
        return (0.0, 0.0, 0.0, 0.0, 0.0)
    mid = m // 2
    if m % 2:  # the median of the others is one element: vals[mid + 1] while v sits at or below vals[mid]
        return (vals[mid], vals[mid], vals[mid + 1], vals[mid], vals[mid])
    return (
        vals[mid - 1],
        vals[mid],
        (vals[mid] + vals[mid + 1]) / 2,
        (vals[mid - 1] + vals[mid + 1]) / 2,
        (vals[mid - 1] + vals[mid]) / 2,
    )
