"""Intermittent stragglers (analysis/intermittent_stalls.py): a rank that stalls now and then while the
others wait is named by the straggler detector (its compute) or loader_starvation
(its data wait), from the steps the goodput ledger split; stalls spread over the job, taken in turns, in one burst, too
small to matter, or on a rank slow on most steps (the windows' straggler) name
nobody here."""

from __future__ import annotations

import pytest

from watchdog.coordinator.analysis.intermittent_stalls import MIN_SHARE, STALL_STEPS, SplitStep, stalling
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.loader_starvation import LoaderStarvation
from watchdog.coordinator.detectors.straggler import Straggler
from watchdog.coordinator.performance import goodput
from watchdog.coordinator.testing import SimJob

CFG = DetectorConfig()
W, K = CFG.straggler_window_steps, CFG.straggler_windows


def steps(n: int, stalls: dict[int, int], ranks: int = 8, extra: float = 1.0, data: float = 0.0) -> list[SplitStep]:
    """``n`` train steps of 0.12 s; step -> the rank that stalled ``extra`` s in it
    (``data`` s of it waiting on its loader)."""
    out = []
    for k in range(1, n + 1):
        r = stalls.get(k)
        if r is None:
            out.append(SplitStep(k, 0.12, k % ranks, 0.01, 0.0, ranks))
        else:
            out.append(SplitStep(k, 0.12 + extra, r, extra, data, ranks))
    return out


def test_a_rank_stalling_every_25_steps_is_named():
    (st,) = stalling(steps(200, dict.fromkeys(range(25, 201, 25), 3)), W, K)
    assert st.rank == 3 and st.events == tuple(range(25, 201, 25))
    assert st.excess_s == pytest.approx(8.0) and st.share == pytest.approx(8.0 / (200 * 0.12 + 8.0))
    assert st.odds < 1e-3 and (st.first_step, st.last_step) == (1, 200)


def test_stalls_taken_in_turns_name_nobody():
    # Two ranks of eight alternate: each has half, which chance gives some rank often enough.
    assert stalling(steps(200, {k: 3 + (k // 25) % 2 for k in range(25, 201, 25)}), W, K) == []


def test_a_rank_without_most_of_the_stalls_is_not_named():
    # Rank 1 has 25 of 60: far more than chance gives one rank of eight, but the job
    # stalls mostly elsewhere (pauses all over it, one rank hit more by chance or not).
    others = {k: 2 + k % 6 for k in range(3, 3 + 35 * 14, 14)}
    mine = dict.fromkeys(range(10, 10 + 25 * 20, 20), 1)
    assert stalling(steps(500, {**others, **mine}), W, K) == []
    assert [s.rank for s in stalling(steps(500, {**dict(list(others.items())[:20]), **mine}), W, K)] == [1]


def test_one_burst_is_not_intermittent_stalling():
    # Eight stalls in a row (a neighbour's backup for a second): one or two windows, not K.
    assert stalling(steps(200, dict.fromkeys(range(100, 108), 5)), W, K) == []


def test_stalls_too_small_to_matter_name_nobody():
    small = 0.12 * MIN_SHARE * 200 / 8 * 0.9  # eight stalls worth under MIN_SHARE of the time
    assert stalling(steps(200, dict.fromkeys(range(25, 201, 25), 3), extra=small), W, K) == []


def test_a_rank_slow_on_most_steps_is_left_to_the_windows():
    assert stalling(steps(200, {k: 2 for k in range(1, 201) if k % 4}), W, K) == []


@pytest.mark.parametrize("ranks,events,named", [(2, 14, False), (2, 16, True), (4, 7, False), (4, 8, True)])
def test_fewer_ranks_need_more_stalls_to_rule_out_chance(ranks, events, named):
    every = 500 // events
    got = stalling(steps(STALL_STEPS, {every * (i + 1): 1 for i in range(events)}, ranks=ranks), W, K)
    assert [s.rank for s in got] == ([1] if named else [])


def run(sim: SimJob, until: float, every: float = 0.5) -> list:
    """The straggler and loader_starvation detectors fed by a goodput ledger, as the
    coordinator wires them: every finding they make, tick by tick."""
    ledger, dets = goodput.Ledger(), (Straggler(CFG), LoaderStarvation(CFG))
    for det in dets:
        det.stalls = ledger.stalls
    now, found = 0.0, []
    while now < until:
        now += every
        view = sim.run_until(now)
        for det in dets:
            found += det.check(now, view)
        ledger.tick(now, view)
    return found


def test_a_periodic_stall_on_one_rank_is_named_by_the_straggler_detector():
    sim = SimJob(jitter=0.1, seed=7, compute_s=0.1)
    sim.stall(5, every=25, extra_s=1.0, from_step=40)
    found = run(sim, until=60.0)
    assert found and {(f.kind, f.ranks) for f in found} == {("straggler", (5,))}
    f = found[0]
    assert f.kind == "straggler" and "stalls:" in f.reason and "every 25 steps" in f.reason
    assert f.evidence["stall_steps"][0] >= 40 and 0.15 < f.evidence["cost_share"] < 0.4


def test_a_loader_that_stalls_now_and_then_is_named_by_loader_starvation():
    # One rank's loader waits 1 s every 25 steps: its data share, the slowest tenth of
    # steps left out, stays low; the others wait for it a third of the time.
    sim = SimJob(jitter=0.1, seed=8, compute_s=0.1)
    sim.stall(2, every=25, extra_s=1.0, from_step=40, on_data=True)
    found = run(sim, until=60.0)
    assert found and {(f.kind, f.ranks) for f in found} == {("loader_starvation", (2,))}
    f = found[0]
    assert "its loader stalls:" in f.reason and "every 25 steps" in f.reason and "on host host0" in f.reason
    assert f.evidence["stall_data_s"] == pytest.approx(f.evidence["stall_excess_s"], rel=0.1)


def test_stalls_split_by_what_the_rank_waited_on():
    (st,) = stalling(steps(200, dict.fromkeys(range(25, 201, 25), 3), data=0.8), W, K)
    assert st.on_data and st.data_s == pytest.approx(8 * 0.8)
    (st,) = stalling(steps(200, dict.fromkeys(range(25, 201, 25), 3), data=0.2), W, K)
    assert not st.on_data


@pytest.mark.parametrize("world,seed", [(8, 11), (4, 12), (2, 13)])
def test_pauses_all_over_the_job_name_nobody(world, seed):
    # Each rank pauses 0.5 s on 2% of its steps (collections of large heaps everywhere):
    # the job loses time, but no rank more than chance gives it.
    sim = SimJob(world_size=world, ranks_per_host=min(4, world), jitter=0.1, seed=seed, compute_s=0.1)
    sim.pauses(0.02, 0.5)
    assert run(sim, until=400.0, every=2.0) == []


@pytest.mark.parametrize("world,seed,until", [(8, 104, 240.0), (16, 105, 60.0), (16, 108, 130.0)])
def test_random_pauses_do_not_make_a_straggler_of_the_rank_that_drew_more(world, seed, until):
    # Each rank pauses 0.3 s on 5% of its steps at random; in each of these jobs one
    # rank drew two or three times its share over 80 steps, and the windows' clipped
    # means took it for a 1.07x straggler: its own steps' noise now sets its threshold.
    sim = SimJob(world_size=world, ranks_per_host=4, jitter=0.2, seed=seed, compute_s=0.1)
    sim.pauses(0.05, 0.3)
    assert run(sim, until=until, every=2.0) == []


def test_a_consistent_straggler_is_named_once_by_its_slowdown():
    sim = SimJob(jitter=0.05, seed=3, compute_s=0.1)
    sim.slow(2, 1.6)
    found = run(sim, until=30.0)
    assert found and {f.ranks for f in found} == {(2,)}
    assert all("slower than the median" in f.reason for f in found)


def test_the_ledger_forgets_the_stalls_of_the_job_before_a_restart():
    sim = SimJob(jitter=0.1, seed=7, compute_s=0.1)
    sim.stall(5, every=25, extra_s=1.0)
    ledger, now = goodput.Ledger(), 0.0
    while now < 40.0:
        now += 0.5
        ledger.tick(now, sim.run_until(now))
    assert [st.rank for st in stalling(ledger.stalls.steps, W, K)] == [5]
    ledger.tick(now + 0.5, sim.run_until(now + 0.5), restarting=True)  # the job restarting: new ranks
    assert not ledger.stalls.steps
