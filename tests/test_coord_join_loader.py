"""never_joined and loader_starvation."""

from __future__ import annotations

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.collective_hang import CollectiveHang
from watchdog.coordinator.detectors.loader_starvation import LoaderStarvation
from watchdog.coordinator.detectors.never_joined import NeverJoined
from watchdog.coordinator.testing import SimJob

CFG = DetectorConfig()


def joining(r, pg="initializing"):
    return t.rank(r, step=0, pg_state=pg, phase="init")


JOIN_CASES = [
    ("all joined", t.healthy(), 8, []),
    ("rank never registered", [t.rank(r) for r in range(8) if r != 5], 8, [(5,)]),
    (
        "rank never called init: not the ones waiting in rendezvous",
        [joining(r, "none" if r == 2 else "initializing") for r in range(4)],
        4,
        [(2,)],
    ),
    (
        "missing and un-called together",
        [joining(r, "none" if r == 1 else "initializing") for r in range(3)],
        4,
        [(1, 3)],
    ),
    ("everyone registered, all stuck in rendezvous", [joining(r) for r in range(4)], 4, [(0, 1, 2, 3)]),
    (
        "a rank that died before joining is dead_rank's",
        [joining(r, "none") if r != 1 else joining(1, "none") for r in range(2)]
        + [t.rank(2, alive=False, pg_state="none")],
        3,
        [(0, 1)],
    ),
]


@pytest.mark.parametrize("name,states,world,want", JOIN_CASES, ids=[c[0] for c in JOIN_CASES])
def test_never_joined_table(name, states, world, want):
    first = t.view(states, now=100.0, world_size=world)
    assert NeverJoined(CFG).check(159.0, t.view(states, now=159.0, base=first, seq=2)) == []  # before the deadline
    v = t.view(states, now=161.0, base=first, seq=2)
    assert [f.ranks for f in NeverJoined(CFG).check(161.0, v)] == want


def test_a_stall_in_rendezvous_is_never_joined_s_not_a_hang_naming_everyone():
    """A restart where rank 2 never calls init_process_group: ranks 0, 1, 3 wait in
    rendezvous for it. Past the hang's deadline too, collective_hang names nobody (it
    named all four, the three waiting included); never_joined names rank 2."""

    def states(now):  # started at 95 s: at step 0 the step age is the time since the slot was made
        return [
            t.rank(r, step=0, pg_state="none" if r == 2 else "initializing", phase="init", step_age_s=now - 95.0)
            for r in range(4)
        ]

    first = t.view(states(100.0), now=100.0, world_size=4)
    for now in (170.0, 400.0):
        v = t.view(states(now), now=now, base=first, seq=2)
        assert CollectiveHang(CFG).check(now, v) == []
        assert [f.ranks for f in NeverJoined(CFG).check(now, v)] == [(2,)]


def test_a_single_process_that_stalls_before_any_process_group_is_still_a_hang():
    states = [t.rank(0, world_size=1, step=0, pg_state="none", phase="init", step_age_s=200.0)]
    v = t.view(states, now=300.0, base=t.view(states, now=100.0, world_size=1), seq=2)
    assert [f.ranks for f in CollectiveHang(CFG).check(300.0, v)] == [(0,)]


def test_never_joined_reason_names_host():
    states = [joining(r, "none" if r == 2 else "initializing") for r in range(4)]
    v = t.view(states, now=161.0, base=t.view(states, now=100.0, world_size=4), seq=2)
    (f,) = NeverJoined(CFG).check(161.0, v)
    assert f.hosts == ("host0",)
    assert f.reason.startswith(
        "rank 2 on host host0 has not called init_process_group 61.0 s after the first rank registered"
    )
    assert "ranks 0-1,3 waiting in rendezvous" in f.reason


def test_late_registering_uncalled_rank_is_not_shadowed_by_the_waiters():
    # Seen on a real run: rank 3 (never calls init) registered 0.25 s after the
    # others; for that moment only the waiters were past their deadline. They
    # must not be named: the rank yet to call init is the likelier culprit.
    early = [joining(r) for r in range(3)]
    v = t.view(early, now=100.0, world_size=4, ranks_per_host=1)
    v = t.view([joining(3, "none")], now=100.5, base=v, seq=2, ranks_per_host=1)
    v = t.view(early + [joining(3, "none")], now=160.1, base=v, seq=3, ranks_per_host=1)  # agents keep reporting
    assert NeverJoined(CFG).check(160.2, v) == []
    assert [f.ranks for f in NeverJoined(CFG).check(160.6, v)] == [(3,)]


def test_restarted_rank_gets_a_fresh_join_deadline():
    v = t.view(t.healthy(world_size=4), now=100.0)
    v = t.view(
        [t.rank(1, world_size=4, pid=99, proc_start_us=1_800_000_000_000_000, step=0, pg_state="initializing")],
        now=200.0,
        base=v,
        seq=2,
    )
    assert NeverJoined(CFG).check(230.0, v) == []


def starving(r, data_s, n=40, step_s=0.2):
    return t.rank(r, recent_steps=t.steps(1, n, step_s=step_s, data_s=data_s, coll_s=0.0))


LOADER_CASES = [
    ("healthy", [starving(r, 0.01) for r in range(8)], []),
    ("one rank", [starving(r, 0.1 if r == 5 else 0.0) for r in range(8)], [((5,), "ranks")]),
    ("all ranks", [starving(r, 0.08) for r in range(8)], [(tuple(range(8)), "all")]),
    ("too few steps yet", [starving(r, 0.1, n=12) for r in range(8)], []),
    # A CI run's healthy HF Trainer job (2 loader workers a rank, the host's CPUs
    # shared with other tests): rank 1 waited 20% of its 46 ms steps, rank 0 13%.
    (
        "a rank waiting a little more than the others is not one starving loader",
        [starving(0, 0.0062, n=24, step_s=0.046), starving(1, 0.0094, n=24, step_s=0.046)],
        [],
    ),
    (
        "a rank waiting twice what the others wait is",
        [starving(0, 0.006, n=24, step_s=0.046), starving(1, 0.014, n=24, step_s=0.046)],
        [((1,), "ranks")],
    ),
    (
        "one slow first batch of an epoch is not starvation",
        [
            t.rank(
                r,
                recent_steps=t.steps(1, 30, step_s=0.2, coll_s=0.0)
                + t.steps(31, 1, step_s=10.0, data_s=9.8, coll_s=0.0)
                + t.steps(32, 10, step_s=0.2, coll_s=0.0),
            )
            for r in range(8)
        ],
        [],
    ),
]


@pytest.mark.parametrize("name,states,want", LOADER_CASES, ids=[c[0] for c in LOADER_CASES])
def test_loader_starvation_table(name, states, want):
    found = LoaderStarvation(CFG).check(100.0, t.view(states, now=100.0))
    assert [(f.ranks, f.evidence["scope"]) for f in found] == want


def test_one_rank_reason_points_at_its_host():
    (f,) = LoaderStarvation(CFG).check(
        100.0, t.view([starving(r, 0.1 if r == 5 else 0.0) for r in range(8)], now=100.0)
    )
    assert f.reason.startswith("rank 5 on host host1 waits on data 50% of step time")
    (g,) = LoaderStarvation(CFG).check(100.0, t.view([starving(r, 0.08) for r in range(8)], now=100.0))
    assert "more training workers will not help" in g.reason


def test_sim_starved_rank():
    sim = SimJob(jitter=0.1)
    sim.starve(2, 0.06)
    found = LoaderStarvation(CFG).check(20.0, sim.run_until(20.0))
    assert [f.ranks for f in found] == [(2,)]


def test_progress_means_joined_even_without_pg_state():
    """A hook that could not patch init_process_group leaves pg_state "none"."""
    states = [t.rank(r, world_size=4, pg_state="none") for r in range(4)]
    v = t.view(states, now=161.0, base=t.view(states, now=100.0, world_size=4), seq=2)
    assert NeverJoined(CFG).check(161.0, v) == []


def test_single_process_job_needs_no_process_group():
    states = [t.rank(0, world_size=1, step=0, pg_state="none", collective=t.coll())]
    v = t.view(states, now=161.0, base=t.view(states, now=100.0), seq=2)
    assert NeverJoined(CFG).check(161.0, v) == []
