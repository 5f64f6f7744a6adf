"""The verdict's per-rank summaries kept between ticks (``verdict.Summaries``)
give the same measure as summarising every rank each tick, and within their
per-tick budget catch up with every rank; the combined clipped statistics are
the separate ones, bit for bit."""

from __future__ import annotations

import random

from watchdog.coordinator.config import Config
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.performance import verdict as V
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.testing import SimJob
from watchdog.stepstats import stats


def _run(tmp_path, until: float):
    path = str(tmp_path / "j.jsonl")
    c = Coordinator(Config(journal=path, job="job", world_size=8, tick_s=0.5), Journal(path, lambda: (1.7e9, 0.0)))
    sim = SimJob(jitter=0.1, seed=5)
    sim.slow(3, 1.4)
    sim.run_until(until, coordinator=c, tick_s=0.5)
    return c, sim.now


def test_kept_summaries_measure_what_a_fresh_summary_measures(tmp_path):
    c, now = _run(tmp_path, 30.0)
    view = c.view_at(now)
    exact = V.measure(now, view)
    assert exact.ready and exact.evidence["slowest_rank"] == 3
    kept = V.measure(now, view, summaries=V.Summaries())
    assert kept == exact and kept.evidence == exact.evidence
    # The coordinator's own, refreshed tick after tick as reports came in, agrees too.
    assert V.measure(now, view, summaries=c.performance._summaries) == exact


def test_a_budget_refreshes_the_longest_waiting_ranks_and_catches_up(tmp_path):
    c, now = _run(tmp_path, 30.0)
    view = c.view_at(now)
    exact = V.measure(now, view)
    s = V.Summaries(budget=3)
    first = V.measure(now, view, summaries=s)
    assert not first.ready  # five of eight ranks not summarised yet: no verdict from part of the job
    V.measure(now, view, summaries=s)
    assert V.measure(now, view, summaries=s) == exact  # 3 + 3 + 2: every rank by the third tick


def test_clipped_mean_stdev_is_the_pair_of_separate_statistics():
    rng = random.Random(7)
    cases = [[], [1.0], [0.1] * 50, [0.1] * 49 + [5.0], [rng.gauss(0.2, 0.02) for _ in range(50)]]
    cases += [[rng.choice([0.1, 0.2, 9.0]) for _ in range(rng.randint(2, 60))] for _ in range(200)]
    for xs in cases:
        assert stats.clipped_mean_stdev(xs) == (stats.clipped_mean(xs), stats.clipped_stdev(xs)), xs


def test_when_every_rank_changes_every_tick_no_summary_is_older_than_ranks_over_budget_ticks():
    sim = SimJob(world_size=12, jitter=0.1, seed=3)
    s = V.Summaries(budget=5)
    now, oldest = 0.0, 0
    while now < 30.0:
        now += 1.0
        view = sim.run_until(now)
        V.measure(now, view, summaries=s)
        if now > 8.0:  # every rank has its 20 steps and reports every second: all change every tick
            ages = [s._tick - s._cache[r][2] for r in view.ranks]
            oldest = max(oldest, *ages)
    assert oldest == 2  # 12 ranks, 5 a tick: refreshed every 3rd tick, never later


def test_above_the_exact_size_a_run_refreshes_a_spread_th_of_the_ranks_and_none_lags_more():
    """From 1,024 to 4,096 ranks the verdict runs every tick: refreshing every
    rank on each was most of the tick. Above ``exact_up_to`` ranks a run
    refreshes one ``spread``-th of them (never summarised ranks at once), so no
    summary is more than ``spread`` runs old; the measure stays the exact one's
    within the hysteresis' reach (the same slowest rank)."""
    sim = SimJob(world_size=24, jitter=0.1, seed=4)
    sim.slow(7, 1.4)
    s = V.Summaries(exact_up_to=4, spread=3)
    now, oldest, refreshed = 0.0, 0, []
    while now < 30.0:
        now += 1.0
        view = sim.run_until(now)
        before = {r: hit[2] for r, hit in s._cache.items()}
        m = V.measure(now, view, summaries=s)
        if now > 8.0:  # every rank has its 20 steps and reports every second: all change every tick
            refreshed.append(sum(1 for r, hit in s._cache.items() if hit[2] != before.get(r)))
            oldest = max(oldest, *(s._tick - s._cache[r][2] for r in view.ranks))
            assert m.ready and m.evidence["slowest_rank"] == V.measure(now, view).evidence["slowest_rank"] == 7
    assert set(refreshed) == {8} and oldest == 2  # 24 ranks, 8 a run: each every 3rd run, never later
    exact = V.Summaries(exact_up_to=24, spread=3)
    V.measure(now, view, summaries=exact)
    assert V.measure(now, view, summaries=exact) == V.measure(now, view)  # up to exact_up_to: every rank, each run
