"""A rank's recent step samples, folded into what detectors read per tick:
the history (warm-up dropped), p99 step time, closed straggler windows, and the
loader's data share. Computed once per report, so a tick stays O(ranks).

Knows nothing of the view: ``view.FoldedRank`` holds a ``StepStats`` and calls
``add_samples``, so the dependency goes one way (view -> steps)."""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from itertools import chain
from math import floor, inf

from watchdog.contracts import stepsummary as sm
from watchdog.contracts.report import StepSample, made, twinned

from . import stats
from .history import History, Steps, appendable, snapshot

P99_SAMPLES = 100
assert P99_SAMPLES <= 101, "_Running.p99 interpolates between the two largest: true of 101 values at most"
# The newest samples as flat numbers (``StepStats.flat``), FLAT_FIELDS doubles each:
# step, step_s, data_s, (step_s - data_s) - coll_s, 1.0 in a pause phase else 0.0.
FLAT_SAMPLES = 32
FLAT_FIELDS = 5
PAUSE_PHASES = ("checkpoint", "eval")  # phases in which the job does no training (goodput's checkpoint_eval)
_EXACT_STEPS = 1 << 53  # a step number above this is not exact as a double: no flat values then
_PAUSES = frozenset(PAUSE_PHASES)


@dataclass(frozen=True)
class WindowStat:
    """One straggler window: train steps with step // window_steps == index."""

    index: int
    n: int
    compute_s: float  # clipped mean of the rank's compute time per step
    step_s: float  # mean wall step time
    spread: float = 0.0  # step-to-step noise: clipped stdev / mean of compute


@twinned
@dataclass(frozen=True, slots=True)  # one per rank per report: slots are built ~4x faster (``made``)
class StepStats:
    """What one incarnation's step samples say so far."""

    steps_seen: int = 0  # step samples seen in this incarnation, warm-up included
    history: Steps = ()  # recent steps, warm-up excluded (stephistory: a History, read as a tuple)
    windows: tuple[WindowStat, ...] = ()
    p99_step_s: float = 0.0
    train_steps: int = 0  # train steps in the loader-starvation window (up to starvation_window_steps)
    data_share: float = 0.0  # share of their step time spent waiting on data (see loader_starvation)
    # The order statistics behind p99_step_s and data_share, kept up to date as
    # samples arrive (``_Running``); not part of the value (compare=False). Shared,
    # and mutated, by the StepStats that follows this one: it is used only while
    # it still describes ``history`` (``_Running.tip``), otherwise rebuilt from it.
    running: _Running | None = field(default=None, compare=False, repr=False)
    # Every window below this one has been summarised or found to be no evidence
    # (too few train steps): it is not looked at again. Derived, so not compared.
    windows_scanned: int = field(default=-1, compare=False, repr=False)
    # The newest samples of ``history`` (at most FLAT_SAMPLES; fewer, or none, is
    # always allowed) as flat numbers in one array, built as they arrive: the
    # goodput ledger reads them each tick for every rank, and an array's doubles
    # are one object where a StepSample is an object, its floats and its step
    # number scattered in memory (at 16,384 ranks, reading those was most of the
    # ledger's tick). Never mutated; valid only while ``flat_of is history``.
    flat: array = field(default_factory=lambda: array("d"), compare=False, repr=False)
    flat_of: Steps | None = field(default=None, compare=False, repr=False)
    # The newest step number seen while the history is empty (its warm-up samples
    # are not kept): a warm-up sample sent again (a report whose reply was lost)
    # is not counted twice, nor kept as if it were a later step. -1: none.
    unkept_step: int = field(default=-1, compare=False, repr=False)


def add_samples(st: StepStats, samples: tuple[StepSample, ...], cfg: sm.Settings) -> StepStats:
    """``st`` with ``samples`` added (those not newer than its history are ignored).

    O(new samples x log window): the p99 over the last ``P99_SAMPLES`` steps and
    the loader share over the last train steps come from sorted windows kept
    between reports, not from re-sorting them on every report (at 16,384 ranks
    that was most of the fold). The results are those of the plain definitions
    (``stats.quantile``, ``stats.data_share`` over the history's tail), bit for bit:
    tests/test_coord_steps_incremental.py compares both on random streams."""
    grown = _grown(st, samples, cfg)
    if isinstance(grown, StepStats):
        return grown
    seen, new, seq, origin, start, history = grown
    old = st.history
    run = st.running
    if run is None or run.tip is not old or not run.fits(cfg):
        run = _Running.build(old, cfg)  # a stale or foreign StepStats: rebuilt from its history
    if run is None or not run.extend(seq, start, origin):  # a duration not finite (a caller that skipped validation)
        return _recomputed(st, history, seen, cfg)
    run.tip = history
    train_steps, share = run.data_share()
    windows, scanned = st.windows, st.windows_scanned
    # No window closed since the last report (most reports): ``scanned``, once set, is at or
    # past the last window summarised, and a window closes when the newest step is past it.
    if not new or scanned < 0 or new[-1].step // cfg.straggler_window_steps - 1 > scanned:
        windows, scanned = _close_windows(windows, scanned, history, cfg, new[-1] if new else None)
    return made(  # StepStats(...) without its frozen __init__'s call per field: one per rank per report
        StepStats,
        seen,
        history,
        windows,
        run.p99(),
        train_steps,
        share,
        run,
        scanned,
        _flat(st, new, min(FLAT_SAMPLES, cfg.history_steps)),
        history,
        st.unkept_step,
    )


# add_samples and with_summary build a StepStats from its values in this order (positional: ``made``).
assert tuple(f.name for f in fields(StepStats)) == (
    "steps_seen",
    "history",
    "windows",
    "p99_step_s",
    "train_steps",
    "data_share",
    "running",
    "windows_scanned",
    "flat",
    "flat_of",
    "unkept_step",
)


Grown = tuple[int, list[StepSample], Sequence[StepSample], int, int, Steps]


def _grown(st: StepStats, samples: tuple[StepSample, ...], cfg: sm.Settings) -> Grown | StepStats:
    """The history with ``samples`` added, as ``add_samples`` and ``with_summary``
    both need it: (steps seen, the new samples kept, the buffer ``seq`` of the old
    history then the new samples from ``origin`` on, ``start`` of the new ones in
    it, the history); or, where there is nothing to compute, the StepStats itself
    (``st`` when no sample is newer than its history)."""
    old = st.history
    last: int | None
    if old.__class__ is History:  # the usual case, read without a call
        last = old.buf[old.end - 1].step
    else:
        last = old[-1].step if old else (st.unkept_step if st.unkept_step >= 0 else None)
    fresh = [x for x in samples if last is None or x.step > last]
    if not fresh:
        return st
    seen = st.steps_seen
    skip = max(0, cfg.warmup_steps - seen)  # a rank's first steps: compile, warm-up, loader start
    new = fresh[skip:]
    seen += len(fresh)
    keep = cfg.history_steps
    history: Steps
    seq: Sequence[StepSample]  # the old history then the new samples, from ``origin`` on
    if new and keep > 0:
        seq, origin, start = appendable(old)
        seq += new
        history = snapshot(seq, origin, keep)
    else:  # no new sample (the same history), or a config without a bound: as the tuples were
        seq, origin = tuple(old) + tuple(new), 0
        start = len(seq) - len(new)
        history = old if not new and start <= keep else seq[-keep:]  # what the tuple's slice gave
        if not history:
            return replace(
                st, steps_seen=seen, history=history, flat=array("d"), flat_of=history, unkept_step=fresh[-1].step
            )
    return seen, new, seq, origin, start, history


def with_summary(
    st: StepStats, samples: tuple[StepSample, ...], summary: tuple[float, ...], cfg: sm.Settings
) -> StepStats | None:
    """``add_samples(st, samples, cfg)`` with the statistics read from ``summary``
    (``watchdog.contracts.stepsummary``: the agent's ``add_samples`` of the same samples under
    the same settings) instead of computed: the history is still this one's. None
    when the summary does not end at the newest sample kept here (an agent that
    restarted, a report lost one way): the caller computes then.

    From the same stream the two agree bit for bit; where they saw different
    streams (one restarted), the agent's statistics are over the samples it saw,
    and its windows closed since its previous accepted report are added after
    the last one here (a window closed between the two is missed, not made up)."""
    grown = _grown(st, samples, cfg)
    if isinstance(grown, StepStats):  # nothing new: its statistics already describe its history
        return grown if grown.history and summary[sm.LAST_STEP] == grown.history[-1].step else None
    seen, new, _seq, _origin, _start, history = grown
    if summary[sm.LAST_STEP] != history[-1].step:
        return None
    windows = st.windows
    if len(summary) > sm.HEAD:
        after = windows[-1].index if windows else -1
        closed = [
            WindowStat(int(index), int(n), compute_s, step_s, spread)
            for index, n, compute_s, step_s, spread in zip(*(iter(summary[sm.HEAD :]),) * sm.WINDOW)
            if index > after
        ]
        windows = (windows + tuple(closed))[-max(16, 2 * cfg.straggler_windows) :]
    return made(
        StepStats,
        seen,
        history,
        windows,
        summary[sm.P99_STEP_S],
        int(summary[sm.TRAIN_STEPS]),
        summary[sm.DATA_SHARE],
        None,  # running: its statistics are the agent's
        int(summary[sm.WINDOWS_SCANNED]),
        _flat(st, new, min(FLAT_SAMPLES, cfg.history_steps)),
        history,
        st.unkept_step,
    )


def summary_config(cfg: sm.Settings) -> tuple[int, ...]:
    """The settings a step summary depends on (``stepsummary.CONFIG_FIELDS``): what
    replies give agents and what their reports say they used."""
    return tuple(getattr(cfg, name) for name in sm.CONFIG_FIELDS)


def summary_of(st: StepStats, before: StepStats) -> tuple[float, ...]:
    """The wire form (``watchdog.contracts.stepsummary``) of ``st``, an agent's StepStats
    after ``before`` took a report's samples: its statistics and the windows
    closed since ``before``. ``st`` has kept a sample (a history)."""
    history = st.history
    after = before.windows[-1].index if before.windows else -1
    closed = [w for w in st.windows if w.index > after][-sm.MAX_WINDOWS :]
    return (
        float(history[-1].step),
        st.p99_step_s,
        float(st.train_steps),
        st.data_share,
        float(st.windows_scanned),
        *chain.from_iterable((float(w.index), float(w.n), w.compute_s, w.step_s, w.spread) for w in closed),
    )


def _flat(st: StepStats, new: list[StepSample], keep: int) -> array:
    """``StepStats.flat`` after ``new`` is appended to ``st.history``: the last
    ``keep`` samples at most, those of ``st.flat`` (or of its history's tail) and
    the new ones; empty if a step number is too large to be exact."""
    added = _encode(new[-keep:])
    if added is None:
        return array("d")
    room = keep * FLAT_FIELDS - len(added)  # for the newest of the samples before
    if not room:
        return added
    base = st.flat if st.flat_of is st.history else _encode(st.history[-keep:])
    if base is None:
        return array("d")
    return (base[-room:] if len(base) > room else base) + added


def _encode(samples: tuple[StepSample, ...] | list[StepSample]) -> array | None:
    """The samples' flat numbers; None if a step number is too large to be exact."""
    out: list[float] = []
    for x in samples:
        step, step_s, data_s = x.step, x.step_s, x.data_s
        if step >= _EXACT_STEPS:
            return None
        out += (step, step_s, data_s, step_s - data_s - x.coll_s, 1.0 if x.phase in _PAUSES else 0.0)
    return array("d", out)


def _recomputed(st: StepStats, history: Steps, seen: int, cfg: sm.Settings) -> StepStats:
    """The plain definitions, from the history's tail."""
    train = [x for x in history[-2 * cfg.starvation_window_steps :] if x.phase == "train"][
        -cfg.starvation_window_steps :
    ]
    windows, scanned = _close_windows(st.windows, st.windows_scanned, history, cfg)
    return StepStats(
        steps_seen=seen,
        history=history,
        windows=windows,
        windows_scanned=scanned,
        p99_step_s=stats.quantile([x.step_s for x in history[-P99_SAMPLES:]], 0.99),
        train_steps=len(train),
        data_share=stats.data_share(train),
    )


class _Running:
    """Order statistics over the newest samples of a rank's history (warm-up
    excluded), updated one sample at a time:

    - the two largest step times of the last ``P99_SAMPLES`` samples: with at
      most 101 values the p99's interpolation is between the largest and the
      one below it, so a sorted window (a binary search, an insert and a delete
      per sample) is not needed; when one of the two leaves the window they are
      found again from it (~2% of samples);
    - the train samples among the last ``2 x starvation_window_steps`` samples,
      at most ``starvation_window_steps`` of them, sorted by data wait, ties in
      arrival order: the order ``stats.data_share``'s stable sort gives, so its
      sums add the same numbers in the same order. As two parallel arrays of
      doubles (data wait, step time) rather than a list of (data wait, arrival,
      step time) tuples: inserting on the right of equal data waits keeps ties
      in arrival order, and the sample that leaves (the oldest) is the leftmost
      of its equals, so the data wait alone places both, without a tuple's
      comparison, and the shares are sums of array slices (add_samples ~20%
      cheaper at 16,384 ranks than with the tuples' slices mapped through
      itemgetters). Arrays, not lists of floats: a binary search reads the
      doubles in place, not float objects scattered over the heap.

    Windows are capped by the history's own length (``history[-n:]`` of a
    shorter history is all of it)."""

    __slots__ = (
        "_cfg",
        "_n",
        "_p_len",
        "_p_n",
        "_p_second",
        "_p_top",
        "_s_cap",
        "_s_data",
        "_s_fifo",
        "_s_len",
        "_s_step",
        "tip",
    )

    def __init__(self, cfg: sm.Settings) -> None:
        self.tip: Steps | None = ()  # the history this describes (None: unusable)
        self._cfg = (cfg.history_steps, cfg.starvation_window_steps)
        self._n = 0  # samples pushed
        self._p_len = min(P99_SAMPLES, cfg.history_steps)
        self._p_n = 0  # step times in the p99 window
        self._p_top = self._p_second = -inf  # its two largest (-inf: fewer values than that)
        self._s_len = min(2 * cfg.starvation_window_steps, cfg.history_steps)  # samples looked at
        self._s_cap = cfg.starvation_window_steps  # train samples kept
        self._s_fifo: deque[tuple[float, int]] = deque()  # (data_s, index), oldest first
        self._s_data = array("d")  # their data_s, sorted (ties: oldest first)
        self._s_step = array("d")  # their step_s, in the same order

    def fits(self, cfg: sm.Settings) -> bool:
        return self._cfg == (cfg.history_steps, cfg.starvation_window_steps)

    @classmethod
    def build(cls, history: Steps, cfg: sm.Settings) -> _Running | None:
        """From a history's tail; None if a duration in it is not finite."""
        run = cls(cfg)
        if not run.extend(history[-max(run._p_len, run._s_len, 1) :] if history else (), 0):
            return None
        run.tip = history
        return run

    def extend(self, seq: Sequence[StepSample], start: int, origin: int = 0) -> bool:
        """Add ``seq[start:]``, newest last, where ``seq[origin:start]`` is the
        history the samples added before came in: the step time leaving the
        p99 window is read from there. False if a step or data time is not
        finite (NaN would break the sorted windows' order): then the windows are
        left unusable (``tip`` None) and the caller computes without them."""
        i = self._n
        p_len, p_n, top, second = self._p_len, self._p_n, self._p_top, self._p_second
        lost = False  # one of the two largest left the window: found again from it below
        s_len, s_cap, s_fifo = self._s_len, self._s_cap, self._s_fifo
        s_data, s_step = self._s_data, self._s_step
        full = origin + p_len  # from here on the p99 window is full: a sample in, its oldest out
        for pos in range(start, len(seq)):
            x = seq[pos]
            step_s, data_s = x.step_s, x.data_s
            if step_s - step_s != 0.0 or data_s - data_s != 0.0:  # NaN or infinite
                self.tip = None
                return False
            if p_len:
                if pos >= full:
                    if seq[pos - p_len].step_s >= second:
                        lost = True
                else:
                    p_n += 1
                if step_s >= top:
                    top, second = step_s, top
                elif step_s > second:
                    second = step_s
            if s_cap and x.phase == "train":
                at = bisect_right(s_data, data_s)  # after its equals: they arrived before it
                s_data.insert(at, data_s)
                s_step.insert(at, step_s)
                s_fifo.append((data_s, i))
            # Out: train samples no longer among the last s_len samples, then the oldest beyond s_cap.
            while s_fifo and (s_fifo[0][1] <= i - s_len or len(s_fifo) > s_cap):
                at = bisect_left(s_data, s_fifo.popleft()[0])  # the oldest present: first of its equals
                del s_data[at]
                del s_step[at]
            i += 1
        self._n = i
        if lost:
            # The window: the last p_n samples, all in ``seq`` from ``origin`` on (p_n counts only those).
            top, second = _two_largest([x.step_s for x in seq[len(seq) - p_n :]])
        self._p_n, self._p_top, self._p_second = p_n, top, second
        return True

    def p99(self) -> float:
        """``stats.quantile(window, 0.99)`` (same interpolation): with n <= 101
        values its lower point is the second largest, its upper the largest."""
        n = self._p_n
        if not n:
            return 0.0
        top = self._p_top
        lo = self._p_second if n > 1 else top  # (one value: both points are it)
        pos = (n - 1) * 0.99
        return lo + (top - lo) * (pos - floor(pos))  # stats.quantile's arithmetic, signed zeros and all

    def data_share(self) -> tuple[int, float]:
        """(train samples in the window, ``stats.data_share`` of them): the top
        tenth by data wait left out, the rest summed in sorted order."""
        data = self._s_data
        n = len(data)
        if not n:
            return 0, 0.0
        keep = n - max(1, n // 10) or n
        step = sum(self._s_step[:keep])
        return n, (sum(data[:keep]) / step if step > 0 else 0.0)


def _two_largest(values: list[float]) -> tuple[float, float]:
    """(largest, second largest) of ``values`` (-inf where there are fewer)."""
    if len(values) < 2:
        return (values[0] if values else -inf), -inf
    top = max(values)
    values.remove(top)  # one of its equals: the second largest may be another
    return top, max(values)


def _close_windows(
    windows: tuple[WindowStat, ...], scanned: int, history: Steps, cfg: sm.Settings, last: StepSample | None = None
) -> tuple[tuple[WindowStat, ...], int]:
    """Summarise every window that the newest sample has moved past; returns the
    windows and the new ``StepStats.windows_scanned``. A window's samples are all
    in once the newest is past it (samples arrive in step order), so one that was
    no evidence stays so and is not scanned again on every report. ``last``: the
    history's newest sample where the caller has it (no read of the history then,
    on most reports)."""
    size = cfg.straggler_window_steps
    newest = (last if last is not None else history[-1]).step // size
    done = max(windows[-1].index if windows else -1, scanned)
    if newest - 1 <= done:
        return windows, done
    by_window: dict[int, list[StepSample]] = {}
    for x in reversed(history):  # only the tail can be in windows not yet closed
        w = x.step // size
        if w <= done:
            break
        if w < newest and x.phase == "train":
            by_window.setdefault(w, []).append(x)
    out = list(windows)
    for w in sorted(by_window):
        xs = by_window[w]
        if len(xs) >= max(2, size // 2):  # a window mostly outside training is no evidence
            mean, sd = stats.clipped_mean_stdev([x.compute_s for x in xs])  # one median and MAD for both
            out.append(
                WindowStat(w, len(xs), mean, sum(x.step_s for x in xs) / len(xs), sd / mean if mean > 0 else 0.0)
            )
    keep = max(16, 2 * cfg.straggler_windows)
    return tuple(out[-keep:]), newest - 1
