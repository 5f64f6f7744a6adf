"""Periodic stalls (coordinator/analysis/periodic.py, and its use by analysis/intermittent_stalls.py and the
periodic_stall detector): pure, table-driven, time as numbers."""

from __future__ import annotations

import pytest

from watchdog.contracts.finding import ADVISORY_KINDS
from watchdog.coordinator.analysis import intermittent_stalls as stalls_mod
from watchdog.coordinator.analysis.intermittent_stalls import Stalls
from watchdog.coordinator.analysis.periodic import Occurrence, frame_key, patterns, regular
from watchdog.coordinator.config import Config
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.testing import SimJob


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

    from watchdog.coordinator.performance.goodput import Ledger
    from watchdog.coordinator.view.stepcolumns import StepColumns

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


# -- unmarked stalls in a frame (hook/frames.py) ---------------------------------------

UPLOAD = "upload_metrics (train.py:21)"


@pytest.mark.parametrize(
    ("frame", "key"),
    [
        ("estimate_loss (train.py:41)", "estimate_loss (train.py)"),
        ("estimate_loss (train.py:44)", "estimate_loss (train.py)"),  # one function, another line: one place
        ("<module> (run.py:3)", "<module> (run.py)"),
        ("eval", "eval"),  # a phase: as it is
        ("odd (x.py:abc)", "odd (x.py:abc)"),
    ],
)
def test_a_frame_is_grouped_without_its_line(frame, key):
    assert frame_key(frame) == key


def stalls_with(occurrences: list[tuple[int, int, float, str]]) -> Stalls:
    """Stalls whose ledger saw each (rank, step, cost, frame) as an unmarked stall in that frame."""
    st = Stalls()
    for rank, step, cost, frame in occurrences:
        st.saw_frame(rank, step, frame)
        st.add(stalls_mod.SplitStep(step, cost + 0.1, rank, cost, 0.0, 2), cost)
    return st


def test_unmarked_stalls_in_one_frame_make_a_pattern_that_names_it():
    st = stalls_with([(0, s, 3.5, f"upload_metrics (train.py:{21 + s % 2})") for s in (20, 40, 60)])
    (p,) = stalls_mod.periodic(st)
    assert (p.rank, p.period, p.where, p.occurrences) == (0, 20, "upload_metrics (train.py)", 3)
    assert p.describe().startswith("rank 0 holds the job ~3.5 s every 20 steps in upload_metrics (train.py:2")
    assert stalls_mod.expected_steps(st) == {(0, 20), (0, 40), (0, 60)}  # no straggler's evidence


@pytest.mark.parametrize(
    ("seen", "rank", "frame", "want"),
    [
        ([], 0, UPLOAD, None),  # nothing seen: the first occurrence is not expected
        ([(0, 20, 4.0, UPLOAD)], 0, UPLOAD, 1.25 * 4.0 + 2.0),  # one occurrence is enough
        ([(0, 20, 4.0, UPLOAD), (0, 40, 6.0, "upload_metrics (train.py:22)")], 0, UPLOAD, 1.25 * 6.0 + 2.0),
        ([(0, 20, 4.0, UPLOAD)], 1, UPLOAD, None),  # another rank
        ([(0, 20, 4.0, UPLOAD)], 0, "spin (train.py:50)", None),  # elsewhere
        # one big function (a script's main): only near the lines its stalls were sampled at
        ([(0, 20, 4.0, "main (train.py:150)")], 0, "main (train.py:152)", 1.25 * 4.0 + 2.0),
        ([(0, 20, 4.0, "main (train.py:150)")], 0, "main (train.py:200)", None),  # a hang elsewhere in main
        ([(0, 20, 4.0, "main (train.py:150)")], 0, "main (train.py:147)", None),
        # a loop's body: the lines sampled over its stalls, and a little around them
        (
            [(0, 20, 6.0, "estimate_loss (train.py:222)"), (0, 40, 6.0, "estimate_loss (train.py:225)")],
            0,
            "estimate_loss (train.py:224)",
            1.25 * 6.0 + 2.0,
        ),
        ([(0, 20, 6.0, "estimate_loss (train.py:222)")], 0, "estimate_loss (train.py:224)", 1.25 * 6.0 + 2.0),
        ([(0, 20, 6.0, "estimate_loss (train.py:222)")], 0, "estimate_loss (train.py:230)", None),
        ([(0, 20, 4.0, UPLOAD)], 0, "upload_metrics (train.py)", 1.25 * 4.0 + 2.0),  # no line: by function
    ],
)
def test_a_stall_is_expected_only_where_the_rank_stalled_before(seen, rank, frame, want):
    assert stalls_mod.expected_s(stalls_with(seen), rank, frame) == want


def test_every_frame_sampled_in_a_stall_is_its_place():
    """The frames a step's hook sampled (not only the newest): the function most of them
    were in, with the lines seen there; a loop's lines gather over the occurrences."""
    st = Stalls()
    for frame in ("estimate_loss (train.py:222)", "get_batch (train.py:118)", "estimate_loss (train.py:225)"):
        st.saw_frame(0, 100, frame)
    st.saw_frame(0, 100, "estimate_loss (train.py:222)")  # again: kept once, now the newest
    st.add(stalls_mod.SplitStep(100, 6.1, 0, 6.0, 0.0, 2), 6.0)
    (o,) = st.framed
    assert (o.where, o.frame, o.lines) == ("estimate_loss (train.py)", "estimate_loss (train.py:222)", (222, 225))
    assert stalls_mod.expected_s(st, 0, "estimate_loss (train.py:227)") == 1.25 * 6.0 + 2.0
    assert stalls_mod.expected_s(st, 0, "estimate_loss (train.py:228)") is None
    for k in range(stalls_mod.FRAMES_PER_STEP + 5):
        st.saw_frame(0, 200, f"main (train.py:{k})")
    assert len(st.frames[(0, 200)]) == stalls_mod.FRAMES_PER_STEP


# -- heartbeat freezes that end by themselves (a call holding the GIL) --------------------

# (age_s its agent read, seconds since the heartbeat last beat at t=0 ... ) -> the occurrences noted
FREEZES = [
    # stale 1.5 s then 3 s, then beating again 0.2 s after its next beat at 3.2 s: one freeze of 3.2 s
    ("ended by itself", [(1.0, 0.0, 1.5, False), (2.5, 0.0, 3.0, False), (3.6, 3.2, 0.4, False)], [(0, 101, 3.2)]),
    # stopped at some reading (SIGSTOP, then SIGCONT): no occurrence, always frozen_rank's
    ("stopped meanwhile", [(1.0, 0.0, 1.5, False), (2.5, 0.0, 3.0, True), (3.6, 3.2, 0.4, False)], []),
    # never stale past FREEZE_MIN_S: nothing
    ("a slow beat", [(1.0, 0.0, 0.9, False), (1.5, 1.4, 0.1, False)], []),
    # still frozen: open, no occurrence yet
    ("still frozen", [(1.0, 0.0, 1.5, False), (9.0, 0.0, 9.0, False)], []),
]


@pytest.mark.parametrize("name,readings,want", FREEZES, ids=[c[0] for c in FREEZES])
def test_a_freeze_that_ends_by_itself_is_an_occurrence(name, readings, want):
    st = Stalls()
    for at, beat, age, stopped in readings:
        st.beat(0, 101, beat, age, stopped)
        assert at >= beat  # (readings in time order)
    assert [(o.rank, o.step, round(o.cost_s, 3)) for o in st.froze] == want


def test_a_freeze_is_expected_as_long_as_the_longest_before_and_says_its_pattern():
    st = Stalls()
    assert stalls_mod.expected_freeze_s(st, 0) is None
    for k, (start, length) in enumerate([(10.0, 3.0), (40.0, 4.0), (70.0, 3.5)]):
        st.beat(0, 20 * (k + 1), start, 1.5, False)
        st.beat(0, 20 * (k + 1), start + length, 0.1, False)
    st.saw_frame(0, 60, "upload_metrics (train.py:19)")  # sampled once the GIL came back
    assert stalls_mod.expected_freeze_s(st, 0) == 1.25 * 4.0 + 2.0
    assert stalls_mod.expected_freeze_s(st, 1) is None  # another rank
    (p,) = stalls_mod.periodic(st)
    assert (p.rank, p.period, p.cost_s, p.frame) == (0, 20, 3.5, "upload_metrics (train.py:19)")
    assert p.describe().startswith(
        "rank 0 holds the job ~3.5 s every 20 steps with its heartbeat frozen (a call that holds the GIL), "
        "in the step it spent in upload_metrics (train.py:19)"
    )
    assert stalls_mod.expected_steps(st) == {(0, 20), (0, 40), (0, 60)}
    st.lost(0)
    st.clear()
    assert not st.froze and stalls_mod.expected_freeze_s(st, 0) is None


def test_a_step_whose_frame_was_not_seen_is_no_occurrence_and_a_restart_forgets():
    st = Stalls()
    st.saw_frame(0, 19, UPLOAD)  # the step before: not this one
    st.add(stalls_mod.SplitStep(20, 4.0, 0, 3.9, 0.0, 2), 3.9)
    st.saw_frame(0, 40, UPLOAD)
    st.add(stalls_mod.SplitStep(40, 0.12, 0, 0.01, 0.0, 2), 0.01)  # a normal step: no stall
    assert not st.framed
    st.saw_frame(0, 60, UPLOAD)
    st.add(stalls_mod.SplitStep(60, 4.0, 0, 3.9, 0.0, 2), 3.9)
    assert [(o.rank, o.step, o.where) for o in st.framed] == [(0, 60, "upload_metrics (train.py)")]
    st.saw_frame(0, 80, "main (train.py:9)")
    st.add(stalls_mod.SplitStep(80, 4.0, 0, 3.9, 3.5, 2), 3.9)  # mostly its loader: loader_starvation's, not a frame's
    assert [o.step for o in st.framed] == [60]
    st.clear()
    assert not st.framed and not st.frames
    for k in range(stalls_mod.FRAMES_KEPT + 10):
        st.saw_frame(0, k, UPLOAD)
    assert len(st.frames) == stalls_mod.FRAMES_KEPT and (0, 0) not in st.frames


# The coordinator end to end, time moved by numbers: 2 ranks, rank 0 stalls alone every 20
# steps in one frame of the script (a metrics upload) while rank 1 waits in the all-reduce.
FRAMED = [
    # under the hang deadline: the advisory alone, no straggler or extra_work either
    ("4 s stalls", 4.0, None, [("periodic_stall", (0,))]),
    # over it: the first may be named (nothing known yet), the recurrences are expected
    ("8 s stalls", 8.0, None, [("collective_hang", (0,)), ("periodic_stall", (0,))]),
    # a spin elsewhere afterwards is named as soon as the first stall was (~5 s)
    (
        "then a spin",
        8.0,
        (90, "spin (train.py:50)"),
        [("collective_hang", (0,)), ("periodic_stall", (0,)), ("collective_hang", (0,))],
    ),
    # a stall in the same frame that never ends: named past what that frame took before
    (
        "then a hang there",
        8.0,
        (100, UPLOAD),
        [("collective_hang", (0,)), ("periodic_stall", (0,)), ("collective_hang", (0,))],
    ),
]


@pytest.mark.parametrize("name,extra_s,hang,want", FRAMED, ids=[c[0] for c in FRAMED])
def test_a_stall_that_recurs_in_one_frame_is_said_once_and_never_paged_again(tmp_path, name, extra_s, hang, want):
    path = str(tmp_path / "journal.jsonl")
    c = Coordinator(Config(journal=path, job="job", world_size=2, tick_s=0.5), Journal(path, lambda: (1.7e9, 0.0)))
    sim = SimJob(world_size=2, ranks_per_host=2, jitter=0.1, seed=11, compute_s=0.1)
    sim.stall(0, every=20, extra_s=extra_s, from_step=20, frame=UPLOAD)
    if hang is not None:
        sim.hang(0, hang[0], frame=hang[1])
    sim.run_until(80.0, coordinator=c, tick_s=0.5)
    got = [r for r in journal.read(path) if r["event"] == je.FINDING]
    c.journal.close()
    assert [(r["kind"], tuple(r["ranks"])) for r in got] == want
    (advisory,) = [r for r in got if r["kind"] == "periodic_stall"]
    assert f"every 20 steps in {UPLOAD}" in advisory["reason"]
    assert advisory["evidence"]["frame"] == UPLOAD and advisory["evidence"]["period_steps"] == 20
    if hang is not None:
        onset = sim.steps[hang[0]].start + sim.steps[hang[0]].data[0] + 0.1  # about when it stopped
        latency = got[-1]["detected_mono"] - onset
        limit = 6.5 if hang[1] != UPLOAD else stalls_mod.EXPECTED_FACTOR * 8.0 + stalls_mod.EXPECTED_MARGIN_S + 1.0
        assert latency <= limit, (latency, got[-1]["reason"])
        assert f"rank 0 last seen in training code, in {hang[1]}," in got[-1]["reason"]  # where it hangs
        assert got[-1]["evidence"]["culprits"]["0"]["frame"] == hang[1]


# The coordinator end to end, time moved by numbers: rank 0 holds the GIL alone every 20 steps
# (its heartbeat frozen meanwhile) while rank 1 waits in the all-reduce.
FROZEN = [
    # under frozen_rank's 3 s: the advisory alone
    ("2 s freezes", 2.0, None, [("periodic_stall", (0,))]),
    # over it: the first is named (nothing known yet), the recurrences are expected
    ("4 s freezes", 4.0, None, [("frozen_rank", (0,)), ("periodic_stall", (0,))]),
    # a freeze that never ends: named past 1.25x the longest before + 2 s (and the
    # hang it makes, by collective_hang, which names a frozen culprit too)
    (
        "then one never ends",
        4.0,
        ("freeze", 90),
        [("frozen_rank", (0,)), ("periodic_stall", (0,)), *[("frozen_rank", (0,)), ("collective_hang", (0,))]],
    ),
    # a SIGSTOP: named at once, whatever froze before
    (
        "then a SIGSTOP",
        4.0,
        ("stop", 90),
        [("frozen_rank", (0,)), ("periodic_stall", (0,)), *[("frozen_rank", (0,)), ("collective_hang", (0,))]],
    ),
]


@pytest.mark.parametrize("name,extra_s,fault,want", FROZEN, ids=[c[0] for c in FROZEN])
def test_a_freeze_that_recurs_is_said_once_and_never_paged_again(tmp_path, name, extra_s, fault, want):
    path = str(tmp_path / "journal.jsonl")
    c = Coordinator(Config(journal=path, job="job", world_size=2, tick_s=0.5), Journal(path, lambda: (1.7e9, 0.0)))
    sim = SimJob(world_size=2, ranks_per_host=2, jitter=0.1, seed=11, compute_s=0.1)
    sim.stall(0, every=20, extra_s=extra_s, from_step=20, gil=True)
    if fault is not None:
        getattr(sim, fault[0])(0, fault[1])
    sim.run_until(80.0, coordinator=c, tick_s=0.5)
    got = [r for r in journal.read(path) if r["event"] == je.FINDING]
    c.journal.close()
    assert [(r["kind"], tuple(r["ranks"])) for r in got] == want
    (advisory,) = [r for r in got if r["kind"] == "periodic_stall"]
    assert "every 20 steps with its heartbeat frozen" in advisory["reason"]
    assert advisory["evidence"]["period_steps"] == 20
    if fault is not None:
        named = [r for r in got if r["kind"] == "frozen_rank"][-1]
        latency = named["detected_mono"] - sim.steps[fault[1]].start
        # its heartbeat's last beat (0.5 s) to the report that shows it (1 s) and the tick (0.5 s)
        seen_s = sim.heartbeat_s + sim.report_interval + 0.5
        if fault[0] == "stop":
            assert latency <= 1.0 + seen_s, (latency, named["reason"])
        else:  # past what the freezes took before, and no later than that
            allowed = stalls_mod.expected_freeze_s(c.goodput.stalls, 0)
            assert allowed is not None and allowed - sim.heartbeat_s <= latency <= allowed + seen_s, (latency, allowed)


@pytest.mark.parametrize(
    "step,changes,noted",
    [
        (5, {}, [(0, 6)]),  # rank 0 froze 1.5 s in step 6 and beat again: noted
        (0, {}, []),  # before its first step: starting up (imports, init), not a pattern's
        (5, {"proc_status": "stopped"}, []),  # stopped at the reading: a SIGSTOP's, named at once
        (5, {"status": "failed"}, []),  # failing: shutting down
    ],
)
def test_the_ledger_notes_a_running_ranks_freeze_once_it_beats_again(step, changes, noted):
    from watchdog.coordinator import testing as t
    from watchdog.coordinator.performance.goodput import Ledger

    ledger, view = Ledger(), None
    for seq, (now, age) in enumerate(((100.0, 0.2), (101.0, 1.2), (101.5, 1.7), (102.0, 0.1)), start=1):
        frozen = changes if age > 1.0 else {}
        states = [
            t.rank(r, world_size=2, step=step, step_age_s=30.0, **(dict(frozen, heartbeat_age_s=age) if r == 0 else {}))
            for r in range(2)
        ]
        view = t.view(states, now=now, ranks_per_host=2, base=view, seq=seq)
        ledger.tick(now, view)
    assert [(o.rank, o.step) for o in ledger.stalls.froze] == noted
    assert not ledger.stalls.freezing
