"""A rank's recent step samples, folded into what detectors read per tick:
the history (warm-up dropped), p99 step time, closed straggler windows, and the
loader's data share. Computed once per report, so a tick stays O(ranks).

Knows nothing of the view: ``view.FoldedRank`` holds a ``StepStats`` and calls
``add_samples``, so the dependency goes one way (view -> steps)."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field, replace
from math import floor, isfinite

from watchdog.report import StepSample

from . import stats
from .config import DetectorConfig

P99_SAMPLES = 100


@dataclass(frozen=True)
class WindowStat:
    """One straggler window: train steps with step // window_steps == index."""

    index: int
    n: int
    compute_s: float  # clipped mean of the rank's compute time per step
    step_s: float  # mean wall step time
    spread: float = 0.0  # step-to-step noise: clipped stdev / mean of compute


@dataclass(frozen=True)
class StepStats:
    """What one incarnation's step samples say so far."""

    steps_seen: int = 0  # step samples seen in this incarnation, warm-up included
    history: tuple[StepSample, ...] = ()  # recent steps, warm-up excluded
    windows: tuple[WindowStat, ...] = ()
    p99_step_s: float = 0.0
    train_steps: int = 0  # train steps in the loader-starvation window (up to starvation_window_steps)
    data_share: float = 0.0  # share of their step time spent waiting on data (see loader_starvation)
    # The order statistics behind p99_step_s and data_share, kept up to date as
    # samples arrive (``_Running``); not part of the value (compare=False). Shared,
    # and mutated, by the StepStats that follows this one: it is used only while
    # it still describes ``history`` (``_Running.tip``), otherwise rebuilt from it.
    running: _Running | None = field(default=None, compare=False, repr=False)


def add_samples(st: StepStats, samples: tuple[StepSample, ...], cfg: DetectorConfig) -> StepStats:
    """``st`` with ``samples`` added (those not newer than its history are ignored).

    O(new samples x log window): the p99 over the last ``P99_SAMPLES`` steps and
    the loader share over the last train steps come from sorted windows kept
    between reports, not from re-sorting them on every report (at 16,384 ranks
    that was most of the fold). The results are those of the plain definitions
    (``stats.quantile``, ``stats.data_share`` over the history's tail), bit for bit:
    tests/test_coord_steps_incremental.py compares both on random streams."""
    last = st.history[-1].step if st.history else None
    fresh = [x for x in samples if last is None or x.step > last]
    if not fresh:
        return st
    seen = st.steps_seen
    skip = max(0, cfg.warmup_steps - seen)  # a rank's first steps: compile, warm-up, loader start
    new = fresh[skip:]
    history = (st.history + tuple(new))[-cfg.history_steps :]
    if not history:
        return replace(st, steps_seen=seen + len(fresh), history=history)
    run = st.running
    if run is None or run.tip is not st.history or not run.fits(cfg) or not _finite(new):
        run = _Running.build(st.history, cfg)  # a stale or foreign StepStats: rebuilt from its history
    if run is None:  # non-finite durations (a caller that skipped validation): the plain definitions
        return _recomputed(st, history, seen + len(fresh), cfg)
    for x in new:
        run.push(x)
    run.tip = history
    train_steps, share = run.data_share()
    return StepStats(
        steps_seen=seen + len(fresh),
        history=history,
        windows=_close_windows(st.windows, history, cfg),
        p99_step_s=run.p99(),
        train_steps=train_steps,
        data_share=share,
        running=run,
    )


def _finite(xs: list[StepSample]) -> bool:
    return all(isfinite(x.step_s) and isfinite(x.data_s) for x in xs)


def _recomputed(st: StepStats, history: tuple[StepSample, ...], seen: int, cfg: DetectorConfig) -> StepStats:
    """The plain definitions, from the history's tail."""
    train = [x for x in history[-2 * cfg.starvation_window_steps :] if x.phase == "train"][
        -cfg.starvation_window_steps :
    ]
    return StepStats(
        steps_seen=seen,
        history=history,
        windows=_close_windows(st.windows, history, cfg),
        p99_step_s=stats.quantile([x.step_s for x in history[-P99_SAMPLES:]], 0.99),
        train_steps=len(train),
        data_share=stats.data_share(train),
    )


class _Running:
    """Sorted windows over the newest samples of a rank's history (warm-up
    excluded), updated one sample at a time:

    - the step times of the last ``P99_SAMPLES`` samples, sorted (p99);
    - the train samples among the last ``2 x starvation_window_steps`` samples,
      at most ``starvation_window_steps`` of them, sorted by (data wait, arrival),
      which is the order ``stats.data_share``'s stable sort gives, with their step
      times in the same order, so its sums add the same numbers in the same order.

    Windows are capped by the history's own length (``history[-n:]`` of a
    shorter history is all of it)."""

    __slots__ = (
        "_cfg",
        "_n",
        "_p_fifo",
        "_p_len",
        "_p_sorted",
        "_s_cap",
        "_s_data",
        "_s_fifo",
        "_s_keys",
        "_s_len",
        "_s_step",
        "tip",
    )

    def __init__(self, cfg: DetectorConfig) -> None:
        self.tip: tuple[StepSample, ...] = ()  # the history this describes
        self._cfg = (cfg.history_steps, cfg.starvation_window_steps)
        self._n = 0  # samples pushed
        self._p_len = min(P99_SAMPLES, cfg.history_steps)
        self._p_fifo: deque[float] = deque()
        self._p_sorted: list[float] = []
        self._s_len = min(2 * cfg.starvation_window_steps, cfg.history_steps)  # samples looked at
        self._s_cap = cfg.starvation_window_steps  # train samples kept
        self._s_fifo: deque[tuple[float, int, float]] = deque()  # (data_s, index, step_s), oldest first
        self._s_keys: list[tuple[float, int]] = []  # (data_s, index), sorted
        self._s_data: list[float] = []  # data_s, in _s_keys' order
        self._s_step: list[float] = []  # step_s, in _s_keys' order

    def fits(self, cfg: DetectorConfig) -> bool:
        return self._cfg == (cfg.history_steps, cfg.starvation_window_steps)

    @classmethod
    def build(cls, history: tuple[StepSample, ...], cfg: DetectorConfig) -> _Running | None:
        """From a history's tail; None if a duration in it is not finite."""
        run = cls(cfg)
        tail = history[-max(run._p_len, run._s_len) :] if history else ()
        if not _finite(list(tail)):
            return None
        for x in tail:
            run.push(x)
        run.tip = history
        return run

    def push(self, x: StepSample) -> None:
        i = self._n
        self._n = i + 1
        if self._p_len > 0:
            insort(self._p_sorted, x.step_s)
            self._p_fifo.append(x.step_s)
            if len(self._p_fifo) > self._p_len:
                old = self._p_fifo.popleft()
                del self._p_sorted[bisect_left(self._p_sorted, old)]
        fifo = self._s_fifo
        if x.phase == "train" and self._s_cap > 0:
            key = (x.data_s, i)
            at = bisect_left(self._s_keys, key)
            self._s_keys.insert(at, key)
            self._s_data.insert(at, x.data_s)
            self._s_step.insert(at, x.step_s)
            fifo.append((x.data_s, i, x.step_s))
        # Out: train samples that left the last _s_len samples, then the oldest beyond _s_cap.
        while fifo and (fifo[0][1] <= i - self._s_len or len(fifo) > self._s_cap):
            data_s, j, _ = fifo.popleft()
            at = bisect_left(self._s_keys, (data_s, j))
            del self._s_keys[at], self._s_data[at], self._s_step[at]

    def p99(self) -> float:
        """``stats.quantile(window, 0.99)`` of the sorted window (same interpolation)."""
        items = self._p_sorted
        if not items:
            return 0.0
        pos = (len(items) - 1) * 0.99
        lo = floor(pos)
        hi = min(lo + 1, len(items) - 1)
        return items[lo] + (items[hi] - items[lo]) * (pos - lo)

    def data_share(self) -> tuple[int, float]:
        """(train samples in the window, ``stats.data_share`` of them): the top
        tenth by data wait left out, the rest summed in sorted order."""
        n = len(self._s_keys)
        if not n:
            return 0, 0.0
        keep = n - max(1, n // 10) or n
        step = sum(self._s_step[:keep])
        return n, (sum(self._s_data[:keep]) / step if step > 0 else 0.0)


def _close_windows(
    windows: tuple[WindowStat, ...], history: tuple[StepSample, ...], cfg: DetectorConfig
) -> tuple[WindowStat, ...]:
    """Summarise every window that the newest sample has moved past."""
    size = cfg.straggler_window_steps
    newest = history[-1].step // size
    done = windows[-1].index if windows else -1
    by_window: dict[int, list[StepSample]] = {}
    if newest - 1 <= done:
        return windows
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
            comp = [x.compute_s for x in xs]
            mean = stats.clipped_mean(comp)
            out.append(
                WindowStat(
                    w,
                    len(xs),
                    mean,
                    sum(x.step_s for x in xs) / len(xs),
                    stats.clipped_stdev(comp) / mean if mean > 0 else 0.0,
                )
            )
    keep = max(16, 2 * cfg.straggler_windows)
    return tuple(out[-keep:])
