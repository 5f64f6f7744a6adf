"""Why a rank is slow (slowcause): what costs enough to report, a host that takes a
rank's CPU (a finding), rank 0's own extra work (the extra_work advisory)."""

from __future__ import annotations

import pytest

from watchdog.contracts.finding import ADVISORY_KINDS
from watchdog.coordinator import testing as t
from watchdog.coordinator.analysis import slowcause
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.extra_work import ExtraWork
from watchdog.coordinator.detectors.straggler import Straggler

CFG = DetectorConfig()


@pytest.mark.parametrize(
    "extra_s,share,worth",
    [
        (0.00013, 0.049, False),  # healthy ddp_tutorial on a shared host: 0.13 ms of a 2.7 ms step
        (0.00018, 0.0075, False),  # its noisy-neighbour run's wrong rank: 0.2 ms of 23 ms
        (0.014, 0.104, True),  # trl's rank 0 logging every step: 14 ms of 136 ms
        (0.005, 0.047, True),  # a 1.05x straggler of 100 ms compute
        (0.002, 0.01, False),  # 2 ms a step of 200 ms: 0.6 s a minute
        (0.0009, 0.5, False),  # half of a 1.8 ms step: below the scheduler's noise
    ],
)
def test_what_costs_enough_to_report(extra_s, share, worth):
    assert slowcause.costs_enough(extra_s, share) is worth


def _ranks(sched: list[tuple[float, float]], **kw):
    """One rank per (seconds a second on a CPU, seconds a second waiting for one)."""
    return [
        t.rank(r, world_size=len(sched), oncpu_share=oncpu, runq_share=runq, **kw)
        for r, (oncpu, runq) in enumerate(sched)
    ]


@pytest.mark.parametrize(
    "sched,starved",
    [
        ([(0.9, 0.02), (0.45, 0.5)], [1]),  # one hog shares rank 1's core: half its runnable time waits
        ([(0.9, 0.02), (0.9, 0.03), (0.9, 0.02), (0.25, 0.7)], [3]),
        ([(0.3, 0.6), (0.3, 0.65)], []),  # a loaded host: both wait alike (measured 0.2-0.6, 0.06 apart)
        ([(0.26, 0.56), (0.24, 0.47)], []),  # healthy trl on that host: rank 0's own threads wait with it
        # healthy trl at -n 4 (load ~10): rank 0 did rank 1's work on a CPU and waited three times as
        # long for one, 0.66 of its runnable time against 0.395: the host's load, which rank it fell on
        ([(0.2558, 0.4964), (0.2451, 0.16)], []),
        # trl with a hog on rank 1's core, the host otherwise quiet: 0.54 against 0.285, named
        ([(0.3486, 0.139), (0.3273, 0.3822)], [1]),
        ([(0.05, 0.05), (0.9, 0.02)], []),  # contended 50% but idle: 0.03 s a second is no cost
        ([(0.9, 0.02)], []),  # one rank: nothing to compare with
        ([(0.0, 0.0), (0.0, 0.0)], []),  # not measured (no schedstat, an older agent)
        ([(0.9, 0.02), (0.4, 0.5), (0.4, 0.5), (0.9, 0.02), (0.9, 0.02)], [1, 2]),  # a host's two ranks
        ([(0.5, 0.01), (0.5, 0.5)], [1]),  # the hog's victim, its peer asleep half of each step waiting for it
        # test_e2e_alone at -n 3: rank 0 spins alone on a busy host while rank 1 sleeps in DDP's
        # all-reduce waiting for it (runnable 0.03 s a second against 0.18): no baseline, nobody starved
        ([(0.0595, 0.1223), (0.0195, 0.0116)], []),
    ],
)
def test_a_rank_is_starved_when_its_host_takes_its_cpu(sched, starved):
    view = t.view(_ranks(sched), now=100.0, ranks_per_host=1)
    assert [c.rank for c in slowcause.starved(view)] == starved


def test_stopped_and_dead_ranks_are_not_judged_by_their_last_reading():
    states = _ranks([(0.9, 0.02), (0.4, 0.5)])
    for gone in ({"proc_status": "stopped"}, {"alive": False, "status": "exited"}):
        view = t.view([states[0], t.rank(1, world_size=2, oncpu_share=0.4, runq_share=0.5, **gone)], now=100.0)
        assert slowcause.starved(view) == []


def _compute(r: int, slow: int, factor: float, compute_s: float, step_s: float) -> tuple:
    """120 steps whose compute is ``compute_s`` (``factor`` times it on ``slow``)."""
    c = compute_s * (factor if r == slow else 1.0)
    return t.steps(1, 120, step_s=step_s, coll_s=step_s - c)


def _detect(states, ranks_per_host: int = 1):
    view = t.view(states, now=100.0, ranks_per_host=ranks_per_host)
    straggler, extra = Straggler(CFG), ExtraWork(CFG)
    extra.straggler = straggler
    return straggler.check(100.0, view), extra.check(100.0, view)


# (what it is, world, slow rank, factor, compute s, step s, the slow rank's (on-CPU, wait) s/s,
#  the straggler's findings, the extra_work advisories)
CASES = [
    ("rank 2 slower: a finding", 4, 2, 1.5, 0.1, 0.2, None, [(2,)], []),
    ("rank 0 slower, its host leaves it its CPU: advice", 4, 0, 1.6, 0.023, 0.136, None, [], [(0,)]),
    ("rank 0 slower, measured and not starved: advice", 2, 0, 1.6, 0.023, 0.136, (0.5, 0.1), [], [(0,)]),
    ("rank 0 slower on a starved core: a finding", 2, 0, 1.6, 0.023, 0.136, (0.3, 0.6), [(0,)], []),
    ("rank 1 1.27x on 0.5 ms steps: noise", 2, 1, 1.27, 0.00049, 0.0027, None, [], []),
    ("rank 0 1.3x on 0.5 ms steps: noise, no advice either", 2, 0, 1.3, 0.00049, 0.0027, None, [], []),
    (
        "equal compute, rank 1 starved (DDP's all-reduce evens the steps): a finding",
        2,
        1,
        1.0,
        0.05,
        0.1,
        (0.45, 0.5),
        [(1,)],
        [],
    ),
]


def test_a_starved_reading_from_a_host_that_missed_its_reports_names_nobody():
    """The run-queue wait is a reading of now: on a quiet host (its agent stopped, its
    link cut) it is stale, and the monitor cannot see the rank; once the host reports
    again the same reading names it."""
    states = [
        t.rank(r, world_size=2, recent_steps=_compute(r, 1, 1.0, 0.05, 0.1), oncpu_share=oncpu, runq_share=runq)
        for r, (oncpu, runq) in enumerate([(0.9, 0.02), (0.45, 0.5)])
    ]
    for received_s_ago, named in ((5.0, []), (0.5, [(1,)])):
        view = t.view(states, now=100.0, ranks_per_host=1, received={"host1": 100.0 - received_s_ago})
        assert [f.ranks for f in Straggler(CFG).check(100.0, view)] == named, received_s_ago


@pytest.mark.parametrize("others,named", [((0.3, 0.6), []), ((0.9, 0.02), [(2,)])])
def test_a_slow_rank_whose_host_has_no_reading_yet_is_judged_by_the_others_wait(others, named):
    """test_e2e_blind at -n 4 (load 7): host B's agent, back from a 12 s SIGSTOP, had no run-queue
    reading of its ranks for 5 s (slot_states.RUNQ_MIN_SPAN_S) while the 80 steps it missed arrived at
    once, rank 2 computing 1.18x its peers over them (37 ms against 32). Where the others wait for a CPU
    as long as the host makes them (``HOST_BUSY``), compute cannot tell, measured rank or not; on a
    quiet host the same steps name it, as before."""
    oncpu, runq = others
    states = [
        t.rank(
            r,
            world_size=4,
            recent_steps=_compute(r, 2, 1.18, 0.032, 0.052),
            oncpu_share=0.0 if r >= 2 else oncpu,  # host B (ranks 2-3): its agent's window restarted
            runq_share=0.0 if r >= 2 else runq,
        )
        for r in range(4)
    ]
    found, _ = _detect(states, ranks_per_host=2)
    assert [f.ranks for f in found] == named


@pytest.mark.parametrize(
    "what,world,slow,factor,compute_s,step_s,sched,findings,advice", CASES, ids=[c[0] for c in CASES]
)
def test_who_is_named_and_how(what, world, slow, factor, compute_s, step_s, sched, findings, advice):
    states = []
    for r in range(world):
        oncpu, runq = (sched if r == slow else (0.9, 0.02)) if sched is not None else (0.0, 0.0)
        steps = _compute(r, slow, factor, compute_s, step_s)
        states.append(t.rank(r, world_size=world, recent_steps=steps, oncpu_share=oncpu, runq_share=runq))
    found, advised = _detect(states)
    assert [f.ranks for f in found] == findings, what
    assert [f.ranks for f in advised] == advice, what
    assert all(f.kind == "straggler" for f in found) and all(f.kind == "extra_work" for f in advised)


def test_the_reasons_say_the_cause_and_the_cost():
    def states(r0_sched):
        return [
            t.rank(
                r,
                world_size=2,
                recent_steps=_compute(r, 0, 1.6, 0.023, 0.136),
                oncpu_share=r0_sched[0] if r == 0 else 0.5,
                runq_share=r0_sched[1] if r == 0 else 0.1,
            )
            for r in range(2)
        ]

    found, (advice,) = _detect(states((0.5, 0.12)))
    assert found == [] and "extra_work" in ADVISORY_KINDS
    assert "1.60x the median of the other ranks" in advice.reason and "work it does alone" in advice.reason
    assert "so it is not its host" in advice.reason and advice.evidence["cost_share"] == pytest.approx(0.1, abs=0.01)

    (finding,), advised = _detect(states((0.3, 0.6)))
    assert advised == [] and "its host takes its CPU" in finding.reason
    assert finding.evidence["runq_contention"] == pytest.approx(0.6 / 0.9, abs=1e-3)

    starved = [
        t.rank(0, world_size=2, oncpu_share=0.9, runq_share=0.02),
        t.rank(1, world_size=2, oncpu_share=0.45, runq_share=0.5),
    ]
    (f,), _ = _detect(starved)
    assert f.ranks == (1,) and "waits for a CPU 53% of the time it is runnable (0.50 s a second)" in f.reason
    assert "up to 29 s a minute" in f.reason


def test_extra_work_alone_names_nobody():
    states = [t.rank(r, world_size=2, recent_steps=_compute(r, 0, 1.6, 0.023, 0.136)) for r in range(2)]
    assert ExtraWork(CFG).check(100.0, t.view(states, now=100.0)) == []


@pytest.mark.parametrize(
    "contention,advice",
    [
        # healthy ddp_tutorial at load 12-14 on 2 cores: rank 0 3.9x its peer, 1.25 ms more a
        # step, while both waited for a CPU 81% of the time they were runnable (floor 5.3 ms)
        ((0.2, 0.86), []),
        ((0.9, 0.02), [(0,)]),  # the same 1.25 ms a step on a quiet host is rank 0's own
    ],
)
def test_a_difference_within_the_scheduler_noise_is_not_reported(contention, advice):
    oncpu, runq = contention
    states = [
        t.rank(r, world_size=2, recent_steps=_compute(r, 0, 3.9, 0.00043, 0.0038), oncpu_share=oncpu, runq_share=runq)
        for r in range(2)
    ]
    found, advised = _detect(states)
    assert found == [] and [f.ranks for f in advised] == advice


@pytest.mark.parametrize(
    "baseline_ratio,floor_s", [(None, 0.001), (0.0, 0.001), (0.5, 0.002), (0.81, 0.001 / 0.19), (0.99, 0.02)]
)
def test_the_noise_floor_is_a_millisecond_of_work_in_the_host_wall_time(baseline_ratio, floor_s):
    cont = (
        None
        if baseline_ratio is None
        else slowcause.Contention(1, 0.5, 0.5, 0.5, baseline_ratio, runnable_s=1.0, baseline_runnable_s=1.0)
    )
    assert slowcause.noise_floor_s(cont) == pytest.approx(floor_s)


@pytest.mark.parametrize("rank,kind", [(0, "extra_work"), (5, "straggler")])
def test_stalls_now_and_then_on_rank_0_alone_are_advice(rank, kind):
    """A rank whose compute stalls 1 s every 25 steps while the others wait: on rank 0
    (a log flush, a metrics upload) it is advice; on another rank, a finding."""
    from watchdog.coordinator.performance import goodput
    from watchdog.coordinator.testing import SimJob

    sim = SimJob(jitter=0.1, seed=7, compute_s=0.1)
    sim.stall(rank, every=25, extra_s=1.0, from_step=40)
    ledger, straggler, extra = goodput.Ledger(), Straggler(CFG), ExtraWork(CFG)
    straggler.stalls, extra.straggler = ledger.stalls, straggler
    now, found = 0.0, []
    while now < 60.0:
        now += 0.5
        view = sim.run_until(now)
        found += straggler.check(now, view) + extra.check(now, view)
        ledger.tick(now, view)
    assert found and {(f.kind, f.ranks) for f in found} == {(kind, (rank,))}
    assert "every 25 steps" in found[0].reason
    assert ("stalls alone" in found[0].reason) == (kind == "extra_work")


# (what, world, slow rank, factor, each rank's (on-CPU, wait) s/s, findings)
LOADED = [
    # a CPU hog on rank 1's core, the host's other load on rank 0's (2 cores at load 7-10):
    # rank 2 of 4 computes 1.2x while every rank waits for a CPU more than it runs: nobody
    ("the host's load decides who is slower", 4, 2, 1.2, [(0.25, 0.45), (0.2, 0.5), (0.25, 0.5), (0.3, 0.4)], []),
    # the same slowness where the others run freely: named
    ("a slow rank on a quiet host", 4, 2, 1.2, [(0.9, 0.02), (0.9, 0.05), (0.9, 0.02), (0.9, 0.03)], [(2,)]),
    # starved beyond the others, who wait a third of the time: named, by its contention
    ("starved beyond the others", 4, 2, 1.2, [(0.5, 0.25), (0.5, 0.25), (0.05, 0.9), (0.5, 0.2)], [(2,)]),
    # starved beyond others who themselves wait more than they run (three hogs on rank 1's
    # core at load 25-30 put the host's load on rank 0's: 0.86 against 0.61): nobody
    ("starved on a busy host", 4, 2, 1.2, [(0.3, 0.45), (0.3, 0.5), (0.07, 0.5), (0.3, 0.5)], []),
    # 2 ranks, the hog on rank 0's core and the host's load on rank 1's: rank 1 computes slower
    ("the innocent rank 1 of 2", 2, 1, 1.2, [(0.25, 0.55), (0.3, 0.5)], []),
]


@pytest.mark.parametrize("what,world,slow,factor,sched,findings", LOADED, ids=[c[0] for c in LOADED])
def test_on_a_host_that_makes_every_rank_wait_compute_names_nobody(what, world, slow, factor, sched, findings):
    states = [
        t.rank(
            r,
            world_size=world,
            recent_steps=_compute(r, slow, factor, 0.02, 0.05),
            oncpu_share=sched[r][0],
            runq_share=sched[r][1],
        )
        for r in range(world)
    ]
    found, _ = _detect(states)
    assert [f.ranks for f in found] == findings, what


@pytest.mark.parametrize(
    "ratio,baseline_ratio,tell",
    [(0.7, 0.5, False), (0.7, 0.44, False), (0.7, 0.39, True), (0.9, 0.6, False), (0.2, 0.8, False), (0.5, 0.3, True)],
)
def test_compute_cannot_tell_where_the_others_wait_as_long_as_they_run(ratio, baseline_ratio, tell):
    # (its wait: ratio s/s; every rank runnable all the time, as compute-bound ranks are)
    c = slowcause.Contention(
        1, ratio, ratio, baseline_ratio * 0.5, baseline_ratio, runnable_s=1.0, baseline_runnable_s=1.0
    )
    assert slowcause.cannot_tell(c) is not tell
    assert slowcause.cannot_tell(None) is False


# (what, the slow rank's factor, compute s, step s, each rank's (on-CPU, wait) s/s, the slow rank's
#  process CPU in percent, findings). The integration tier at -n 4 (load ~9, 2 cores).
BARELY_WAITS = [
    # test_e2e_callbacks' Lightning checkpoint_restart: rank 1 sleeps 5x its peer's 20 ms; the
    # others' contention read 0.45-0.70 for the test's whole wait (a fresh-clone run named nobody)
    ("a 5x sleep on a busy host", 4.68, 0.021, 0.119, [(0.0353, 0.0293), (0.033, 0.049)], 7.0, [(1,)]),
    # test_slow_rank_checkpoint_restart's 1.3x sleep: 0.09 s a second against 20% of the job's time
    ("a 1.3x sleep on a busy host", 1.29, 0.034, 0.051, [(0.0561, 0.0622), (0.0752, 0.0926)], 7.0, [(1,)]),
    # the same rank read while the job started (its window held its imports): it waits more than
    # its slowness costs, which the host's load could have done; named once that reading passes
    ("a 1.3x sleep read at its start", 1.29, 0.034, 0.051, [(0.1173, 0.2564), (0.1422, 0.2833)], 7.0, []),
    # a healthy HF Trainer run at -n 3 (load ~6): rank 1 computing 1.40x its CPU-bound peer at
    # contention 0.50 against 0.44 (trl's ranks wait 0.16-0.56 s a second on that host)
    ("a CPU-bound rank the host's load slowed", 1.40, 0.06, 0.136, [(0.28, 0.22), (0.25, 0.25)], 25.0, []),
    # the 5x sleep's readings, where other threads do most of its process's CPU work: their wait
    # for a CPU is not read, and the host's load cannot be ruled out
    ("other threads' wait unread", 4.68, 0.021, 0.119, [(0.0353, 0.0293), (0.033, 0.049)], 120.0, []),
]


@pytest.mark.parametrize(
    "what,factor,compute_s,step_s,sched,cpu,findings", BARELY_WAITS, ids=[c[0] for c in BARELY_WAITS]
)
def test_on_a_busy_host_a_slow_rank_that_barely_waits_for_a_cpu_is_named(
    what, factor, compute_s, step_s, sched, cpu, findings
):
    """Where the host's load makes a rank compute slower, the time it loses is time it waits
    for a CPU: a slow rank waiting far less than its slowness costs is slow by itself."""
    states = [
        t.rank(
            r,
            world_size=2,
            recent_steps=_compute(r, 1, factor, compute_s, step_s),
            oncpu_share=sched[r][0],
            runq_share=sched[r][1],
            cpu_percent=cpu if r == 1 else 10.0,
        )
        for r in range(2)
    ]
    peer = slowcause.contention(t.view(states, now=100.0)).get(0)
    assert peer is not None and peer.ratio >= slowcause.HOST_BUSY, what
    found, _ = _detect(states)
    assert [f.ranks for f in found] == findings, what
