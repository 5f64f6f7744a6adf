"""``steps.add_samples`` keeps its order statistics incrementally; these tests
hold it to the plain definitions it replaced (a copy of the code before, below):
on random sample streams every field of every StepStats is equal, bit for bit,
including streams that branch (an older StepStats folded again, as the pure
``view.fold`` does), repeat steps, tie on durations, and change phase."""

from __future__ import annotations

import math
from dataclasses import fields, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from watchdog.coordinator.config import DetectorConfig
from watchdog.report import StepSample
from watchdog.stepstats import stats
from watchdog.stepstats.steps import P99_SAMPLES, StepStats, WindowStat, add_samples


def reference(s: StepStats, samples: tuple[StepSample, ...], cfg: DetectorConfig) -> StepStats:
    """add_samples as it was before it kept running statistics (main at dc9c9fc)."""
    # Since the step summaries: a warm-up sample sent again is not counted twice (StepStats.unkept_step).
    last = s.history[-1].step if s.history else (s.unkept_step if s.unkept_step >= 0 else None)
    fresh = [x for x in samples if last is None or x.step > last]
    if not fresh:
        return s
    seen = s.steps_seen
    skip = max(0, cfg.warmup_steps - seen)
    history = (s.history + tuple(fresh[skip:]))[-cfg.history_steps :]
    if not history:
        return replace(s, steps_seen=seen + len(fresh), history=history, unkept_step=fresh[-1].step)
    p99 = stats.quantile([x.step_s for x in history[-P99_SAMPLES:]], 0.99)
    train = [x for x in history[-2 * cfg.starvation_window_steps :] if x.phase == "train"][
        -cfg.starvation_window_steps :
    ]
    return StepStats(
        steps_seen=seen + len(fresh),
        history=history,
        windows=reference_windows(s.windows, history, cfg),
        p99_step_s=p99,
        train_steps=len(train),
        data_share=stats.data_share(train),
    )


def reference_windows(
    windows: tuple[WindowStat, ...], history: tuple[StepSample, ...], cfg: DetectorConfig
) -> tuple[WindowStat, ...]:
    """steps._close_windows as it was: every window past, rescanned on every report."""
    size = cfg.straggler_window_steps
    newest = history[-1].step // size
    done = windows[-1].index if windows else -1
    by_window: dict[int, list[StepSample]] = {}
    if newest - 1 <= done:
        return windows
    for x in reversed(history):
        w = x.step // size
        if w <= done:
            break
        if w < newest and x.phase == "train":
            by_window.setdefault(w, []).append(x)
    out = list(windows)
    for w in sorted(by_window):
        xs = by_window[w]
        if len(xs) >= max(2, size // 2):
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


# Few distinct durations, so ties (which the sorted windows must order as a stable sort does) are common.
durations = st.sampled_from([0.0, 0.01, 0.1, 0.1, 0.25, 0.3, 1.5, 0.1 + 0.2]) | st.floats(0.0, 5.0)
sample = st.tuples(durations, durations, durations, st.sampled_from(["train", "train", "train", "eval", "checkpoint"]))
batches = st.lists(st.tuples(st.integers(-3, 6), st.lists(sample, max_size=12)), max_size=60)
configs = st.builds(
    DetectorConfig,
    warmup_steps=st.integers(0, 4),
    history_steps=st.sampled_from([1, 3, 40, 99, 100, 150, 256]),
    starvation_window_steps=st.sampled_from([1, 2, 7, 50, 60]),
    straggler_window_steps=st.sampled_from([1, 2, 5, 20]),
    straggler_windows=st.sampled_from([1, 4, 10]),
)


def stream(batches_: list) -> list[tuple[StepSample, ...]]:
    """Reports' step samples: each batch starts a little before or after the last
    step sent (a retried report repeats steps, a missed one skips some)."""
    out, step = [], 0
    for gap, xs in batches_:
        step = max(0, step + gap)
        batch = []
        for step_s, data_s, coll_s, phase in xs:
            batch.append(StepSample(step=step, step_s=step_s, data_s=min(data_s, step_s), coll_s=coll_s, phase=phase))
            step += 1
        out.append(tuple(batch))
    return out


@settings(max_examples=300, deadline=None)
@given(batches, configs)
def test_equal_to_the_plain_definitions_report_by_report(batches_, cfg):
    new, ref = StepStats(), StepStats()
    for samples in stream(batches_):
        new, ref = add_samples(new, samples, cfg), reference(ref, samples, cfg)
        assert new == ref  # every field but the running statistics, floats compared exactly


@settings(max_examples=150, deadline=None)
@given(batches, configs, st.data())
def test_a_stale_step_stats_folded_again_gives_the_plain_answer(batches_, cfg, data):
    """The pure ``fold`` may fold into an older view after the Folder moved on:
    the running statistics it shares with its successor no longer describe it."""
    kept: list[StepStats] = [StepStats()]
    new, ref = StepStats(), StepStats()
    for samples in stream(batches_):
        if len(kept) > 1 and data.draw(st.booleans()):
            old = kept[data.draw(st.integers(0, len(kept) - 1))]
            assert add_samples(old, samples, cfg) == reference(old, samples, cfg)
        new, ref = add_samples(new, samples, cfg), reference(ref, samples, cfg)
        assert new == ref  # the main line is not disturbed by the branch
        kept.append(new)


@settings(max_examples=150, deadline=None)
@given(batches, configs, st.data())
def test_branches_never_show_each_others_samples(batches_, cfg, data):
    """Successive histories share one buffer (stephistory): two different
    reports folded into the same older StepStats (the pure ``fold`` into an
    older view, then the Folder's own fold) must each see only their own
    samples, and every StepStats made must go on reading as it did when made."""
    reports = stream(batches_)
    kept: list[tuple[StepStats, StepStats, tuple]] = [(StepStats(), StepStats(), ())]  # (new, reference, history then)
    for i, samples in enumerate(reports):
        at = len(kept) - 1 if data.draw(st.booleans()) else data.draw(st.integers(0, len(kept) - 1))
        new, ref, _ = kept[at]
        others = [samples]
        if data.draw(st.booleans()):  # a second, different report into the same StepStats
            extra = data.draw(st.lists(sample, max_size=3))  # and maybe steps the main line never sees
            others.append(reports[(i + 1) % len(reports)] + tuple(_sample(10**6 + j, x) for j, x in enumerate(extra)))
        for xs in others:
            got, want = add_samples(new, xs, cfg), reference(ref, xs, cfg)
            assert got == want
            kept.append((got, want, tuple(got.history)))
    for new, ref, then in kept:
        assert new == ref and new.history == then and tuple(new.history) == then


def _sample(step: int, x: tuple) -> StepSample:
    step_s, data_s, coll_s, phase = x
    return StepSample(step=step, step_s=step_s, data_s=min(data_s, step_s), coll_s=coll_s, phase=phase)


def test_running_statistics_are_reused_not_rebuilt():
    """The point of it: a long-lived rank's next report reads only its new samples."""
    cfg = DetectorConfig()
    s = StepStats()
    for k in range(0, 400, 4):
        s = add_samples(s, tuple(StepSample(k + i, 0.1 + (k + i) % 7 / 100, 0.01, 0.0) for i in range(4)), cfg)
    run = s.running
    s2 = add_samples(s, (StepSample(400, 0.2, 0.05, 0.0),), cfg)
    assert s2.running is run  # the same windows, moved on by one sample
    assert s2 == reference(s, (StepSample(400, 0.2, 0.05, 0.0),), cfg)
    # Built without __init__ (report.made): every slot set (an unset one would raise on reading).
    assert type(s2) is StepStats and all(hasattr(s2, f.name) for f in fields(StepStats))


def test_non_finite_durations_from_an_unvalidated_caller_fall_back_to_the_definitions():
    cfg = DetectorConfig(warmup_steps=0)
    s = add_samples(StepStats(), (StepSample(1, 0.1, 0.0, 0.0), StepSample(2, math.nan, 0.0, 0.0)), cfg)
    r = reference(StepStats(), (StepSample(1, 0.1, 0.0, 0.0), StepSample(2, math.nan, 0.0, 0.0)), cfg)
    assert s.history == r.history and s.train_steps == r.train_steps
    s = add_samples(s, (StepSample(3, 0.2, 0.0, 0.0),), cfg)  # still answers, and goes on
    assert s.history[-1].step == 3
