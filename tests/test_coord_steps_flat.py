"""``StepStats.flat``, the newest samples as flat numbers that the goodput ledger
reads instead of the samples themselves: on random report streams (steps
repeated, skipped, warm-up dropped, short histories, older StepStats folded
again) it is always exactly the encoding of the history's last samples, as
many of them as it holds, and it holds as many as it may."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.view import columns
from watchdog.report import StepSample
from watchdog.stepstats.steps import FLAT_FIELDS, FLAT_SAMPLES, PAUSE_PHASES, StepStats, add_samples

durations = st.sampled_from([0.0, 0.01, 0.1, 0.25, 1.5, 0.1 + 0.2]) | st.floats(0.0, 5.0)
sample = st.tuples(durations, durations, durations, st.sampled_from(["train", "train", "eval", "checkpoint", "init"]))
batches = st.lists(st.tuples(st.integers(-3, 6), st.lists(sample, max_size=12)), max_size=40)
configs = st.builds(DetectorConfig, warmup_steps=st.integers(0, 4), history_steps=st.sampled_from([1, 3, 40, 256]))


def stream(batches_: list, start: int = 0) -> list[tuple[StepSample, ...]]:
    out, step = [], start
    for gap, xs in batches_:
        step = max(0, step + gap)
        batch = []
        for step_s, data_s, coll_s, phase in xs:
            batch.append(StepSample(step, step_s, data_s, coll_s, phase))
            step += 1
        out.append(tuple(batch))
    return out


def encoded(samples) -> list[float]:
    return [
        v
        for x in samples
        for v in (float(x.step), x.step_s, x.data_s, x.step_s - x.data_s - x.coll_s, float(x.phase in PAUSE_PHASES))
    ]


def held(s: StepStats) -> int:
    assert s.flat_of is s.history and len(s.flat) % FLAT_FIELDS == 0
    n = len(s.flat) // FLAT_FIELDS
    assert s.flat.tolist() == encoded(s.history[len(s.history) - n :])
    return n


@settings(max_examples=200, deadline=None)
@given(batches, configs, st.data())
def test_flat_numbers_are_the_historys_newest_samples(batches_, cfg, data):
    kept = [StepStats()]
    s = StepStats()
    for samples in stream(batches_):
        if len(kept) > 1 and data.draw(st.booleans()):  # an older StepStats folded again (the pure fold does)
            old = add_samples(kept[data.draw(st.integers(0, len(kept) - 1))], samples, cfg)
            if old.history:
                assert held(old) == min(FLAT_SAMPLES, len(old.history))
        s = add_samples(s, samples, cfg)
        if s.history:
            assert held(s) == min(FLAT_SAMPLES, len(s.history))
        kept.append(s)


def test_steps_too_large_for_a_double_are_left_out_and_the_history_read_instead():
    cfg = DetectorConfig(warmup_steps=0)
    big = 1 << 53
    s = add_samples(StepStats(), t.steps(big - 3, 6), cfg)
    assert held(s) == 0  # a step beyond 2^53 among the newest: none held
    s = add_samples(s, t.steps(big + 3, 2), cfg)
    assert held(s) == 0
    s = add_samples(StepStats(), t.steps(5, 6), cfg)
    assert held(s) == 6


def test_non_finite_durations_leave_no_flat_numbers_the_columns_would_read():
    cfg = DetectorConfig(warmup_steps=0)
    s = add_samples(StepStats(), t.steps(1, 4), cfg)
    s = add_samples(s, (StepSample(5, math.nan, 0.0, 0.0),), cfg)  # an unvalidated caller
    assert s.flat_of is not s.history
    view = t.view([t.rank(0, world_size=1, recent_steps=(StepSample(5, math.nan, 0.0, 0.0),))])
    assert len(columns.of(view).step_flat[0]) == 0
