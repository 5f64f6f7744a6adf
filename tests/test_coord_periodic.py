"""Periodic stalls (coordinator/periodic.py, and its use by stalls.py and the
periodic_stall detector): pure, table-driven, time as numbers."""

from __future__ import annotations

import pytest

from watchdog.coordinator import stalls as stalls_mod
from watchdog.coordinator.finding import ADVISORY_KINDS
from watchdog.coordinator.periodic import Occurrence, patterns, regular
from watchdog.coordinator.stalls import Stalls


def occ(rank, steps, cost=6.0, where="eval"):
    return [Occurrence(rank, s, cost, where) for s in steps]


@pytest.mark.parametrize(
    ("steps", "period"),
    [
        ([1000, 2000, 3000], 1000),
        ([8, 16, 25, 32], 8),  # one step late: still every 8
        ([100, 210, 300], 100),  # 10% of the period
        ([100, 250, 300], None),  # not regular
        ([5], None),
        ([5, 5 + 0], None),
    ],
)
def test_regular_intervals(steps, period):
    assert regular(sorted(set(steps))) == period


@pytest.mark.parametrize(
    ("occurrences", "want"),
    [
        # the nanoGPT case: rank 0 evaluates every 1,000 steps for ~6 s
        (occ(0, [1000, 2000, 3000]), [(0, 1000, 6.0, "eval", 3)]),
        (occ(0, [1000, 2000]), []),  # twice is not yet a pattern
        (occ(0, [1000, 2000, 3000, 4000], where="checkpoint"), [(0, 1000, 6.0, "checkpoint", 4)]),
        # different places on one rank are different patterns; only the regular one is said
        (occ(0, [8, 16, 24]) + occ(0, [5, 19, 21], where="x"), [(0, 8, 6.0, "eval", 3)]),
        # the same schedule on another rank: its own advisory
        (occ(0, [10, 20, 30]) + occ(3, [15, 35, 55]), [(0, 10, 6.0, "eval", 3), (3, 20, 6.0, "eval", 3)]),
        # a schedule change: nothing until the old schedule has left the window
        (occ(0, [10, 20, 30, 80, 130, 180]), []),
        # one off-schedule stall among them: not only a schedule
        (occ(0, [100, 200, 250, 300, 400]), []),
        # every other step is a slow rank, not a schedule
        (occ(0, [2, 4, 6, 8, 10]), []),
        # random stalls on a rank (a noisy neighbour): no pattern
        (occ(1, [3, 17, 22, 41, 90]), []),
        # a tiny checkpoint every 5 steps that costs the job nothing: not worth saying
        (occ(0, [10, 15, 20, 25], cost=0.02, where="checkpoint"), []),
        (occ(0, [10, 15, 20, 25], cost=0.1, where="checkpoint"), [(0, 5, 0.1, "checkpoint", 4)]),
    ],
)
def test_patterns(occurrences, want):
    got = [(p.rank, p.period, p.cost_s, p.where, p.occurrences) for p in patterns(occurrences)]
    assert got == want


def test_the_advisory_names_rank_period_cost_and_where():
    (p,) = patterns(occ(0, [1000, 2000, 3000], cost=6.2, where="a checkpoint or eval phase"))
    assert p.describe().startswith("rank 0 holds the job ~6.2 s every 1,000 steps in a checkpoint or eval phase")
    assert "periodic_stall" in ADVISORY_KINDS  # never paged, never acted on


def test_pauses_of_a_minority_make_a_pattern():
    st = Stalls()
    for s in (1000, 2000, 3000):
        st.pause(s, 6.0, [0])
    (p,) = stalls_mod.periodic(st)
    assert (p.rank, p.period, p.where) == (0, 1000, stalls_mod.PAUSE_WHERE)
    st.clear()
    assert stalls_mod.periodic(st) == []


def test_the_ledger_notes_the_steps_a_rank_spent_alone_in_a_phase():
    from array import array

    from watchdog.coordinator.goodput import Ledger
    from watchdog.coordinator.stepcolumns import StepColumns

    def step(pause0: float, pause1: float, step_s: float) -> StepColumns:
        cols = StepColumns()
        d = array("d", [step_s, step_s])
        cols.extend([0, 1], d, array("d", [0.0, 0.0]), d, array("d", [pause0, pause1]))
        return cols

    ledger = Ledger()
    ledger._split([(k, step(0.0, 0.0, 0.1)) for k in range(1, 100)])
    # rank 0 alone in an eval phase at 100, 200, 300; both ranks at 400 (they evaluate together)
    for k in (100, 200, 300):
        ledger._split([(k, step(1.0, 0.0, 6.1)), *((j, step(0.0, 0.0, 0.1)) for j in range(k + 1, k + 100))])
    ledger._split([(400, step(1.0, 1.0, 6.1))])
    assert [(o.rank, o.step) for o in ledger.stalls.pauses] == [(0, 100), (0, 200), (0, 300)]
    (p,) = stalls_mod.periodic(ledger.stalls)
    assert (p.rank, p.period, round(p.cost_s, 1)) == (0, 100, 6.0)
