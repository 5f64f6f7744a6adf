"""A rank's recent step samples, folded into what detectors read per tick:
the history (warm-up dropped), p99 step time, closed straggler windows, and the
loader's data share. Computed once per report, so a tick stays O(ranks).

Knows nothing of the view: ``view.FoldedRank`` holds a ``StepStats`` and calls
``add_samples``, so the dependency goes one way (view -> steps)."""

from __future__ import annotations

from dataclasses import dataclass, replace

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


def add_samples(st: StepStats, samples: tuple[StepSample, ...], cfg: DetectorConfig) -> StepStats:
    last = st.history[-1].step if st.history else None
    fresh = [x for x in samples if last is None or x.step > last]
    if not fresh:
        return st
    seen = st.steps_seen
    skip = max(0, cfg.warmup_steps - seen)  # a rank's first steps: compile, warm-up, loader start
    history = (st.history + tuple(fresh[skip:]))[-cfg.history_steps :]
    if not history:
        return replace(st, steps_seen=seen + len(fresh), history=history)
    p99 = stats.quantile([x.step_s for x in history[-P99_SAMPLES:]], 0.99)
    train = [x for x in history[-2 * cfg.starvation_window_steps :] if x.phase == "train"][
        -cfg.starvation_window_steps :
    ]
    return StepStats(
        steps_seen=seen + len(fresh),
        history=history,
        windows=_close_windows(st.windows, history, cfg),
        p99_step_s=p99,
        train_steps=len(train),
        data_share=stats.data_share(train),
    )


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
