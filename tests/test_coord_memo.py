"""The per-tick memo returns what the function itself would, and only for the
same view object, time and config."""

from __future__ import annotations

from dataclasses import replace

from watchdog.coordinator import testing as t
from watchdog.coordinator.analysis import health
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors import straggler, straggler_scores
from watchdog.coordinator.detectors.collective_hang import hang_state


def test_memo_hits_only_on_the_same_view_time_and_config():
    cfg = DetectorConfig()
    states = t.with_rank(t.healthy(8), 3, heartbeat_age_s=9.0)
    view = t.view(states, now=100.0)
    first = health.classify_all(view, 100.5, cfg)
    assert health.classify_all(view, 100.5, cfg) is first
    assert first == health.classify_all.uncached(view, 100.5, cfg)
    assert health.classify_all(view, 101.0, cfg) is not first  # another time
    same_content = t.view(states, now=100.0)
    assert health.classify_all(same_content, 100.5, cfg) is not first  # another view object
    other_cfg = replace(cfg, frozen_heartbeat_s=60.0)
    assert health.classify_all(view, 100.5, other_cfg)[3] == health.OK != first[3]


def test_memoized_analyses_equal_the_uncached_ones():
    cfg = DetectorConfig()
    hung = [
        t.rank(
            r,
            step=50,
            step_age_s=8.2,
            collective=t.coll(seq=51, outstanding=1, since_s=8.0),
            recent_steps=t.steps(1, 50),
        )
        for r in range(8)
        if r != 5
    ] + [t.rank(5, step=50, step_age_s=9.0, recent_steps=t.steps(1, 50))]
    view = t.view(hung, now=100.0)
    for now in (100.0, 101.0, 101.0):
        assert hang_state(now, view, cfg) == hang_state.uncached(now, view, cfg)
        assert health.analyze(view, now, cfg) == health._analyze.uncached(view, now, cfg)
        assert straggler_scores.scores(view, now, cfg) == straggler_scores.scores.uncached(view, now, cfg)
    hang = hang_state(101.0, view, cfg)
    assert hang is not None and hang.blame is not None and hang.blame.culprits == (5,)


def test_the_memos_do_not_keep_the_last_ticks_view_alive():
    """A view held by a memo after its tick was freed by the next tick (~0.1 s at
    16,384 ranks); the memos, the mismatch answer and the straggler detector
    hold it weakly, so it goes as soon as the tick lets go of it, and a new view
    (even one at the same address) is never taken for it."""
    import gc
    import weakref

    from watchdog.coordinator.analysis import mismatch

    cfg = DetectorConfig()
    det = straggler.Straggler(cfg)
    view = t.view(t.healthy(8, recent_steps=t.steps(1, 100)), now=100.0)
    first = health.classify_all(view, 100.5, cfg)
    hang_state(100.5, view, cfg)
    mismatch.find(view)
    det.check(100.5, view)
    gone = weakref.ref(view)
    del view
    gc.collect()
    assert gone() is None
    again = t.view(t.with_rank(t.healthy(8), 3, heartbeat_age_s=9.0), now=100.0)
    assert health.classify_all(again, 100.5, cfg) is not first
    assert health.classify_all(again, 100.5, cfg)[3] == health.FROZEN
